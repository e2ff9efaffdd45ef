"""Karpenter's single-node consolidation simulation, called directly: one simulation per
candidate whose outcome is a delete, a replace by one cheaper NodeClaim, or nothing
(kubernetes-sigs/karpenter pkg/controllers/disruption/consolidation.go computeConsolidation).
The controller around it is exercised end to end in test_karpenter.py."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from spotguard_sim import catalogue, nodepools, objects, scheduler, store
from spotguard_sim.controllers import base
from spotguard_sim.controllers.consolidation import Outcome, compute_consolidation

M5_2XLARGE_ON_DEMAND = catalogue.Prices().hourly("m5.2xlarge", "on-demand")
SPOT_PREFERRED = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
    {"weight": 100, "preference": {"matchExpressions": [
        {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["spot"]}]}}]}}


def pool(capacity_types: tuple[str, ...] = ("on-demand",)) -> dict[str, Any]:
    found = objects.nodepool(capacity_types=capacity_types, policy="WhenEmptyOrUnderutilized", after="0s")
    found["spec"]["template"]["spec"]["requirements"].append(
        {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["m5.large", "m5.2xlarge"]})
    return found


def claims_of(nodepool: dict[str, Any]) -> Callable[[scheduler.PodInfo],
                                                       tuple[nodepools.Claim, list[nodepools.Offering]] | None]:
    """A new NodeClaim of ``nodepool`` for a pod, as the provisioner's ``claims()`` makes it."""
    offers = nodepools.offerings(nodepool, catalogue.Prices())

    def new_claim(pod: scheduler.PodInfo) -> tuple[nodepools.Claim, list[nodepools.Offering]] | None:
        usable = [o for o in offers if nodepools.admits(pod, nodepools.candidate(nodepool, o))]
        if not usable:
            return None
        claim = nodepools.Claim(nodepool, usable)
        holding = claim.holding(pod)
        return (claim, holding) if holding else None

    return new_claim


def pod(name: str, node: str, cpu: str, **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "default", "labels": {"app": name}},
            "spec": {"nodeName": node, "containers": [objects.container("c", "nginx:1.27", cpu=cpu)], **spec},
            "status": {"phase": "Running"}}


def cluster(other_node_free: bool, *moving: dict[str, Any],
            other_labels: dict[str, str] | None = None) -> tuple[store.Store, base.Informer]:
    """The candidate "old" (an m5.2xlarge's room) holding ``moving``, and one other 4-CPU node,
    with room for them or full."""
    s = store.Store()
    s.create("nodes", objects.node("old", cpu="8", memory="32Gi"))
    s.create("nodes", objects.node("other", cpu="4", memory="16Gi", labels=other_labels))
    if not other_node_free:
        s.create("pods", pod("filler", "other", "4"), namespace="default")
    for p in moving:
        s.create("pods", p, namespace="default")
    informer = base.Informer(["nodes", "pods"])
    informer.prime(s)
    return s, informer


def test_pods_that_all_fit_on_the_other_nodes_are_a_delete() -> None:
    s, informer = cluster(True, pod("small", "old", "500m"), pod("medium", "old", "2"))
    got = compute_consolidation(s, informer, "old", set(), blocks=lambda p: False, new_claim=claims_of(pool()),
                                price=M5_2XLARGE_ON_DEMAND, spot=False)
    assert got.outcome is Outcome.DELETE and got.claim is None


def test_pods_that_need_one_new_node_are_a_replace_by_a_cheaper_one() -> None:
    s, informer = cluster(False, pod("small", "old", "500m"))
    got = compute_consolidation(s, informer, "old", set(), blocks=lambda p: False, new_claim=claims_of(pool()),
                                price=M5_2XLARGE_ON_DEMAND, spot=False)
    assert got.outcome is Outcome.REPLACE and got.claim is not None
    assert [p.name for p in got.claim.pods] == ["small"]
    # the replacement's offerings are cut to those cheaper than the node: m5.large only
    assert {(o.instance_type.name, o.capacity_type) for o in got.claim.offerings} == {("m5.large", "on-demand")}
    assert all(o.price < (M5_2XLARGE_ON_DEMAND or 0) for o in got.claim.offerings)


def test_a_replacement_that_could_be_spot_or_on_demand_is_made_spot() -> None:
    s, informer = cluster(False, pod("small", "old", "500m"))
    got = compute_consolidation(s, informer, "old", set(), blocks=lambda p: False,
                                new_claim=claims_of(pool(("spot", "on-demand"))), price=M5_2XLARGE_ON_DEMAND,
                                spot=False)
    assert got.outcome is Outcome.REPLACE and got.claim is not None
    assert {o.capacity_type for o in got.claim.offerings} == {"spot"}


@pytest.mark.parametrize("case", ["blocked", "fits-nowhere", "two-claims", "spot-to-spot", "no-cheaper",
                                  "no-price", "prefers-spot"])
def test_neither_a_delete_nor_a_replace_is_nothing(case: str) -> None:
    moving = [pod("small", "old", "500m")]
    nodepool, price, spot, blocks = pool(), M5_2XLARGE_ON_DEMAND, False, False
    other_free = False
    if case == "blocked":
        other_free, blocks = True, True  # (the pod could go, but it may not be disrupted)
    elif case == "fits-nowhere":
        moving = [pod("small", "old", "500m", nodeSelector={"example.com/nowhere": "true"})]
    elif case == "two-claims":
        # 6 CPU each: no m5.2xlarge holds both
        moving = [pod("big-a", "old", "6"), pod("big-b", "old", "6")]
    elif case == "spot-to-spot":
        nodepool, spot = pool(("spot", "on-demand")), True
    elif case == "no-cheaper":
        price = 0.01
    elif case == "no-price":
        price = None
    else:
        # a spot node's pod preferring spot: the other node has room, but on-demand; the
        # preference, held as a requirement, goes to a new spot NodeClaim rather than being
        # relaxed, and a spot node is not replaced by a spot one
        other_free, nodepool, spot = True, pool(("spot", "on-demand")), True
        moving = [pod("small", "old", "500m", affinity=SPOT_PREFERRED)]
    s, informer = cluster(other_free, *moving, other_labels={"karpenter.sh/capacity-type": "on-demand"})
    got = compute_consolidation(s, informer, "old", set(), blocks=lambda p: blocks, new_claim=claims_of(nodepool),
                                price=price, spot=spot)
    assert got.outcome is Outcome.NONE and got.claim is None
    want = {"blocked": "may not be disrupted", "fits-nowhere": "fits on no other node",
            "two-claims": "2 candidates", "spot-to-spot": "SpotToSpotConsolidation", "no-cheaper": "cheaper node",
            "no-price": "no price", "prefers-spot": "SpotToSpotConsolidation"}[case]
    assert want in got.reason, got.reason


def pending_info(name: str, cpu: str) -> scheduler.PodInfo:
    return scheduler.PodInfo.from_pod({"metadata": {"name": name, "namespace": "default", "labels": {"app": name}},
                                       "spec": {"containers": [objects.container("c", "nginx:1.27", cpu=cpu)]}})


def launching(instance_type: str) -> list[nodepools.InFlight]:
    """An empty NodeClaim of the pool, still launching."""
    nodepool = pool()
    offer = next(o for o in nodepools.offerings(nodepool, catalogue.Prices()) if o.instance_type.name == instance_type)
    return [nodepools.InFlight(nodepools.candidate(nodepool, offer), Counter(), 0)]


@pytest.mark.parametrize("pending", ["none", "fits-the-room", "needs-a-node", "fits-nowhere", "launching-room"])
def test_pending_pods_are_scheduled_with_the_nodes_pods(pending: str) -> None:
    # GIVEN the candidate's 2-CPU pod would fit the other node's 4 free CPUs
    # (upstream SimulateScheduling: "start by getting all pending pods", then the candidates' pods)
    s, informer = cluster(True, pod("medium", "old", "2"))
    waiting: list[scheduler.PodInfo] = []
    flights: list[nodepools.InFlight] = []
    if pending == "fits-the-room":
        waiting = [pending_info("p", "1")]  # the room holds both: still a delete
    elif pending == "needs-a-node":
        waiting = [pending_info("p", "3")]  # heavier, placed first: it takes the room the node's pod needed
    elif pending == "fits-nowhere":
        waiting = [pending_info("p", "3")]
        waiting[0].node_selector["example.com/nowhere"] = "true"  # no node, no claim: left out
    elif pending == "launching-room":
        # a 5-CPU pending pod the other node cannot hold goes to a NodeClaim still launching
        flights = launching("m5.2xlarge")
        waiting = [pending_info("p", "5")]
    got = compute_consolidation(s, informer, "old", set(), blocks=lambda p: False, new_claim=claims_of(pool()),
                                price=M5_2XLARGE_ON_DEMAND, spot=False, pending=waiting, in_flight=flights)
    if pending == "needs-a-node":
        # THEN no delete: the node's pod has the room, the pending pod needs a new claim (upstream's
        # computeConsolidation: NewNodeClaims == 1, so a replace at most), an m5.2xlarge for its 3
        # CPUs, no cheaper than the node
        assert got.outcome is Outcome.NONE and "cheaper node" in got.reason, got.reason
    else:
        assert got.outcome is Outcome.DELETE, got.reason


def test_pending_pods_that_need_two_nodes_hold_the_delete() -> None:
    # GIVEN the candidate's small pod fits the other node; two 6-CPU pods wait for nodes
    s, informer = cluster(True, pod("small", "old", "500m"))
    got = compute_consolidation(s, informer, "old", set(), blocks=lambda p: False, new_claim=claims_of(pool()),
                                price=M5_2XLARGE_ON_DEMAND, spot=False,
                                pending=[pending_info("p1", "6"), pending_info("p2", "6")])
    # THEN nothing: "Can't remove without creating 2 candidates", whoever's pods need them
    assert got.outcome is Outcome.NONE and "2 candidates" in got.reason


def test_a_nodes_pod_that_would_go_to_a_launching_node_holds_the_consolidation() -> None:
    # GIVEN the other node is full and a NodeClaim still launching has room for the candidate's pod
    s, informer = cluster(False, pod("small", "old", "500m"))
    flights = launching("m5.2xlarge")
    got = compute_consolidation(s, informer, "old", set(), blocks=lambda p: False, new_claim=claims_of(pool()),
                                price=M5_2XLARGE_ON_DEMAND, spot=False, in_flight=flights)
    # THEN nothing (upstream: UninitializedNodeError for a candidate's pod on a node not initialized)
    assert got.outcome is Outcome.NONE and "still launching" in got.reason
