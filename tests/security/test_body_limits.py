"""Every HTTP server limits the request body, and refuses a bigger one without holding it.

For each server: a body one byte over its limit gets a 4xx; a body of 15 MiB
(declared in Content-Length) gets a 4xx while the server's peak memory (the
VmHWM of its processes) grows by much less than the body: it stopped reading,
or read and discarded, instead of buffering it all.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
from spotguard.admission import transport as admission_transport
from spotguard.interruption import app as interruption_app
from spotguard_sim import testing

from tests.fuzz import entrypoints, processes

BIG = 15 * 1024 * 1024  # under the admission server's 16 MiB drain, over every limit


@dataclass(frozen=True)
class Server:
    served: processes.Served
    limit: int
    path: str
    headers: dict[str, str]


@contextlib.contextmanager
def admission(tmp_path: Path) -> Iterator[Server]:
    with processes.admission(tmp_path, None) as served:
        yield Server(served, admission_transport.MAX_BODY, "/mutate", {"Content-Type": "application/json"})


@contextlib.contextmanager
def spot_interruption(tmp_path: Path) -> Iterator[Server]:
    with (
        testing.running_cluster([], controllers=False) as sim,
        processes.spot_interruption(tmp_path, sim.kubeconfig) as s,
    ):
        yield Server(s, interruption_app.MAX_BODY, "/", {"Content-Type": "application/cloudevents+json"})


SERVERS = {"spotguard serve admission": admission, "spotguard serve spot-interruption": spot_interruption}


def peak_kib(pid: int) -> int:
    """The largest VmHWM of the process and its children (gunicorn's workers)."""
    pids = [pid, *(int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split())]
    peak = 0
    for p in pids:
        for line in Path(f"/proc/{p}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                peak = max(peak, int(line.split()[1]))
    return peak


def post(server: Server, body: bytes) -> requests.Response:
    return requests.post(
        server.served.url + server.path, data=body, headers=server.headers, verify=server.served.verify, timeout=120
    )


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs /proc (Linux) to read peak memory")
@pytest.mark.parametrize("name", sorted(SERVERS))
def test_a_body_over_the_limit_is_refused_without_being_held(name: str, tmp_path: Path) -> None:
    with SERVERS[name](tmp_path) as server:
        assert post(server, b"{}").status_code < 500  # warm: the app is loaded
        answer = post(server, b" " * (server.limit + 1))
        assert answer.status_code in (400, 413), answer.text
        before = peak_kib(server.served.process.pid)
        answer = post(server, b" " * BIG)
        assert answer.status_code in (400, 413), answer.text
        grown = peak_kib(server.served.process.pid) - before
        assert grown < BIG // 1024 // 3, f"peak memory grew by {grown} KiB for a {BIG // 1024} KiB body"


def test_the_knative_admission_function_limits_the_body(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for variable in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "SPOTGUARD_EKS_CLUSTER"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    from func_python.http import ASGIApplication

    package = entrypoints.load(entrypoints.FUNCTIONS / "admission" / "function")
    driver = entrypoints.Asgi(ASGIApplication(package.new()))
    try:
        over = b" " * (admission_transport.MAX_BODY + 1)
        answer = driver.request(entrypoints.Http("POST", "/mutate", {"Content-Type": "application/json"}, over))
        assert answer.status == 413
        assert answer.json()["reason"] == "BodyTooLarge"
    finally:
        driver.close()


def test_a_body_sent_with_the_wrong_method_still_gets_its_answer(tmp_path: Path) -> None:
    """The admission server read no body for a GET and closed the connection under the
    client, which saw a TLS EOF instead of the 405 (found by the fuzzer)."""
    with admission(tmp_path) as server:
        session = requests.Session()
        body = b" " * (server.limit - 1)
        for _ in range(5):
            answer = session.get(server.served.url + "/mutate", data=body, verify=server.served.verify, timeout=60)
            assert answer.status_code == 405
            assert answer.json()["reason"] == "MethodNotAllowed"
