"""End to end, default settings: pods whose own spec or labels could mislead the placement.

GIVEN a simulated cluster labelled as a provider labels it and ``spotguard serve
admission`` with no configuration behind the shipped webhook configuration,
WHEN a workload's template pins its pods to a node (``spec.nodeName``), carries
the ``spotguard.io/placement`` label the webhook owns, or the cluster's spot
capacity is GKE preemptible VMs, THEN every pod runs where its placement says,
and the floor holds by the nodes the pods run on. And a spot slot lands on spot
while spot has room, under every provider's labels (on EKS and Karpenter once
node-added has labelled the spot nodes ``spotguard.io/spot``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from spotguard.gateway import kube
from spotguard.gateway import resources as r
from spotguard.nodeadded import reconciler
from spotguard.policy import config, patches
from spotguard.policy.capacity import Capacity
from spotguard.policy.surges import SurgeRecord
from spotguard.policy.workloads import MIN_ON_DEMAND, SURGE, SURGE_REPLICA
from spotguard_sim import objects

from tests.admission import harness

EKS_OD = {"eks.amazonaws.com/capacityType": "ON_DEMAND"}
EKS_SPOT = {"eks.amazonaws.com/capacityType": "SPOT"}
GKE_STANDARD = {"cloud.google.com/gke-nodepool": "default-pool"}
GKE_PREEMPTIBLE = {"cloud.google.com/gke-nodepool": "preemptible-pool", "cloud.google.com/gke-preemptible": "true"}
REQ = "requiredDuringSchedulingIgnoredDuringExecution"


def _scenario(od: dict[str, str], spot: dict[str, str]) -> list[dict[str, Any]]:
    nodes = [harness.node(f"od-{i}", dict(od), zone=f"us-east-1{'ab'[i]}") for i in range(2)]
    nodes += [harness.node(f"spot-{i}", dict(spot), zone=f"us-east-1{'abc'[i]}") for i in range(3)]
    return [objects.namespace(n) for n in (harness.NS, "spotguard")] + nodes


@pytest.fixture(scope="module")
def eks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[harness.Served]:
    with harness.served(_scenario(EKS_OD, EKS_SPOT), tmp_path_factory.mktemp("edges-eks")) as s:
        yield s


def _all_pods(k: Any, app: str) -> list[dict[str, Any]]:
    return list(k.list(r.PODS, harness.NS, label_selector=f"app={app}"))


def test_a_pod_pinned_to_a_spot_node_runs_there_as_spot(eks: harness.Served) -> None:
    # GIVEN a one-replica Deployment (floor 1) whose template names a spot node
    k = eks.k
    k.create(r.DEPLOYMENTS, harness.deployment("pinned-spot", 1, nodeName="spot-1"), harness.NS)
    # WHEN its pod is admitted, THEN the kubelet runs it (no NodeAffinity rejection, no
    # re-creation loop): it is placed, and labelled, as what its node is
    pods = harness.running(k, "pinned-spot", 1)
    assert [p["spec"]["nodeName"] for p in pods] == ["spot-1"]
    assert pods[0]["metadata"]["labels"][harness.PLACEMENT] == "spot"
    required = ((pods[0]["spec"].get("affinity") or {}).get("nodeAffinity") or {}).get(REQ)
    assert required is None
    assert not [p for p in _all_pods(k, "pinned-spot") if (p.get("status") or {}).get("phase") == "Failed"]


def test_pods_pinned_to_an_on_demand_node_count_as_on_demand(eks: harness.Served) -> None:
    # GIVEN a three-replica Deployment (floor 1) whose template names an on-demand node
    k = eks.k
    k.create(r.DEPLOYMENTS, harness.deployment("pinned-od", 3, nodeName="od-0"), harness.NS)
    # THEN all three run there, each labelled as on-demand (what they are)
    pods = harness.running(k, "pinned-od", 3)
    assert {p["spec"]["nodeName"] for p in pods} == {"od-0"}
    assert harness.on_demand(k, pods) == (3, 3)


@pytest.mark.parametrize(
    ("kind", "claimed", "floor"),
    [("Deployment", "spot", 1), ("StatefulSet", "on-demand", 2)],
)
def test_a_placement_label_in_the_template_is_not_trusted(
    eks: harness.Served, kind: str, claimed: str, floor: int
) -> None:
    # GIVEN a three-replica workload (a Deployment: floor 1; a StatefulSet: floor 2) whose
    # template carries the label the webhook owns, claiming every pod is already placed
    k = eks.k
    name = f"labelled-{kind.lower()}"
    make, res = (harness.deployment, r.DEPLOYMENTS) if kind == "Deployment" else (harness.statefulset, r.STATEFULSETS)
    obj = make(name, 3)
    obj["spec"]["template"]["metadata"]["labels"][harness.PLACEMENT] = claimed
    k.create(res, obj, harness.NS)
    # WHEN its pods are admitted, THEN the floor is placed all the same: exactly the floor
    # on on-demand, by the nodes and by the labels
    pods = harness.running(k, name, 3)
    assert harness.on_demand(k, pods) == (floor, floor)


def test_gke_preemptible_nodes_are_spot(tmp_path: Path) -> None:
    # GIVEN a GKE cluster: a standard pool (no capacity label) and a preemptible pool
    with harness.served(_scenario(GKE_STANDARD, GKE_PREEMPTIBLE), tmp_path) as s:
        k = s.k
        # WHEN a six-replica Deployment (floor 1) is created
        k.create(r.DEPLOYMENTS, harness.deployment("web", 6), harness.NS)
        pods = harness.running(k, "web", 6)
        caps = harness.capacities(k)
        assert caps["spot-0"] is Capacity.SPOT
        # THEN its floor pod is required off the preemptible VMs, and runs on the standard pool
        floor = [p for p in pods if p["metadata"]["labels"][harness.PLACEMENT] == "on-demand"]
        assert len(floor) == 1
        terms = floor[0]["spec"]["affinity"]["nodeAffinity"][REQ]["nodeSelectorTerms"]
        assert all(
            {"key": "cloud.google.com/gke-preemptible", "operator": "NotIn", "values": ["true"]}
            in t["matchExpressions"]
            for t in terms
        )
        assert caps[floor[0]["spec"]["nodeName"]] is Capacity.ON_DEMAND
        assert harness.on_demand(k, pods)[1] == 1


def test_a_surge_replica_is_on_demand_when_the_workload_already_has_extra_on_demand_pods(
    eks: harness.Served,
) -> None:
    # GIVEN a four-replica Deployment with two pods on on-demand and a floor of one (it had
    # a floor of two: one on-demand pod more than its floor now, as a spilled pod is)
    k = eks.k
    k.create(r.DEPLOYMENTS, harness.deployment("extra", 4, {MIN_ON_DEMAND: "2"}), harness.NS)
    harness.running(k, "extra", 4)
    k.patch(r.DEPLOYMENTS, "extra", {"metadata": {"annotations": {MIN_ON_DEMAND: "1"}}}, harness.NS)
    # WHEN an interruption surge adds one replica (one patch: the replicas and the record,
    # as the spot-interruption handler writes it)
    record = SurgeRecord(replicas=4, surge=1, nodes=("spot-0",), started=time.time(), written=5)
    k.patch(
        r.DEPLOYMENTS,
        "extra",
        {"metadata": {"annotations": {SURGE: record.to_json()}}, "spec": {"replicas": 5}},
        harness.NS,
    )
    # THEN the surge's replica is on on-demand, marked as a surge replica
    pods = harness.running(k, "extra", 5)
    assert harness.on_demand(k, pods) == (3, 3)
    surged = [p for p in pods if (p["metadata"].get("annotations") or {}).get(SURGE_REPLICA) == "true"]
    assert len(surged) == 1
    assert harness.capacities(k)[surged[0]["spec"]["nodeName"]] is Capacity.ON_DEMAND


AKS_SPOT_TAINT = {"key": "kubernetes.azure.com/scalesetpriority", "value": "spot", "effect": "NoSchedule"}
SPREAD_CLUSTERS = {
    # name: (on-demand node labels, spot node labels, spot taints)
    "gke": (GKE_STANDARD, {"cloud.google.com/gke-spot": "true"}, None),
    "aks": ({"kubernetes.azure.com/agentpool": "regular"}, {"kubernetes.azure.com/scalesetpriority": "spot"},
            [AKS_SPOT_TAINT]),
}


@pytest.mark.parametrize("provider", sorted(SPREAD_CLUSTERS))
def test_spot_slots_land_on_spot_while_spot_has_room(provider: str, tmp_path: Path) -> None:
    # GIVEN a cluster labelled as the provider labels it: three spot nodes in two zones,
    # with room for every replica, and two empty on-demand nodes in two other zones (no
    # spot there: for the soft spread, the one the floor pod leaves empty scores as high
    # as the spot preference)
    od, spot, taints = SPREAD_CLUSTERS[provider]
    with harness.served(_spread_scenario(od, spot, taints), tmp_path) as s:
        _twelve_replicas_on_spot_and_spread(s.k)


def _spread_scenario(
    od: dict[str, str], spot: dict[str, str], taints: list[dict[str, str]] | None
) -> list[dict[str, Any]]:
    """Two empty on-demand nodes in zones c and d; spot nodes spot-0..2 in zones a, b, a."""
    nodes = [harness.node(f"od-{i}", dict(od), zone=f"us-east-1{'cd'[i]}") for i in range(2)]
    nodes += [
        objects.node(f"spot-{i}", None, zone=f"us-east-1{'aba'[i]}", labels=dict(spot), taints=taints,
                     cpu="16", memory="64Gi", pods="110")
        for i in range(3)
    ]
    return [objects.namespace(n) for n in (harness.NS, "spotguard")] + nodes


def _twelve_replicas_on_spot_and_spread(k: Any) -> None:
    # WHEN a twelve-replica Deployment (floor 1) of one-CPU pods is created
    dep = harness.deployment("web", 12)
    dep["spec"]["template"]["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "1", "memory": "1Gi"}}
    k.create(r.DEPLOYMENTS, dep, harness.NS)
    pods = harness.running(k, "web", 12)
    # THEN only its floor runs on on-demand: every spot slot is on a spot node (the
    # soft spread no longer pulls them onto the empty on-demand nodes) ...
    assert harness.on_demand(k, pods) == (1, 1)
    # ... and they still spread over the spot nodes and zones (zone a has two spot
    # nodes, zone b one: as many pods in each zone, and as many on each node of a)
    per_node = {f"spot-{i}": 0 for i in range(3)}
    for p in pods:
        if p["metadata"]["labels"][harness.PLACEMENT] == "spot":
            per_node[p["spec"]["nodeName"]] += 1
    assert abs(per_node["spot-0"] + per_node["spot-2"] - per_node["spot-1"]) <= 1, per_node
    assert abs(per_node["spot-0"] - per_node["spot-2"]) <= 1, per_node


KARPENTER_OD = {"karpenter.sh/capacity-type": "on-demand", "karpenter.sh/nodepool": "default"}
KARPENTER_SPOT = {"karpenter.sh/capacity-type": "spot", "karpenter.sh/nodepool": "spot"}
CAPACITY_KEY_CLUSTERS = {
    # name: (on-demand node labels, spot node labels): both carry the capacity key
    "eks": (EKS_OD, EKS_SPOT),
    "karpenter": (KARPENTER_OD, KARPENTER_SPOT),
}


def _node_added_pass(sim: Any) -> reconciler.Report:
    """One node-added pass with default settings (what runs when a node joins, and on schedule)."""
    return reconciler.Reconciler(kube.Kube(sim.api_client()), config.Config(), clock=sim.clock.now).reconcile()


def _spot_labels(k: Any) -> dict[str, str | None]:
    return {n["metadata"]["name"]: n["metadata"]["labels"].get(patches.SPOT_NODE_LABEL) for n in k.list(r.NODES)}


@pytest.mark.parametrize("provider", sorted(CAPACITY_KEY_CLUSTERS))
def test_spot_slots_land_on_spot_where_on_demand_nodes_carry_the_capacity_key(provider: str, tmp_path: Path) -> None:
    # GIVEN a cluster whose on-demand nodes carry the capacity key too (no spot-only key of
    # the provider's): three spot nodes in two zones with room for every replica, two empty
    # on-demand nodes in two other zones, and node-added's pass as the nodes joined
    od, spot = CAPACITY_KEY_CLUSTERS[provider]
    passes: list[reconciler.Report] = []

    def label_nodes(sim: Any) -> None:
        passes.append(_node_added_pass(sim))

    with harness.served(_spread_scenario(od, spot, None), tmp_path, before_servers=label_nodes) as s:
        # node-added labelled every spot node spotguard.io/spot=true, and no other node
        assert passes[0].failures == 0
        assert _spot_labels(s.k) == {"od-0": None, "od-1": None, "spot-0": "true", "spot-1": "true", "spot-2": "true"}
        _twelve_replicas_on_spot_and_spread(s.k)
        # AND a spot node that joins later is labelled by the next pass; a pass with every
        # node labelled writes no label
        s.k.create(r.NODES, objects.node("spot-3", None, zone="us-east-1b", labels=dict(spot)))
        joined = _node_added_pass(s.sim)
        assert joined.node_labels == {"spot-3": "true"}
        assert _spot_labels(s.k)["spot-3"] == "true"
        assert _node_added_pass(s.sim).node_labels == {}
