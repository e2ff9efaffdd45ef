"""Run a simulated cluster in-process for tests.

    from spotguard_sim import testing

    with testing.running_cluster("infra/scenarios/small.yaml", time_scale=10) as sim:
        v1 = kubernetes.client.CoreV1Api(sim.api_client())
        ...
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from spotguard_sim import cluster as cluster_mod
from spotguard_sim import settings as settings_mod
from spotguard_sim.cluster import SimCluster

__all__ = ["SimCluster", "answer_review", "read_review", "running_cluster"]


@contextlib.contextmanager
def running_cluster(
    scenario: str | os.PathLike[str] | Iterable[Mapping[str, Any]] | None = None,
    *,
    time_scale: float = 1.0,
    controllers: bool = True,
    drainer: bool = False,
    ready_delay_seconds: float = 0.0,
    termination_seconds: float = 1.0,
    tls: bool = True,
    port: int = 0,
    settings: settings_mod.Settings | None = None,
) -> Iterator[SimCluster]:
    """A started cluster (API server, store, controllers) that is stopped on exit."""
    tmp = tempfile.mkdtemp(prefix="spotguard-sim-")
    sim = cluster_mod.SimCluster(
        kubeconfig=Path(tmp) / "kubeconfig",
        time_scale=time_scale,
        tls=tls,
        port=port,
    )
    try:
        sim.start(
            scenario=scenario,
            controllers=controllers,
            drainer=drainer,
            ready_delay_seconds=ready_delay_seconds,
            termination_seconds=termination_seconds,
            sim_settings=settings,
        )
        yield sim
    finally:
        sim.stop()
        shutil.rmtree(tmp, ignore_errors=True)


def read_review(handler: http.server.BaseHTTPRequestHandler) -> Any:
    """The AdmissionReview a test webhook's POST carries (its decoded JSON body)."""
    return json.loads(handler.rfile.read(int(handler.headers["Content-Length"])))


def answer_review(handler: http.server.BaseHTTPRequestHandler, response: Mapping[str, Any]) -> None:
    """Answer a test webhook's POST: 200 with an ``admission.k8s.io/v1`` AdmissionReview
    carrying ``response`` (its ``uid``, ``allowed``, and any ``status`` or patch)."""
    body = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}).encode()
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)
