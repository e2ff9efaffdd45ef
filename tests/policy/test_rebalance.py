"""The rebalance plan: what moves back to spot, what is skipped and why, and deficits."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from spotguard.policy import config, floors, nodepools, patches, rebalance
from spotguard.policy.rebalance import SkipReason
from spotguard.policy.state import WorkloadState
from spotguard.policy.tolerations import Toleration
from spotguard.policy.views import NodeView, PodView
from spotguard.policy.workloads import Kind, Workload

from tests.policy.builders import expr, node, pod, required

CFG = config.Config()
# the on-demand requirement the admission patch adds ("not spot under any scheme")
ON_DEMAND_EXPRS = patches.on_demand_expressions(CFG)


def state(
    name: str,
    pods: Sequence[PodView],
    *,
    kind: Kind = Kind.DEPLOYMENT,
    replicas: int | None = None,
    cfg: config.Config = CFG,
    **annotations: str,
) -> WorkloadState:
    wl = Workload(
        kind=kind,
        namespace="shop",
        name=name,
        replicas=len(pods) if replicas is None else replicas,
        annotations=annotations,
    )
    return WorkloadState(wl, floors.floor_for(wl, cfg), tuple(pods))


def wpod(workload: str, i: int, node_name: str | None, **kw: Any) -> PodView:
    labels = {"app": workload, "spotguard.io/placement": "on-demand"}
    kw.setdefault("spec", required(ON_DEMAND_EXPRS))
    return pod(f"{workload}-{i}", node_name=node_name, labels=labels, **kw)


def run(
    nodes: Sequence[NodeView],
    states: Sequence[WorkloadState],
    cfg: config.Config = CFG,
    others: Sequence[PodView] = (),
) -> rebalance.Plan:
    pods = [p for s in states for p in s.pods] + list(others)
    return rebalance.plan(cfg, nodes, pods, states)


def skip_of(plan: rebalance.Plan, name: str) -> SkipReason:
    [skip] = [s for s in plan.skipped if s.workload.name == name]
    return skip.reason


def test_moves_one_pod_above_the_floor_from_the_emptiest_on_demand_node() -> None:
    nodes = [node("od-busy", "on-demand"), node("od-quiet", "on-demand"), node("spot-1", "spot")]
    web = state("web", [wpod("web", 0, "od-busy"), wpod("web", 1, "od-quiet")])
    filler = [pod(f"filler-{i}", node_name="od-busy", owner=None) for i in range(3)]
    plan = run(nodes, [web], others=filler)
    assert [(m.pod.name, m.from_node, m.to_node) for m in plan.moves] == [("web-1", "od-quiet", "spot-1")]
    assert [(s.workload.name, s.floor, s.on_demand, s.excess) for s in plan.surplus] == [("web", 1, 2, 1)]
    assert plan.deficits == () and plan.skipped == ()
    assert "floor 1" in plan.moves[0].reason


def test_per_workload_bound_and_never_below_the_floor() -> None:
    nodes = [node("od", "on-demand"), node("spot-1", "spot")]
    pods = [wpod("web", i, "od") for i in range(4)]
    cfg = dataclasses.replace(CFG, rebalance_max_pods_per_workload=1)
    plan = run(nodes, [state("web", pods)], cfg)
    assert len(plan.moves) == 1
    plan = run(nodes, [state("web", pods)])
    assert len(plan.moves) == 3  # 4 on-demand, floor 1 (rebalance_max_pods_per_workload 10)
    assert [len(b) for b in plan.batches()] == [3]  # one move of the workload, its batch of 3


def pool(name: str, *capacity_types: str, taints: list[dict[str, str]] | None = None) -> nodepools.NodePool:
    """A NodePool as the API serves it; ``capacity_types``: its capacity-type requirement (none: no requirement)."""
    reqs = [{"key": "karpenter.sh/capacity-type", "operator": "In", "values": list(capacity_types)}]
    spec = {"requirements": reqs if capacity_types else [], "taints": taints or []}
    return nodepools.NodePool.from_json({"metadata": {"name": name}, "spec": {"template": {"spec": spec}}})


SPOT_POOL = pool("default", "spot", "on-demand")
OD_POOL = pool("od", "on-demand")


def test_no_spot_room_but_a_nodepool_that_launches_spot_plans_the_move() -> None:
    # GIVEN no spot node at all, and a NodePool that may launch spot
    nodes = [node("od", "on-demand")]
    pods = [wpod("web", i, "od") for i in range(4)]
    plain = run(nodes, [state("web", pods)])
    assert plain.moves == () and skip_of(plain, "web") is SkipReason.NO_SPOT_ROOM
    # WHEN the plan knows the NodePools
    plan = rebalance.plan(CFG, nodes, pods, [state("web", pods)], pools=[SPOT_POOL])
    # THEN the moves are planned as launches, within the floor
    assert len(plan.moves) == 3 and all(m.launch == "default" and m.to_node == "" for m in plan.moves)
    assert "NodePool default can launch a spot node" in plan.moves[0].reason
    # an on-demand-only pool launches no spot
    plan = rebalance.plan(CFG, nodes, pods, [state("web", pods)], pools=[OD_POOL])
    assert plan.moves == () and skip_of(plan, "web") is SkipReason.NO_SPOT_ROOM
    # a pool with no capacity-type requirement does: Karpenter v1 leaves the label undefined
    # (every type allowed) and prefers spot (getCapacityType)
    plan = rebalance.plan(CFG, nodes, pods, [state("web", pods)], pools=[pool("bare")])
    assert len(plan.moves) == 3 and all(m.launch == "bare" for m in plan.moves)


def test_a_statefulset_is_never_evicted_to_wait_for_a_launch() -> None:
    """A StatefulSet's move evicts its pod first: with no spot node that has room, a NodePool
    that could launch one is no target (the pod would be down for the launch, or for as long as
    EC2 refuses spot: tests/chaos spot-refused-after-reclaim, db and queue one short)."""
    nodes = [node("od", "on-demand")]
    pods = [wpod("db", i, "od", owner=("StatefulSet", "db")) for i in range(3)]
    db = state("db", pods, kind=Kind.STATEFULSET)
    plan = rebalance.plan(CFG, nodes, pods, [db], pools=[SPOT_POOL])
    assert plan.moves == () and skip_of(plan, "db") is SkipReason.NO_SPOT_ROOM
    [skip] = plan.skipped
    assert "a StatefulSet's pod is moved only to room that exists" in skip.detail
    # a spot node with room: the eviction is planned, to it
    plan = rebalance.plan(CFG, [*nodes, node("spot-1", "spot")], pods, [db], pools=[SPOT_POOL])
    assert [(m.to_node, m.launch) for m in plan.moves] == [("spot-1", "")]


def test_a_pool_tainted_for_others_launches_nothing_for_the_pod() -> None:
    nodes = [node("od", "on-demand")]
    pods = [wpod("web", i, "od") for i in range(2)]
    tainted = pool("gpu", "spot", "on-demand", taints=[{"key": "gpu", "value": "true", "effect": "NoSchedule"}])
    plan = rebalance.plan(CFG, nodes, pods, [state("web", pods)], pools=[tainted])
    assert plan.moves == ()


def test_moves_in_flight_and_budgets_bound_the_batches() -> None:
    nodes = [node("od", "on-demand")]
    a = state("a", [wpod("a", i, "od") for i in range(8)])
    b = state("b", [wpod("b", i, "od") for i in range(8)])
    pods = [*a.pods, *b.pods]
    # 14 above the floors; 10 may be in flight, 6 already are
    cfg = dataclasses.replace(CFG, rebalance_max_in_flight=10)
    plan = rebalance.plan(cfg, nodes, pods, [a, b], pools=[SPOT_POOL], in_flight=6)
    assert len(plan.moves) == 4
    # a budget that allows 2 disruptions bounds a Deployment's batch to 2 (0 still allows 1:
    # create before evict disrupts nothing)
    plan = rebalance.plan(CFG, nodes, pods, [a, b], pools=[SPOT_POOL], budgets={a.key: 2, b.key: 0})
    assert sorted(len(batch) for batch in plan.batches()) == [1, 2]
    # an autoscaler's maxReplicas bounds it too (the move's count stays within the cap)
    plan = rebalance.plan(CFG, nodes, pods, [a], pools=[SPOT_POOL], autoscaler_max={a.key: 11})
    assert [len(batch) for batch in plan.batches()] == [3]


def test_per_step_workload_bound_prefers_emptiest_nodes() -> None:
    nodes = [node("od-a", "on-demand"), node("od-b", "on-demand"), node("spot-1", "spot")]
    a = state("a", [wpod("a", 0, "od-a"), wpod("a", 1, "od-a")])
    b = state("b", [wpod("b", 0, "od-b"), wpod("b", 1, "od-a")])
    cfg = dataclasses.replace(CFG, rebalance_max_workloads_per_step=1)
    plan = run(nodes, [a, b], cfg)
    # od-b holds one pod, od-a three: b's pod on od-b goes first
    assert [(m.workload.name, m.from_node) for m in plan.moves] == [("b", "od-b")]
    assert skip_of(plan, "a") is SkipReason.STEP_LIMIT


def test_zero_bounds_move_nothing() -> None:
    nodes = [node("od", "on-demand"), node("spot-1", "spot")]
    pods = [wpod("web", i, "od") for i in range(3)]
    for field in ("rebalance_max_workloads_per_step", "rebalance_max_pods_per_workload"):
        plan = run(nodes, [state("web", pods)], dataclasses.replace(CFG, **{field: 0}))
        assert plan.moves == ()
        assert skip_of(plan, "web") is SkipReason.STEP_LIMIT


def test_surge_in_progress_is_left_alone() -> None:
    nodes = [node("od", "on-demand"), node("spot-1", "spot")]
    pods = [wpod("web", i, "od") for i in range(3)]
    plan = run(nodes, [state("web", pods, **{"spotguard.io/surge": "{}"})])
    assert plan.moves == ()
    assert skip_of(plan, "web") is SkipReason.SURGE_IN_PROGRESS
    assert plan.surplus[0].excess == 2


def test_a_workload_its_surge_copy_serves_is_left_alone() -> None:
    """A live surge copy means a surge in progress, though the Deployment lost its record
    (a replace): neither a move of its on-demand pods nor a repair of its floor."""
    nodes = [node("od", "on-demand"), node("spot-1", "spot")]

    def copied(where: str) -> Any:
        return dataclasses.replace(state("web", [wpod("web", i, where) for i in range(3)]), surge_copy=True)

    surplus, short = run(nodes, [copied("od")]), run(nodes, [copied("spot-1")])
    for plan in (surplus, short):
        assert (plan.moves, plan.repairs) == ((), ())
        assert skip_of(plan, "web") is SkipReason.SURGE_IN_PROGRESS


def test_no_room_on_spot() -> None:
    nodes = [node("od", "on-demand"), node("spot-1", "spot", cpu="1")]
    pods = [wpod("web", i, "od", cpu="2") for i in range(3)]
    plan = run(nodes, [state("web", pods)])
    assert plan.moves == ()
    [skip] = plan.skipped
    assert skip.reason is SkipReason.NO_SPOT_ROOM
    assert "Insufficient cpu" in skip.detail


def test_room_taken_by_planned_moves_is_accounted() -> None:
    nodes = [node("od", "on-demand"), node("spot-1", "spot", cpu="1", pods=20)]
    a = state("a", [wpod("a", i, "od", cpu="600m") for i in range(2)])
    b = state("b", [wpod("b", i, "od", cpu="600m") for i in range(2)])
    plan = run(nodes, [a, b])
    assert [m.workload.name for m in plan.moves] == ["a"]
    assert skip_of(plan, "b") is SkipReason.NO_SPOT_ROOM


def test_pod_count_on_spot_is_respected() -> None:
    nodes = [node("od", "on-demand"), node("spot-1", "spot", pods=1)]
    already = pod("other", node_name="spot-1", owner=None)
    plan = run(nodes, [state("web", [wpod("web", i, "od") for i in range(2)])], others=[already])
    assert plan.moves == ()
    assert "Too many pods" in plan.skipped[0].detail


def test_unusable_spot_nodes_are_not_targets() -> None:
    notice = {"key": "spotguard.io/interruption", "value": "evt-1", "effect": "NoSchedule"}
    nodes = [
        node("od", "on-demand"),
        node("spot-doomed", "spot", taints=[notice]),
        node("spot-cordoned", "spot", unschedulable=True),
        node("spot-down", "spot", ready=False),
    ]
    tolerate_all = {"tolerations": [{"operator": "Exists"}]} | required(ON_DEMAND_EXPRS)
    pods = [wpod("web", i, "od", spec=tolerate_all) for i in range(2)]
    plan = run(nodes, [state("web", pods)])
    assert plan.moves == ()
    assert plan.skipped[0].reason is SkipReason.NO_SPOT_ROOM
    assert "no usable spot node" in plan.skipped[0].detail
    reasons = {n.name: rebalance.spot_target_problem(n, CFG) for n in nodes}
    assert reasons == {
        "od": "not a spot node",
        "spot-doomed": "under interruption notice",
        "spot-cordoned": "unschedulable",
        "spot-down": "not Ready",
    }


def test_spot_tolerations_from_config_count() -> None:
    taint = {"key": "capacity", "value": "spot", "effect": "NoSchedule"}
    nodes = [node("od", "on-demand"), node("spot-1", "spot", taints=[taint])]
    pods = [wpod("web", i, "od") for i in range(2)]
    assert run(nodes, [state("web", pods)]).moves == ()
    cfg = dataclasses.replace(CFG, spot_tolerations=(Toleration("capacity", "Equal", "spot"),))
    assert len(run(nodes, [state("web", pods, cfg=cfg)], cfg).moves) == 1


def test_user_affinity_is_respected_but_the_on_demand_requirement_is_not() -> None:
    zone = "topology.kubernetes.io/zone"
    nodes = [node("od", "on-demand"), node("spot-a", "spot", zone="a"), node("spot-b", "spot", zone="b")]
    spec = required([expr(zone, "In", "b"), *ON_DEMAND_EXPRS])
    pods = [wpod("web", i, "od", spec=spec) for i in range(2)]
    [move] = run(nodes, [state("web", pods)]).moves
    assert move.to_node == "spot-b"


def test_least_used_spot_node_is_chosen() -> None:
    nodes = [node("od", "on-demand"), node("spot-a", "spot"), node("spot-b", "spot")]
    others = [pod("x", node_name="spot-a", owner=None)]
    [move] = run(nodes, [state("web", [wpod("web", i, "od") for i in range(2)])], others=others).moves
    assert move.to_node == "spot-b"


def test_pinned_pods_are_not_moved() -> None:
    nodes = [node("od", "on-demand"), node("spot-1", "spot")]
    selector = {"nodeSelector": {"node.kubernetes.io/capacity": "on-demand"}}
    affinity = required([expr("karpenter.sh/capacity-type", "In", "on-demand")])
    for spec in (selector, affinity):
        pods = [pod(f"web-{i}", node_name="od", spec=spec) for i in range(3)]
        plan = run(nodes, [state("web", pods)])
        assert plan.moves == ()
        assert skip_of(plan, "web") is SkipReason.NO_MOVABLE_PODS


def test_pending_and_not_ready_workloads_wait() -> None:
    nodes = [node("od", "on-demand"), node("spot-1", "spot")]
    pending = [wpod("web", 0, "od"), wpod("web", 1, "od"), wpod("web", 2, None)]
    assert skip_of(run(nodes, [state("web", pending)]), "web") is SkipReason.PENDING_PODS
    unready = [wpod("web", 0, "od"), wpod("web", 1, "od"), wpod("web", 2, "spot-1", ready=False)]
    assert skip_of(run(nodes, [state("web", unready)]), "web") is SkipReason.NOT_READY_PODS


def test_disabled_workloads_are_skipped() -> None:
    nodes = [node("od", "on-demand"), node("spot-1", "spot")]
    pods = [wpod("web", i, "od") for i in range(3)]
    plan = run(nodes, [state("web", pods, **{"spotguard.io/enabled": "false"})])
    assert plan.moves == () and plan.surplus == () and plan.deficits == ()
    assert skip_of(plan, "web") is SkipReason.DISABLED


def test_statefulset_moves_only_ordinals_at_or_above_the_floor() -> None:
    nodes = [node("od", "on-demand"), node("spot-1", "spot")]
    pods = [wpod("db", i, "od") for i in range(5)]  # floor 3 of 5
    cfg = dataclasses.replace(CFG, rebalance_max_pods_per_workload=5)
    plan = run(nodes, [state("db", pods, kind=Kind.STATEFULSET)], cfg)
    # one at a time (an eviction each), the lowest ordinal above the floor first
    assert [m.pod.name for m in plan.moves] == ["db-3"]
    three = [wpod("db", i, "od") for i in range(3)]
    plan = run(nodes, [state("db", three, kind=Kind.STATEFULSET, replicas=3)])
    # 3 replicas -> floor 2; db-2 is on on-demand above the floor; db-0, db-1 are floor pods
    assert [m.pod.name for m in plan.moves] == ["db-2"]
    # (and while a scale-down to 3 has not removed db-3 yet, nothing moves)
    leaving = run(nodes, [state("db", [*three, wpod("db", 3, "spot-1")], kind=Kind.STATEFULSET, replicas=3)])
    assert not leaving.moves and [x.reason for x in leaving.skipped] == [SkipReason.PODS_LEAVING]


def test_deficits() -> None:
    nodes = [node("od", "on-demand"), node("spot-1", "spot")]
    web = state("web", [wpod("web", i, "spot-1") for i in range(3)])
    db = state("db", [wpod("db", i, "spot-1") for i in range(4)] + [wpod("db", 4, "od")], kind=Kind.STATEFULSET)
    ok = state("ok", [wpod("ok", 0, "od"), wpod("ok", 1, "spot-1")])
    plan = run(nodes, [web, db, ok])
    assert [(d.workload.name, d.floor, d.on_demand, d.missing) for d in plan.deficits] == [
        ("web", 1, 0, 1),  # sorted by workload key: Deployment/... before StatefulSet/...
        ("db", 3, 1, 2),
    ]
    assert plan.moves == ()


def test_pending_pods_labelled_on_demand_count_towards_the_floor() -> None:
    nodes = [node("od", "on-demand"), node("spot-1", "spot")]
    web = state("web", [wpod("web", 0, None), wpod("web", 1, "spot-1")])
    assert run(nodes, [web]).deficits == ()


def test_unknown_capacity_nodes_count_as_configured() -> None:
    nodes = [node("plain", None), node("spot-1", "spot")]
    pods = [wpod("web", i, "plain") for i in range(2)]
    plan = run(nodes, [state("web", pods)])
    assert [m.from_node for m in plan.moves] == ["plain"]  # unknown counts as on-demand
    cfg = dataclasses.replace(CFG, unknown_capacity=config.Capacity.SPOT)
    plan = run(nodes, [state("web", pods, cfg=cfg)], cfg)
    assert plan.moves == () and plan.deficits[0].missing == 1


def test_terminating_and_finished_pods_do_not_count() -> None:
    nodes = [node("od", "on-demand"), node("spot-1", "spot")]
    done = wpod("web", 1, "od", phase="Succeeded")
    plan = run(nodes, [state("web", [wpod("web", 0, "od"), done], replicas=1)])
    assert plan.surplus == () and plan.moves == ()


def test_plan_helpers() -> None:
    nodes = [node("od", "on-demand"), node("spot-1", "spot")]
    cfg = dataclasses.replace(CFG, rebalance_max_pods_per_workload=2)
    plan = run(nodes, [state("web", [wpod("web", i, "od") for i in range(3)])], cfg)
    assert list(plan.moves_by_workload()) == ["Deployment/shop/web"]
    assert len(plan.moves_by_workload()["Deployment/shop/web"]) == 2
    assert not plan.empty
    assert rebalance.plan(CFG, [], [], []).empty
