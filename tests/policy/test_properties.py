"""Property-based tests of the policy over generated pods, workloads, nodes and clusters."""

from __future__ import annotations

import copy
import dataclasses
import os
from typing import Any

import jsonpatch
import kubernetes_validate
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from spotguard.policy import (
    capacity,
    config,
    fit,
    floors,
    patches,
    placement,
    quantities,
    rebalance,
    views,
)
from spotguard.policy.capacity import Capacity
from spotguard.policy.placement import Placement
from spotguard.policy.views import NodeView, PodView
from spotguard.policy.workloads import INTERRUPTION_TAINT, SURGE, Kind

from tests.policy import strategies as gen

K8S_VERSION = "1.35"
REQ = gen.REQ
PREF = gen.PREF

# Sized so that tests/policy runs in well under a minute; SPOTGUARD_HYPOTHESIS_SCALE=20
# multiplies every budget for a longer search.
SCALE = max(1, int(os.environ.get("SPOTGUARD_HYPOTHESIS_SCALE", "1")))


def budget(examples: int) -> settings:
    return settings(max_examples=examples * SCALE, deadline=None, suppress_health_check=[HealthCheck.too_slow])


FAST = budget(60)
SLOW = budget(40)


def _validate(obj: dict[str, Any]) -> None:
    kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def _get(obj: Any, *path: str) -> Any:
    for p in path:
        obj = obj.get(p) if isinstance(obj, dict) else None
    return obj


@SLOW
@given(pod=gen.pods_json(), where=st.sampled_from(list(Placement)), cfg=gen.configs())
def test_patch_applies_validates_is_idempotent_and_keeps_user_terms(
    pod: dict[str, Any], where: Placement, cfg: config.Config
) -> None:
    _validate(pod)  # the generated pod is one the API server would accept
    original = copy.deepcopy(pod)
    ops = patches.build(pod, where, cfg)
    assert pod == original
    patched = jsonpatch.apply_patch(pod, ops)  # applies cleanly (raises otherwise)
    _validate(patched)
    assert patches.build(patched, where, cfg) == []  # idempotent

    # the placement label, and the user's labels, are there
    assert patched["metadata"]["labels"]["spotguard.io/placement"] == where.value
    for k, v in (_get(original, "metadata", "labels") or {}).items():
        if k != "spotguard.io/placement":
            assert patched["metadata"]["labels"][k] == v

    # every original required term survives with its expressions and fields
    before = _get(original, "spec", "affinity", "nodeAffinity", REQ, "nodeSelectorTerms") or []
    after = _get(patched, "spec", "affinity", "nodeAffinity", REQ, "nodeSelectorTerms") or []
    assert len(after) >= len(before)
    for old, new in zip(before, after, strict=False):
        for e in old.get("matchExpressions") or []:
            assert e in new["matchExpressions"]
        assert old.get("matchFields") == new.get("matchFields")
    # preferred terms, tolerations and spread constraints are kept, in order, as a prefix
    for path in (("affinity", "nodeAffinity", PREF), ("tolerations",), ("topologySpreadConstraints",)):
        old_list = _get(original["spec"], *path) or []
        assert (_get(patched["spec"], *path) or [])[: len(old_list)] == old_list
    assert _get(patched, "spec", "affinity", "podAntiAffinity") == _get(original, "spec", "affinity", "podAntiAffinity")
    assert patched["spec"]["containers"] == original["spec"]["containers"]


@FAST
@given(pod=gen.pods_json(), cfg=gen.configs(), node=gen.nodes("n1"))
def test_on_demand_patch_is_the_user_affinity_anded_with_on_demand(
    pod: dict[str, Any], cfg: config.Config, node: NodeView
) -> None:
    """The patched pod matches a node exactly when the user's affinity does and it is on-demand."""
    patched = jsonpatch.apply_patch(pod, patches.build(pod, Placement.ON_DEMAND, cfg))
    before = fit.matches_required_affinity(PodView.from_json(pod), node)
    after = fit.matches_required_affinity(PodView.from_json(patched), node)
    on_demand = cfg.node_capacity(node.labels) is Capacity.ON_DEMAND
    assert after == (before and on_demand)


@FAST
@given(pod=gen.pods_json(), cfg=gen.configs(), node=gen.nodes("n1"))
def test_spot_patch_never_narrows_where_the_pod_may_run(
    pod: dict[str, Any], cfg: config.Config, node: NodeView
) -> None:
    patched = jsonpatch.apply_patch(pod, patches.build(pod, Placement.SPOT, cfg))
    before = fit.check(PodView.from_json(pod), node)
    after = fit.check(PodView.from_json(patched), node)
    assert after.reasons <= before.reasons  # added tolerations can only widen


@FAST
@given(
    wl=gen.workloads(),
    order=st.randoms(use_true_random=False),
    scheduled=st.lists(st.booleans(), min_size=20, max_size=20),
)
def test_placing_pods_one_by_one_yields_exactly_the_floor(wl: Any, order: Any, scheduled: list[bool]) -> None:
    cfg = config.Config()
    floor = floors.floor_for(wl, cfg)
    node_capacity = {"od": Capacity.ON_DEMAND, "spot": Capacity.SPOT}
    ordinals = list(range(wl.replicas))
    order.shuffle(ordinals)  # StatefulSet pods may be created in any order (Parallel)
    placed: list[PodView] = []
    for i, ordinal in enumerate(ordinals):
        name = f"web-{ordinal}" if wl.kind is Kind.STATEFULSET else ""
        owner = "StatefulSet" if wl.kind is Kind.STATEFULSET else "ReplicaSet"
        new = PodView(
            namespace="shop",
            name=name,
            uid=f"u{i}",
            labels={"app": "web"},
            owner=views.Owner(owner, "web"),
        )
        assert placement.skip_reason(new, cfg) is None
        got = placement.decide(pod=new, workload=wl, floor=floor, siblings=placed, node_capacity=node_capacity)
        assert got.placement is not None
        labels = {"app": "web", "spotguard.io/placement": got.placement.value}
        # some pods get scheduled (onto a node of their placement), others stay pending
        node_name = ("od" if got.placement is Placement.ON_DEMAND else "spot") if scheduled[i % 20] else ""
        placed.append(dataclasses.replace(new, labels=labels, node_name=node_name))
    on_demand = sum(1 for p in placed if p.placement_label == Placement.ON_DEMAND.value)
    assert on_demand == floor.on_demand == min(floor.on_demand, wl.replicas)
    # reinvocation of every pod changes nothing
    for p in placed:
        again = placement.decide(pod=p, workload=wl, floor=floor, siblings=placed, node_capacity=node_capacity)
        assert again.placement is not None and again.placement.value == p.placement_label


@FAST
@given(wl=gen.workloads(), batch=st.integers(1, 12), held=st.integers(0, 12))
def test_reservations_bound_concurrent_on_demand_slots(wl: Any, batch: int, held: int) -> None:
    """A burst of Deployment pods, each seeing the reservations handed out before it,
    gets exactly the on-demand slots the floor still lacks."""
    cfg = config.Config()
    wl = dataclasses.replace(wl, kind=Kind.DEPLOYMENT)
    floor = floors.floor_for(wl, cfg)
    siblings = [PodView(namespace="shop", name=f"old-{i}", uid=f"old-{i}", node_name="od") for i in range(held)]
    reserved = 0
    for _ in range(batch):
        new = PodView(namespace="shop", name="", uid="", owner=views.Owner("ReplicaSet", "web"))
        got = placement.decide(
            pod=new,
            workload=wl,
            floor=floor,
            siblings=siblings,
            node_capacity={"od": Capacity.ON_DEMAND},
            reserved_on_demand=reserved,
        )
        if got.placement is Placement.ON_DEMAND:
            reserved += 1
    assert reserved == min(batch, max(0, floor.on_demand - held))


BOUNDS = st.tuples(st.sampled_from([0, 1, 1, 2, 3, 10]), st.sampled_from([0, 1, 1, 2, 3, 10]))


@budget(80)
@given(data=st.data(), bounds=BOUNDS, cfg=gen.configs())
def test_rebalance_never_breaks_a_floor_or_overfills_a_spot_node(
    data: st.DataObject, bounds: tuple[int, int], cfg: config.Config
) -> None:
    cfg = dataclasses.replace(
        cfg, rebalance_max_workloads_per_step=bounds[0], rebalance_max_pods_per_workload=bounds[1]
    )
    check_rebalance(cfg, *data.draw(gen.clusters(cfg)))


@budget(80)
@given(data=st.data(), bounds=BOUNDS)
def test_rebalance_in_tight_clusters(data: st.DataObject, bounds: tuple[int, int]) -> None:
    cfg = dataclasses.replace(
        config.Config(),
        rebalance_max_workloads_per_step=bounds[0],
        rebalance_max_pods_per_workload=bounds[1],
    )
    check_rebalance(cfg, *data.draw(gen.tight_clusters(cfg)))


def check_rebalance(cfg: config.Config, nodes: list[NodeView], pods: list[PodView], states: list[Any]) -> None:
    plan = rebalance.plan(cfg, nodes, pods, states)
    event(f"moves: {min(len(plan.moves), 3)}")
    event(f"deficits: {min(len(plan.deficits), 2)}")
    event("skips: " + ",".join(sorted({str(s.reason) for s in plan.skipped})))
    by_name = {n.name: n for n in nodes}
    node_capacity = {n.name: cfg.node_capacity(n.labels) for n in nodes}
    moves = plan.moves_by_workload()
    assert len(moves) <= cfg.rebalance_max_workloads_per_step

    for s in states:
        mine = moves.get(s.key, [])
        active = [p for p in s.pods if p.active]
        on_demand = sum(1 for p in active if placement.placement_of(p, node_capacity) is Placement.ON_DEMAND)
        # never below the floor, never more than the bound
        assert len(mine) <= cfg.rebalance_max_pods_per_workload
        if mine:
            assert on_demand - len(mine) >= s.floor.on_demand
            assert s.floor.enabled and SURGE not in s.workload.annotations
            assert all(p.node_name for p in active)  # nothing pending
            assert len({m.pod.uid for m in mine}) == len(mine)
        for m in mine:
            assert node_capacity[m.from_node] is Capacity.ON_DEMAND
            assert m.pod in s.pods
            if s.workload.kind is Kind.STATEFULSET:
                assert m.pod.ordinal is not None and m.pod.ordinal >= s.floor.on_demand
        enabled_short = s.floor.enabled and on_demand < s.floor.on_demand
        assert enabled_short == any(d.workload.key == s.key for d in plan.deficits)
        if enabled_short:
            [d] = [d for d in plan.deficits if d.workload.key == s.key]
            assert d.missing == s.floor.on_demand - on_demand

    # every target is a usable spot node, the pod fits its taints and affinity, and no node overfills
    usage = fit.usage_by_node(pods)
    added: dict[str, list[PodView]] = {}
    for m in plan.moves:
        target = by_name[m.to_node]
        assert capacity.classify(target.labels, cfg.label_schemes) is Capacity.SPOT
        assert target.ready and not target.unschedulable
        assert not any(t.key == INTERRUPTION_TAINT for t in target.taints)
        assert fit.taint_failures(target, tuple(m.pod.tolerations) + cfg.spot_tolerations) == []
        added.setdefault(m.to_node, []).append(m.pod)
    for name, moved in added.items():
        alloc = by_name[name].allocatable
        base = usage.get(name, fit.EMPTY)
        total = quantities.add(dict(base.requests), {})
        for p in moved:
            total = quantities.add(total, p.requests)
        assert base.pods + len(moved) <= alloc["pods"]
        for resource in {r for p in moved for r, v in p.requests.items() if v > 0}:
            assert total[resource] <= alloc.get(resource, 0), (name, resource)
