"""Shared fixtures for the simulated cluster's tests.

``cluster`` is the contract-suite fixture: it runs each test against the
simulated cluster and, when ``SPOTGUARD_E2E_KUBECONFIG`` names a real cluster's
kubeconfig, against that cluster too (that parameter is skipped cleanly
otherwise). Tests get a fresh namespace (``cluster.namespace``) that is
deleted afterwards.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes
import pytest
from spotguard_sim import testing

E2E_ENV = "SPOTGUARD_E2E_KUBECONFIG"
REPO = Path(__file__).resolve().parents[2]


@dataclass
class Cluster:
    """What a contract test needs: a client, a kubeconfig and a scratch namespace."""

    name: str  # "sim" or "real"
    kubeconfig: str
    client: kubernetes.client.ApiClient
    namespace: str
    sim: testing.SimCluster | None = None

    @property
    def core(self) -> kubernetes.client.CoreV1Api:
        return kubernetes.client.CoreV1Api(self.client)

    @property
    def apps(self) -> kubernetes.client.AppsV1Api:
        return kubernetes.client.AppsV1Api(self.client)

    @property
    def policy(self) -> kubernetes.client.PolicyV1Api:
        return kubernetes.client.PolicyV1Api(self.client)

    @property
    def is_sim(self) -> bool:
        return self.sim is not None


def kubectl_path() -> str:
    """kubectl 1.35: on PATH or in the repository's .venv; missing is a failure, not a skip."""
    found = shutil.which("kubectl")
    candidate = REPO / ".venv" / "bin" / "kubectl"
    if candidate.exists():
        return str(candidate)
    if found:
        return found
    pytest.fail("kubectl is not installed (scripts/install-tools installs kubectl 1.35)")


@pytest.fixture(scope="session")
def sim_api() -> Iterator[testing.SimCluster]:
    """One simulated cluster without controllers (API server and store only), for the session."""
    with testing.running_cluster(controllers=False) as sim:
        yield sim


@pytest.fixture(scope="module")
def sim_full() -> Iterator[testing.SimCluster]:
    """A simulated cluster with controllers, scheduler and kubelet (10x time), per module."""
    with testing.running_cluster(time_scale=10.0) as sim:
        yield sim


def _real_client(path: str) -> kubernetes.client.ApiClient:
    config = kubernetes.client.Configuration()
    kubernetes.config.load_kube_config(config_file=path, client_configuration=config)
    return kubernetes.client.ApiClient(config)


def _namespace(client: kubernetes.client.ApiClient) -> str:
    name = f"sg-test-{uuid.uuid4().hex[:8]}"
    kubernetes.client.CoreV1Api(client).create_namespace(
        {"metadata": {"name": name, "labels": {"spotguard-test": "true"}}}
    )
    return name


REAL = pytest.param(
    "real",
    marks=pytest.mark.skipif(
        not os.environ.get(E2E_ENV), reason=f"{E2E_ENV} is not set: no real cluster to run the contract suite against"
    ),
)


@contextlib.contextmanager
def _target(kind: str, sim_api: testing.SimCluster) -> Iterator[Cluster]:
    if kind == "real":
        path = os.environ[E2E_ENV]
        client = _real_client(path)
        kubeconfig, sim = path, None
    else:
        client = sim_api.api_client()
        kubeconfig, sim = sim_api.kubeconfig, sim_api
    ns = _namespace(client)
    try:
        yield Cluster(kind, kubeconfig, client, ns, sim)
    finally:
        with contextlib.suppress(kubernetes.client.ApiException):
            kubernetes.client.CoreV1Api(client).delete_namespace(ns)
        client.close()


@pytest.fixture(params=["sim", REAL])
def cluster(request: pytest.FixtureRequest, sim_api: testing.SimCluster) -> Iterator[Cluster]:
    """The contract-suite target: the simulated cluster, then a real one when configured."""
    with _target(request.param, sim_api) as target:
        yield target


@pytest.fixture
def sim_cluster(sim_api: testing.SimCluster) -> Iterator[Cluster]:
    """The simulated cluster only: for a contract a test can set up only there (a status a real
    cluster's controllers own), never a real-cluster run that would be skipped."""
    with _target("sim", sim_api) as target:
        yield target


def pod_manifest(name: str | None = None, *, labels: dict[str, str] | None = None,
                 generate_name: str | None = None, **spec: Any) -> dict[str, Any]:
    """A minimal valid Pod."""
    meta: dict[str, Any] = {"labels": labels or {}}
    if name:
        meta["name"] = name
    if generate_name:
        meta["generateName"] = generate_name
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10"}], **spec},
    }


def deployment_manifest(name: str, replicas: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10"}]},
            },
        },
    }

# kubernetes-client/python's e2e files, vendored: run by test_upstream_client_e2e.py in a
# pytest subprocess against `spotguard sim serve`, never collected here
collect_ignore = ["kubernetes_client_e2e"]
