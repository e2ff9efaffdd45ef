"""Clients that stall do not take the webhook's threads away from kube-apiserver.

gunicorn's gthread worker serves a connection on one thread of its pool from the
TLS handshake to the answer. A peer that connects and sends nothing, stops
half-way through its ClientHello, or sends half a request and waits, would hold
a thread each for good; a few of them hold every thread of a replica, and then
every pod is admitted unplaced (``failurePolicy: Ignore``). The served webhook
bounds every wait on a client by the client limit
(``SPOTGUARD_ADMISSION_CLIENT_TIMEOUT_SECONDS``, 3 s): a connection that has sent
nothing takes no thread and is closed at the limit; the handshake, and the
request head and body together, must each be done within it; a connection cut
is dropped, counted in ``spotguard_admission_dropped_connections_total{reason}``
and logged. These tests play the stalling peers over real TCP and TLS against
the real server (gunicorn, a simulated cluster behind it) and, beside them,
kube-apiserver with its shipped 3 s timeout.
"""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from spotguard.admission import connections
from spotguard.gateway import kube
from spotguard.gateway import resources as r
from spotguard_sim import objects, testing

from tests.admission import burst, clients, harness, servers

NS = harness.NS
WEBHOOK_TIMEOUT = 3.0  # the shipped timeoutSeconds: kube-apiserver's clock for one call
DROPPED = "spotguard_admission_dropped_connections_total"
HEAD = b"POST /mutate?timeout=3s HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    scenario = [objects.namespace(n) for n in (NS, "spotguard")]
    scenario += [harness.node("od-0", {"karpenter.sh/capacity-type": "on-demand"})]
    scenario += [harness.node(f"spot-{i}", {"karpenter.sh/capacity-type": "spot"}) for i in range(2)]
    with testing.running_cluster(scenario, controllers=False) as sim:
        yield sim


@contextlib.contextmanager
def webhook(sim: Any, workdir: Path, *, threads: int, limit: str | None = None) -> Iterator[servers.Server]:
    tls = servers.make_certs(workdir / "tls")
    env = {connections.SETTING: limit} if limit else {}
    with servers.running(tls, workdir, kubeconfig=sim.kubeconfig, workers=1, threads=threads, env=env) as s:
        yield s


def first_pod_review(sim: Any, name: str) -> dict[str, Any]:
    """The review of a new Deployment's first pod (default floor 1: it goes on-demand)."""
    k = kube.Kube(sim.api_client())
    dep = k.create(r.DEPLOYMENTS, harness.deployment(name, 3), NS)
    rs = k.create(r.REPLICASETS, burst.replicaset_of(dep, "5d8f", 3), NS)
    return burst.review_of(burst.pod_of(rs))


def review_as_kube_apiserver(s: servers.Server, review: dict[str, Any]) -> dict[str, Any]:
    """POST the review as kube-apiserver does with the shipped webhook: a new HTTPS
    connection, ``?timeout=3s``, and no answer taken after 3 s (the call then fails)."""
    answer = requests.post(s.url + "/mutate?timeout=3s", json=review, verify=s.ca, timeout=WEBHOOK_TIMEOUT)
    assert answer.status_code == 200, answer.text
    response: dict[str, Any] = answer.json()["response"]
    assert response["uid"] == review["request"]["uid"]
    return response


def placed_on_demand(review: dict[str, Any], response: dict[str, Any]) -> bool:
    assert response["allowed"] is True
    assert burst.undecided(response) is None, response  # decided: not failed open, not shed
    pod = burst.patched(review, response)
    return bool(pod["metadata"]["labels"].get("spotguard.io/placement") == "on-demand")


def warm(s: servers.Server, sim: Any, name: str) -> None:
    """A first review (the worker connects and lists the nodes on its first one)."""
    review = first_pod_review(sim, name)
    answer = requests.post(s.url + "/mutate?timeout=30s", json=review, verify=s.ca, timeout=60)
    assert answer.ok, answer.text


def dropped(s: servers.Server, reason: str) -> float:
    return harness.metric(s, DROPPED, reason=reason)


def test_connections_that_stall_before_or_in_the_handshake_leave_a_review_its_thread(
    cluster: Any, tmp_path: Path
) -> None:
    # GIVEN a webhook with 4 threads and the default client limit (3 s)
    with webhook(cluster, tmp_path, threads=4) as s:
        warm(s, cluster, "warm")
        review = first_pod_review(cluster, "web")
        addr = clients.address(s.url)
        # WHEN 12 peers connect and send nothing (3 for each thread), 2 stop half-way through
        # their ClientHello and one sends half a request head after its handshake
        silent = [clients.silent(addr) for _ in range(12)]
        halves = [clients.half_hello(addr, s.ca) for _ in range(2)]
        head = clients.partial_request(addr, s.ca, HEAD[:30])
        # AND kube-apiserver then sends a review
        response = review_as_kube_apiserver(s, review)
        # THEN it is answered in time, and decided: the Deployment's first pod on on-demand
        assert placed_on_demand(review, response)
        # AND the server drops every stalled connection at the limit, and counts each
        assert all(clients.dropped_by_server(sock) for sock in [*silent, *halves, head])
        harness.wait_for(lambda: dropped(s, "idle") == 12, timeout=30, what="12 idle connections counted")
        assert dropped(s, "handshake") == 2
        assert dropped(s, "request") == 1
        assert dropped(s, "response") == 0
        assert "client connection dropped" in s.log.read_text()
        for sock in [*silent, *halves, head]:
            sock.close()


def test_more_stalled_handshakes_than_threads_are_cut_at_the_limit_and_the_review_answered(
    cluster: Any, tmp_path: Path
) -> None:
    # GIVEN a webhook with 2 threads and a client limit of 1 s
    with webhook(cluster, tmp_path, threads=2, limit="1") as s:
        warm(s, cluster, "warm-2")
        review = first_pod_review(cluster, "api")
        addr = clients.address(s.url)
        # WHEN 2 peers stop half-way through their ClientHello (both threads held), one behind
        # them sends a request head and one byte of its body after its handshake, and 6 send nothing
        halves = [clients.half_hello(addr, s.ca) for _ in range(2)]
        body = clients.partial_request(addr, s.ca, HEAD + b"Content-Length: 4000\r\n\r\n{")
        silent = [clients.silent(addr) for _ in range(6)]
        # AND kube-apiserver sends a review behind them
        response = review_as_kube_apiserver(s, review)
        # THEN the stalled ones are dropped at the limit and the review is answered in time, decided
        assert placed_on_demand(review, response)
        assert all(clients.dropped_by_server(sock) for sock in [*halves, body, *silent])
        harness.wait_for(lambda: dropped(s, "idle") == 6, timeout=30, what="6 idle connections counted")
        assert dropped(s, "handshake") == 2
        assert dropped(s, "request") == 1
        for sock in [*halves, body, *silent]:
            sock.close()


def test_a_request_trickled_a_byte_at_a_time_is_cut_at_the_limit_also_on_a_kept_alive_connection(
    tmp_path: Path,
) -> None:
    # GIVEN a webhook with a client limit of 1 s, and a kept-alive connection that has been
    # answered once
    tls = servers.make_certs(tmp_path / "tls")
    with servers.running(tls, tmp_path, workers=1, threads=2, env={connections.SETTING: "1"}) as s:
        sock = clients.tls(clients.address(s.url), s.ca)
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        head, body = clients.read_answer(sock)
        assert head.startswith(b"HTTP/1.1 200") and body == b"ok"
        # WHEN its next request comes a byte every 50 ms (each wait far below the limit; the
        # whole head would take about 100 s)
        request = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nX-Padding: " + b"a" * 2000 + b"\r\n\r\n"
        sent = 0
        sock.setblocking(False)
        while sent < len(request) and not clients.closed_by_server(sock):
            try:
                sock.send(request[sent : sent + 1])
            except (BlockingIOError, ConnectionError, OSError):
                break
            sent += 1
            time.sleep(0.05)  # the trickle's pace, not an assertion
        # THEN the server dropped it before the head was complete, and counted it
        assert sent < len(request)
        harness.wait_for(lambda: dropped(s, "request") == 1, timeout=30, what="the trickled request counted")
        assert dropped(s, "idle") == dropped(s, "handshake") == 0
        sock.close()


def test_a_client_that_connects_and_speaks_a_little_later_is_served(tmp_path: Path) -> None:
    # GIVEN a webhook with one thread
    tls = servers.make_certs(tmp_path / "tls")
    with servers.running(tls, tmp_path, workers=1, threads=1) as s:
        # WHEN a client connects, waits a moment (the worker hands the connection back to its
        # poller meanwhile), then does its handshake and asks
        raw = socket.create_connection(clients.address(s.url), timeout=60)
        time.sleep(0.3)  # setting the scene: no bytes yet when the worker looks
        sock = clients.client_context(s.ca).wrap_socket(raw, server_hostname="localhost")
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        # THEN it is answered
        head, body = clients.read_answer(sock)
        assert head.startswith(b"HTTP/1.1 200") and body == b"ok"
        sock.close()
        assert dropped(s, "idle") == 0


def test_clients_that_keep_their_end_open_after_the_answer_do_not_hold_up_the_worker(tmp_path: Path) -> None:
    # GIVEN a webhook (one worker, 8 threads)
    tls = servers.make_certs(tmp_path / "tls")
    with servers.running(tls, tmp_path, workers=1, threads=8) as s:
        addr = clients.address(s.url)
        # WHEN 4 clients are answered with "Connection: close" and keep their end open (gunicorn
        # lingers up to 2 s for each to close first, on the worker's main loop by itself)
        held = [clients.tls(addr, s.ca) for _ in range(4)]
        for sock in held:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        for sock in held:
            assert clients.read_answer(sock)[1] == b"ok"
        # THEN a review sent next is still answered within the webhook's timeout
        review = json.loads((Path(__file__).parent / "payloads" / "deployment-pod-reinvocation.json").read_text())
        response = review_as_kube_apiserver(s, review)
        assert response["allowed"] is True
        for sock in held:
            sock.close()


@pytest.mark.parametrize(
    ("raw", "seconds"),
    [
        *[(None, 3.0), ("", 3.0), ("1.5", 1.5), ("0.1", 0.1), ("30", 30.0)],
        *[("0", 3.0), ("-1", 3.0), ("0.05", 3.0), ("31", 3.0), ("nan", 3.0), ("inf", 3.0), ("3s", 3.0), ("abc", 3.0)],
    ],
)
def test_the_client_limit_setting_is_validated(raw: str | None, seconds: float) -> None:
    env = {} if raw is None else {connections.SETTING: raw}
    assert connections.limit_from_env(env) == seconds


def test_an_invalid_client_limit_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    assert connections.limit_from_env({connections.SETTING: "0"}) == connections.DEFAULT_LIMIT
    assert any(getattr(rec, "setting", None) == connections.SETTING for rec in caplog.records)


def test_drops_are_logged_at_most_once_every_ten_seconds_per_reason(caplog: pytest.LogCaptureFixture) -> None:
    for port in range(3):
        connections.dropped("flood-test", ("10.0.0.1", port))
    lines = [rec for rec in caplog.records if getattr(rec, "reason", None) == "flood-test"]
    assert len(lines) == 1 and getattr(lines[0], "client", None) == "10.0.0.1:0"
    assert connections._last_logged["flood-test"][1] == 2  # the next line will say so
