"""End to end through the served webhook, under what real clusters and control planes do.

Default settings on a Karpenter-labelled cluster with two node pools: a
StatefulSet that grows and shrinks, one whose ordinals start at 5, pods pinned
to a node pool whose nodes are all spot, a pod refused by a later webhook after
spotguard reserved its slot, two webhook processes whose clocks disagree by
6 s, and, on clusters of their own, a slow API server, a missing state
namespace and a cluster without on-demand nodes.
"""

from __future__ import annotations

import http.server
import json
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from spotguard.gateway import resources as r
from spotguard.policy.capacity import Capacity
from spotguard_sim import objects, testing, tls

from tests.admission import harness

NS = harness.NS
POOL = "karpenter.sh/nodepool"
CAPACITY_TYPE = "karpenter.sh/capacity-type"


def _pool_node(name: str, pool: str, capacity: str, zone: str) -> dict[str, Any]:
    return harness.node(name, {POOL: pool, CAPACITY_TYPE: capacity}, zone=zone)


SCENARIO = (
    [objects.namespace(n) for n in (NS, "spotguard")]
    + [_pool_node(f"general-od-{i}", "general", "on-demand", f"us-east-1{'ab'[i]}") for i in range(2)]
    + [_pool_node(f"general-spot-{i}", "general", "spot", f"us-east-1{'ab'[i]}") for i in range(2)]
    + [_pool_node(f"batch-spot-{i}", "batch-spot", "spot", f"us-east-1{'ab'[i]}") for i in range(2)]
)

SKEW = textwrap.dedent(
    """
    # Loaded by Python at start-up (PYTHONPATH): this process's wall clock runs 6 s ahead.
    import os
    import time

    _skew = float(os.environ.get("SPOTGUARD_TEST_CLOCK_SKEW_SECONDS", "0"))
    if _skew:
        _time, _time_ns = time.time, time.time_ns
        time.time = lambda: _time() + _skew
        time.time_ns = lambda: _time_ns() + int(_skew * 1e9)
    """
)


class Refuser(http.server.BaseHTTPRequestHandler):
    """A later mutating webhook (a policy engine) that refuses the first pod of each app it sees."""

    refused: dict[str, int] = {}
    lock = threading.Lock()

    def do_POST(self) -> None:
        review = testing.read_review(self)
        request = review["request"]
        app = ((request.get("object") or {}).get("metadata") or {}).get("labels", {}).get("app", "")
        with self.lock:
            deny = app.startswith("refused") and self.refused.get(app, 0) < 1
            if deny:
                self.refused[app] = self.refused.get(app, 0) + 1
        response: dict[str, Any] = {"uid": request["uid"], "allowed": not deny}
        if deny:
            response["status"] = {"code": 403, "message": "refused by policy (once)"}
        testing.answer_review(self, response)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[harness.Served]:
    workdir = tmp_path_factory.mktemp("real-clusters")
    skew_dir = workdir / "skew"
    skew_dir.mkdir()
    (skew_dir / "sitecustomize.py").write_text(SKEW)
    skewed = {"PYTHONPATH": str(skew_dir), "SPOTGUARD_TEST_CLOCK_SKEW_SECONDS": "6"}
    with harness.served(SCENARIO, workdir, count=2, extra_env=[{}, skewed]) as s:
        server, url, ca = tls.serve_https(Refuser)
        hook = {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "zz-policy-engine"},  # runs after spotguard's (sorted by name)
            "webhooks": [
                {
                    "name": "policy.example.com",
                    "clientConfig": {"url": url + "/", "caBundle": ca},
                    "rules": [
                        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}
                    ],
                    "failurePolicy": "Fail",
                    "sideEffects": "None",
                    "admissionReviewVersions": ["v1"],
                    "timeoutSeconds": 3,
                }
            ],
        }
        s.k.create(r.MUTATINGWEBHOOKCONFIGURATIONS, hook)
        try:
            yield s
        finally:
            server.shutdown()


def _scale(s: harness.Served, res: r.Resource, name: str, replicas: int) -> None:
    s.k.patch(res, name, {"spec": {"replicas": replicas}}, NS)


def _on_demand_names(s: harness.Served, pods: list[dict[str, Any]]) -> set[str]:
    caps = harness.capacities(s.k)
    return {p["metadata"]["name"] for p in pods if caps[p["spec"]["nodeName"]] is Capacity.ON_DEMAND}


def test_a_statefulset_grown_and_shrunk_keeps_exactly_its_floor(env: harness.Served) -> None:
    env.k.create(r.STATEFULSETS, harness.statefulset("grow", 3), NS)
    assert _on_demand_names(env, harness.running(env.k, "grow", 3)) == {"grow-0", "grow-1"}
    _scale(env, r.STATEFULSETS, "grow", 7)  # floor 4: pod 2 stays on spot, 3 and 4 fill the slots
    assert _on_demand_names(env, harness.running(env.k, "grow", 7)) == {"grow-0", "grow-1", "grow-3", "grow-4"}
    _scale(env, r.STATEFULSETS, "grow", 3)  # ordinals 3..6 go: the quorum 0, 1 stays
    assert _on_demand_names(env, harness.running(env.k, "grow", 3)) == {"grow-0", "grow-1"}
    _scale(env, r.STATEFULSETS, "grow", 5)  # floor 3: ordinal 3 fills the slot
    assert _on_demand_names(env, harness.running(env.k, "grow", 5)) == {"grow-0", "grow-1", "grow-3"}


def test_a_statefulset_whose_ordinals_start_at_5(env: harness.Served) -> None:
    sts = harness.statefulset("late", 3)
    sts["spec"]["ordinals"] = {"start": 5}
    env.k.create(r.STATEFULSETS, sts, NS)
    assert _on_demand_names(env, harness.running(env.k, "late", 3)) == {"late-5", "late-6"}


def test_pods_pinned_to_an_all_spot_node_pool_run_and_count_as_spot(env: harness.Served) -> None:
    env.k.create(r.DEPLOYMENTS, harness.deployment("batch", 3, nodeSelector={POOL: "batch-spot"}), NS)
    pods = harness.running(env.k, "batch", 3)
    assert {p["spec"]["nodeName"].rsplit("-", 1)[0] for p in pods} == {"batch-spot"}
    assert harness.on_demand(env.k, pods) == (0, 0)  # labelled as what they are: spot
    affinity = [p["spec"].get("affinity", {}).get("nodeAffinity", {}) for p in pods]
    assert not any("requiredDuringSchedulingIgnoredDuringExecution" in a for a in affinity)


def test_pods_pinned_to_a_mixed_node_pool_get_their_floor_inside_it(env: harness.Served) -> None:
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": POOL, "operator": "In", "values": ["general"]}]}]
            }
        }
    }
    env.k.create(r.DEPLOYMENTS, harness.deployment("general", 4, affinity=affinity), NS)
    pods = harness.running(env.k, "general", 4)
    assert {p["spec"]["nodeName"].split("-")[0] for p in pods} == {"general"}
    assert harness.on_demand(env.k, pods) == (1, 1)


@pytest.mark.parametrize("replicas", [1, 3])
def test_a_pod_refused_by_a_later_webhook_leaves_its_slot_to_the_retry(env: harness.Served, replicas: int) -> None:
    name = f"refused-{replicas}"
    env.k.create(r.DEPLOYMENTS, harness.deployment(name, replicas), NS)
    pods = harness.running(env.k, name, replicas)
    assert Refuser.refused.get(name) == 1  # the first pod (on-demand, reserved) was refused
    assert harness.on_demand(env.k, pods) == (1, 1)


def test_two_processes_whose_clocks_disagree_by_6_seconds_hand_out_exactly_the_floor(env: harness.Served) -> None:
    name = "skewed"
    env.k.create(r.DEPLOYMENTS, harness.deployment(name, 0, {"spotguard.io/min-on-demand": "3"}), NS)
    before = [harness.metric(s, "spotguard_admission_requests_total", outcome="patched") for s in env.servers]
    for _ in range(3):
        _scale(env, r.DEPLOYMENTS, name, 12)
        assert harness.on_demand(env.k, harness.running(env.k, name, 12)) == (3, 3)
        _scale(env, r.DEPLOYMENTS, name, 0)
        harness.wait_for(lambda: not env.k.list(r.PODS, NS, label_selector=f"app={name}"), what="scale to zero")
    after = [harness.metric(s, "spotguard_admission_requests_total", outcome="patched") for s in env.servers]
    assert all(a > b for a, b in zip(after, before, strict=True)), (before, after)  # both processes took part


def test_the_servers_are_ready_and_failed_no_review(env: harness.Served) -> None:
    for s in env.servers:
        assert requests.get(s.url + "/readyz", verify=s.ca, timeout=5).text == "ok"
        assert harness.metric(s, "spotguard_admission_requests_total", outcome="failed_open") == 0


# -- clusters of their own -----------------------------------------------------------------


def _small(*, on_demand: bool = True) -> list[dict[str, Any]]:
    nodes = [
        _pool_node("spot-0", "general", "spot", "us-east-1a"),
        _pool_node("spot-1", "general", "spot", "us-east-1b"),
    ]
    if on_demand:
        nodes.append(_pool_node("od-0", "general", "on-demand", "us-east-1a"))
    return [objects.namespace(n) for n in (NS, "spotguard")] + nodes


def _reservations_without_pods(s: harness.Served) -> list[str]:
    carried = {(p["metadata"].get("annotations") or {}).get("spotguard.io/reservation") for p in s.k.list(r.PODS, NS)}
    orphans = []
    for lease in s.k.list(r.LEASES, "spotguard"):
        doc = json.loads((lease["metadata"].get("annotations") or {}).get("spotguard.io/reservations") or "{}")
        orphans += [t for t in doc.get("pending") or {} if t not in carried]
    return orphans


def test_a_slow_api_server_still_gets_its_first_pods_placed(tmp_path: Path) -> None:
    # GIVEN an API server that takes 0.45 s for every call, and a webhook process that just started,
    # with a 3.5 s review deadline: a cold start of 8 sequential calls (3.6 s) would not fit, one
    # that overlaps them (3 round trips, 1.35 s) does with room for a loaded test machine
    with harness.served(_small(), tmp_path, env={"SPOTGUARD_ADMISSION_DEADLINE_SECONDS": "3.5"}) as s:
        s.sim.faults.set(latency_seconds=0.45)
        # WHEN the first workloads are created
        s.k.create(r.DEPLOYMENTS, harness.deployment("slow", 1), NS)
        s.k.create(r.DEPLOYMENTS, harness.deployment("slow-two", 2), NS)
        # THEN their pods are placed within the webhook's 3 s timeout, and no reservation is left without a pod
        assert harness.on_demand(s.k, harness.running(s.k, "slow", 1, timeout=120)) == (1, 1)
        assert harness.on_demand(s.k, harness.running(s.k, "slow-two", 2, timeout=120)) == (1, 1)
        s.sim.faults.clear()
        assert _reservations_without_pods(s) == []
        assert harness.metric(s.servers[0], "spotguard_admission_requests_total", outcome="failed_open") == 0


def test_an_api_too_slow_for_the_lease_write_gets_the_pod_placed_and_nothing_written(tmp_path: Path) -> None:
    # A 2 s deadline: a cold start's reads at 1.1 s each leave no time for the Lease write.
    with harness.served(_small(), tmp_path, env={"SPOTGUARD_ADMISSION_DEADLINE_SECONDS": "2"}) as s:
        s.sim.faults.set(latency_seconds=1.1)
        s.k.create(r.DEPLOYMENTS, harness.deployment("crawl", 1), NS)
        pods = harness.running(s.k, "crawl", 1, timeout=120)
        s.sim.faults.clear()
        # placed on on-demand from what the review knew (its floor slot), without a reservation
        assert pods[0]["metadata"]["labels"].get("spotguard.io/placement") == "on-demand"
        assert "spotguard.io/reservation" not in (pods[0]["metadata"].get("annotations") or {})
        assert harness.metric(s.servers[0], "spotguard_admission_degraded_total", how="unreserved") == 1
        assert _reservations_without_pods(s) == []  # nothing written after the deadline
        time.sleep(2.5)  # past every review's deadline: still nothing
        assert _reservations_without_pods(s) == []


def test_a_missing_state_namespace_is_reported_and_the_webhook_stays_in_service(tmp_path: Path) -> None:
    # A condition of the whole cluster: every replica sees it at once, and an unready webhook
    # would let every pod in unplaced (failurePolicy Ignore). Reported, never out of service.
    with harness.served(_small(), tmp_path, env={"SPOTGUARD_NAMESPACE": "spotguard-state"}) as s:
        server = s.servers[0]
        answer = requests.get(server.url + "/readyz", verify=server.ca, timeout=5)
        assert answer.status_code == 200
        assert "'spotguard-state' does not exist" in answer.text
        assert harness.metric(server, "spotguard_admission_cluster_condition", condition="namespace_missing") == 1
        s.k.create(r.NAMESPACES, objects.namespace("spotguard-state"))
        harness.wait_for(
            lambda: requests.get(server.url + "/readyz", verify=server.ca, timeout=5).text == "ok",
            what="no warning once the namespace exists",
        )
        assert harness.metric(server, "spotguard_admission_cluster_condition", condition="namespace_missing") == 0


def test_a_cluster_without_on_demand_nodes_is_reported_and_its_pods_still_run(tmp_path: Path) -> None:
    with harness.served(_small(on_demand=False), tmp_path) as s:
        server = s.servers[0]
        answer = requests.get(server.url + "/readyz", verify=server.ca, timeout=5)
        assert answer.status_code == 200 and "no node matches the on-demand requirement" in answer.text
        s.k.create(r.DEPLOYMENTS, harness.deployment("lonely", 1), NS)
        pods = harness.running(s.k, "lonely", 1)  # never a pod that no node can take
        assert harness.on_demand(s.k, pods) == (0, 0)
        harness.wait_for(
            lambda: any(
                e.get("reason") == "NoOnDemandNodes" and e.get("type") == "Warning" for e in s.k.list(r.EVENTS, NS)
            ),
            what="a Warning Event on the workload",
        )
        assert harness.metric(server, "spotguard_admission_unplaceable_total", placement="on-demand") >= 1
        assert any(e.get("reason") == "AdmissionDegraded" for e in s.k.list(r.EVENTS))
        assert harness.metric(server, "spotguard_admission_cluster_condition", condition="no_on_demand_nodes") == 1


def test_a_cluster_without_spot_nodes_stays_ready_and_says_so(tmp_path: Path) -> None:
    # GIVEN a cluster whose spot nodes are all gone (a mass reclaim): an unready webhook
    # would let every pod in unplaced (failurePolicy Ignore) exactly when floors matter most
    nodes = [
        _pool_node("od-0", "general", "on-demand", "us-east-1a"),
        _pool_node("od-1", "general", "on-demand", "us-east-1b"),
    ]
    namespaces = [objects.namespace(n) for n in (NS, "spotguard", "default")]
    with harness.served(namespaces + nodes, tmp_path) as s:
        server = s.servers[0]
        # WHEN readiness is asked
        answer = requests.get(server.url + "/readyz", verify=server.ca, timeout=5)
        # THEN it is ready, and says why spot slots land on on-demand
        assert answer.status_code == 200
        assert "no node matches the spot preference" in answer.text
        # AND every pod is placed, counted as what it really is (on-demand: no spot node to go to)
        s.k.create(r.DEPLOYMENTS, harness.deployment("web", 3), NS)
        pods = harness.running(s.k, "web", 3)
        assert harness.on_demand(s.k, pods) == (3, 3)
        harness.wait_for(
            lambda: any(e.get("reason") == "NoSpotNodes" for e in s.k.list(r.EVENTS, "default")),
            what="a Warning Event about the missing spot nodes",
        )
