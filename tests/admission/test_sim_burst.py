"""A burst through the simulated cluster's own API server and the served webhook.

The simulated cluster's ReplicaSet and StatefulSet controllers create pods in
slow-start batches (1, 2, 4, ... up to 500 at once), as upstream's do, and its
API server calls the shipped MutatingWebhookConfiguration for each, as
kube-apiserver does (HTTPS, ``?timeout=``, failurePolicy Ignore). Here the
controllers' client limits are raised so that one Deployment's 300 pods go out
in a few large batches at once, beside five small Deployments and a
StatefulSet. THEN the API server's webhook calls all succeed (none refused,
reset or timed out: its call-failure count stays 0), every pod carries the
placement spotguard chose, and every workload's on-demand count is its floor,
by label and by the node it runs on.

Latency is the benchmarks' business (bench/admission.py); on a loaded test
machine the webhook gets the longest timeout the API allows (30 s) and the
server the matching review deadline, so what is asserted is that no call
fails and the floors are exact.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from spotguard.admission import registration
from spotguard.gateway import kube
from spotguard.gateway import resources as r
from spotguard.policy.capacity import Capacity
from spotguard_sim import admission as sim_admission
from spotguard_sim import objects, settings, testing

from tests.admission import harness, servers

NS = harness.NS
BIG = 300  # floor 10%: 30
SMALL = [f"small-{i}" for i in range(5)]  # 20 replicas each, default floor 1
QUORUM = 21  # a StatefulSet: floor 21 // 2 + 1 = 11
FAST_CONTROLLERS = settings.Settings(
    controller_manager=settings.ControllerManager(kube_api_qps=2000.0, kube_api_burst=2000, burst_replicas=500)
)
SLOW_CONTROL_PLANE = {
    "SPOTGUARD_ADMISSION_DEADLINE_SECONDS": "20",
    "SPOTGUARD_ADMISSION_PENDING_GRACE_SECONDS": "10",
    # a client this loaded may take seconds to finish its TLS handshake or send its request
    "SPOTGUARD_ADMISSION_CLIENT_TIMEOUT_SECONDS": "30",
}


def _scenario() -> list[dict[str, Any]]:
    nodes = [harness.node(f"od-{i}", {"karpenter.sh/capacity-type": "on-demand"}) for i in range(4)]
    nodes += [harness.node(f"spot-{i}", {"karpenter.sh/capacity-type": "spot"}) for i in range(4)]
    return [objects.namespace(NS), objects.namespace("spotguard"), *nodes]


@contextlib.contextmanager
def _cluster(workdir: Path) -> Iterator[kube.Kube]:
    tls = servers.make_certs(workdir / "tls")
    with (
        testing.running_cluster(_scenario(), termination_seconds=0.2, settings=FAST_CONTROLLERS) as sim,
        servers.running(tls, workdir, kubeconfig=sim.kubeconfig, workers=None, threads=None, env=SLOW_CONTROL_PLANE)
        as server,
    ):
        registration.register(sim.store, server.url, tls.ca_bundle, evictions=False, timeoutSeconds=30)
        sim_admission.CALLS.reset()
        yield kube.Kube(sim.api_client())


def test_hundreds_of_pods_at_once_through_the_api_server_all_placed_with_exact_floors(tmp_path: Path) -> None:
    with _cluster(tmp_path) as k:
        # WHEN the workloads are created together
        k.create(r.DEPLOYMENTS, harness.deployment("big", BIG, {"spotguard.io/min-on-demand": "10%"}), NS)
        for name in SMALL:
            k.create(r.DEPLOYMENTS, harness.deployment(name, 20), NS)
        k.create(r.STATEFULSETS, harness.statefulset("quorum", QUORUM), NS)
        # THEN every pod is admitted through the webhook, none of its calls failing
        expected = {"big": (BIG, BIG // 10), "quorum": (QUORUM, QUORUM // 2 + 1)}
        expected.update(dict.fromkeys(SMALL, (20, 1)))
        for app, (replicas, floor) in expected.items():
            pods = harness.running(k, app, replicas, timeout=300)
            assert harness.on_demand(k, pods) == (floor, floor), app
        made, failed = sim_admission.CALLS.total()
        assert failed == 0, sim_admission.CALLS.failed
        assert made >= sum(n for n, _ in expected.values())


def test_a_failed_webhook_call_is_counted(tmp_path: Path) -> None:
    # The count the test above relies on: a webhook that is not there is one failed call
    # (failurePolicy Ignore: the pod is created unpatched).
    tls = servers.make_certs(tmp_path / "tls")
    with testing.running_cluster(_scenario(), termination_seconds=0.2) as sim:
        port = servers.free_port()  # nothing listens there
        registration.register(sim.store, f"https://127.0.0.1:{port}", tls.ca_bundle, evictions=False)
        sim_admission.CALLS.reset()
        k = kube.Kube(sim.api_client())
        k.create(r.DEPLOYMENTS, harness.deployment("lone", 1), NS)
        harness.wait_for(lambda: sim_admission.CALLS.total()[1] >= 1, timeout=60, what="a failed call")
        pods = harness.running(k, "lone", 1)
        assert harness.PLACEMENT not in (pods[0]["metadata"].get("labels") or {})
        assert harness.capacities(k)[pods[0]["spec"]["nodeName"]] in (Capacity.ON_DEMAND, Capacity.SPOT)


@pytest.fixture(autouse=True)
def _fresh_counts() -> Iterator[None]:
    sim_admission.CALLS.reset()
    yield
    sim_admission.CALLS.reset()
