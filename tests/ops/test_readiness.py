"""Readiness of spot-interruption and node-added: ready only while they can do their job.

Liveness (``/healthz``) is the process; readiness (``/readyz``, func-python's
``/health/readiness``) fails while the cluster was never reached, or while the
last attempts at the job (handlings, reconciles, passes) all failed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from spotguard_sim import testing

from tests.admission.servers import free_port
from tests.ops.support import ROOT, SCENARIOS


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    with testing.running_cluster(SCENARIOS / "small.yaml", time_scale=10) as sim:
        yield sim


@pytest.fixture
def unreachable(tmp_path: Path) -> str:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:9'}}]\n"
        "users: [{name: u, user: {token: t}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\n"
        "current-context: x\n"
    )
    return str(kubeconfig)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPOTGUARD_", "KUBECONFIG", "AWS_"))}
    env.update(extra)
    return env


class Served:
    def __init__(self, args: list[str], log: Path, cwd: Path | None = None, **env: str) -> None:
        self.port = free_port()
        self.log = log
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                [a.replace("PORT", str(self.port)) for a in args], stdout=out, stderr=subprocess.STDOUT,
                cwd=cwd, env=_env(**{k: v.replace("PORT", str(self.port)) for k, v in env.items()}),
            )  # fmt: skip
        self.url = f"http://127.0.0.1:{self.port}"
        self.until(lambda: self.get("/health/liveness").status_code == 200, "the server to answer")

    def get(self, path: str) -> requests.Response:
        return requests.get(self.url + path, timeout=10)

    def until(self, what: Callable[[], bool], why: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while True:
            assert self.proc.poll() is None, self.log.read_text()[-3000:]
            try:
                if what():
                    return
            except requests.RequestException:
                pass
            assert time.monotonic() < deadline, f"waited for {why}: {self.log.read_text()[-3000:]}"
            time.sleep(0.2)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


SERVE = [sys.executable, "-m", "spotguard.cli", "serve"]


@pytest.mark.parametrize("function", ["spot-interruption", "node-added"])
def test_a_server_that_never_reached_its_cluster_is_alive_but_not_ready(
    function: str, unreachable: str, tmp_path: Path
) -> None:
    # GIVEN a function served against a cluster that does not answer
    served = Served([*SERVE, function, "--port", "PORT", "--kubeconfig", unreachable], tmp_path / "log")
    try:
        # THEN the process is alive, and not ready, saying why
        assert served.get("/healthz").status_code == 200
        for path in ("/readyz", "/health/readiness"):
            answer = served.get(path)
            assert answer.status_code == 503, (path, answer.text)
            assert "the cluster was never reached" in answer.json()["reason"]
    finally:
        served.stop()


def test_spot_interruption_whose_reconciles_all_fail_is_not_ready(cluster: Any, tmp_path: Path) -> None:
    # GIVEN spot-interruption served against the cluster, a reconcile every 0.3 s
    served = Served([*SERVE, "spot-interruption", "--port", "PORT", "--kubeconfig", cluster.kubeconfig,
                     "--reconcile-interval", "0.3"], tmp_path / "log")  # fmt: skip
    try:
        served.until(lambda: served.get("/readyz").status_code == 200, "ready: the cluster answers")
        # WHEN every reconcile fails (the API server refuses its reads)
        cluster.faults.set(verb="list", resource="deployments", error_rate=1.0, status=400)
        # THEN it stops being ready, and says why; its process stays alive
        served.until(lambda: served.get("/readyz").status_code == 503, "not ready")
        assert "the last 3 attempts failed: reconcile raised BadRequest" in served.get("/readyz").json()["reason"]
        assert served.get("/healthz").status_code == 200
        # AND once the reconciles work again it is ready again
        cluster.faults.clear()
        served.until(lambda: served.get("/readyz").status_code == 200, "ready again")
    finally:
        cluster.faults.clear()
        served.stop()


FUNC_PYTHON = "from func_python.cloudevent import serve; from function import new; serve(new)"


@pytest.mark.parametrize("function", ["spot-interruption", "node-added"])
def test_a_knative_function_with_an_unreachable_cluster_is_not_ready(
    function: str, unreachable: str, tmp_path: Path
) -> None:
    # GIVEN the Knative function served by func-python, its cluster unreachable
    served = Served([sys.executable, "-c", FUNC_PYTHON], tmp_path / "log", cwd=ROOT / "functions" / function,
                    LISTEN_ADDRESS="127.0.0.1:PORT", KUBECONFIG=unreachable)  # fmt: skip
    try:
        # THEN it is alive and not ready (Knative sends it no event it could not handle)
        assert served.get("/health/liveness").status_code == 200
        answer = served.get("/health/readiness")
        assert answer.status_code != 200 and "the cluster was never reached" in answer.text, answer.text
    finally:
        served.stop()
