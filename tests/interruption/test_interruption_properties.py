"""Property tests of the interruption plan over generated clusters and bursts of notices."""

from __future__ import annotations

import dataclasses
from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st
from spotguard.policy import config, floors, interruption
from spotguard.policy.capacity import Capacity
from spotguard.policy.interruption import Autoscaler, Budget
from spotguard.policy.notices import NoticeKind
from spotguard.policy.tolerations import Taint
from spotguard.policy.workloads import INTERRUPTION_TAINT, Kind

from tests.interruption.cluster_builders import deployment, node, notice, pod, statefulset, with_surge

CFG = dataclasses.replace(config.Config(), rebalance_action=config.RebalanceAction.SURGE)
NOW = 5_000.0


@st.composite
def clusters(draw):
    n_nodes = draw(st.integers(2, 8))
    nodes = []
    for i in range(n_nodes):
        cap = draw(st.sampled_from(["spot", "spot", "on-demand"]))
        n = node(f"n{i}", cap)
        if draw(st.integers(0, 5)) == 0:
            n = dataclasses.replace(n, taints=(Taint(INTERRUPTION_TAINT, "old", "NoSchedule"),))
        nodes.append(n)
    workloads, pods = [], []
    for w in range(draw(st.integers(1, 6))):
        replicas = draw(st.integers(1, 6))
        make = draw(st.sampled_from([deployment, deployment, statefulset]))
        wl = make(f"w{w}", replicas)
        workloads.append(wl)
        for i in range(replicas):
            where = draw(st.sampled_from([*[n.name for n in nodes], ""]))
            pods.append(
                pod(wl, i, where, ready=bool(where) and draw(st.booleans()), terminating=draw(st.integers(0, 9)) == 0)
            )
    budgets = []
    if draw(st.booleans()):
        budgets.append(Budget("shop", "user", {"matchLabels": {"app": "w0"}}))
    autoscalers = []
    if draw(st.booleans()):
        autoscalers.append(Autoscaler("shop", "hpa", "Deployment", "w1", 1, draw(st.integers(1, 10))))
    chosen = draw(st.lists(st.sampled_from(nodes), min_size=1, max_size=len(nodes)))
    notices = []
    for n in chosen:
        kind = draw(st.sampled_from(list(NoticeKind)))
        state = (
            draw(st.sampled_from(["shutting-down", "terminated", "running"])) if kind is NoticeKind.STATE_CHANGE else ""
        )
        for _ in range(draw(st.integers(1, 3))):  # duplicates
            notices.append(notice(f"i-{n.name}", f"ev-{n.name}-{kind}", kind, state))
    notices.append(notice("i-foreign", "ev-foreign"))
    notices = draw(st.permutations(notices))
    return nodes, pods, workloads, budgets, autoscalers, notices


def run(nodes, pods, workloads, budgets, autoscalers, notices, *, now=NOW):  # noqa: PLR0917
    return interruption.plan(
        notices,
        nodes=nodes,
        pods=pods,
        workloads=workloads,
        config=CFG,
        now=now,
        budgets=budgets,
        autoscalers=autoscalers,
    )


def apply(plan, nodes, workloads, budgets, autoscalers):
    """What the handler writes, applied to the inputs."""
    tainted = {t.node for t in plan.taints}
    nodes = [
        dataclasses.replace(n, taints=(*n.taints, Taint(INTERRUPTION_TAINT, "x", "NoSchedule")))
        if n.name in tainted
        else n
        for n in nodes
    ]
    steps = {s.workload.key: s for s in plan.surges}
    new_wls = []
    for w in workloads:
        s = steps.get(w.key)
        if s is not None and s.added:
            new_wls.append(dataclasses.replace(with_surge(w, s.record.to_json()), replicas=s.replicas))
        else:
            new_wls.append(w)
    budgets = list(budgets) + [
        Budget(s.workload.namespace, s.budget.name, {}, ours=True) for s in plan.surges if s.budget
    ]
    hpa_steps = {s.autoscaler.name: s.autoscaler for s in plan.surges if s.autoscaler}
    autoscalers = [
        dataclasses.replace(a, min_replicas=hpa_steps[a.name].min_replicas, max_replicas=hpa_steps[a.name].max_replicas)
        if a.name in hpa_steps
        else a
        for a in autoscalers
    ]
    return nodes, new_wls, budgets, autoscalers


@settings(max_examples=100, deadline=None)
@given(clusters())
def test_one_taint_per_doomed_node_and_one_entry_per_workload(c) -> None:
    nodes, _pods, _workloads, _budgets, _autoscalers, notices = c
    plan = run(*c)
    taint_nodes = [t.node for t in plan.taints]
    assert len(taint_nodes) == len(set(taint_nodes))
    already = {n.name for n in nodes if interruption.has_interruption_taint(n)}
    assert not set(taint_nodes) & already
    named = {r.node for r in plan.notices if r.verdict in (interruption.Verdict.DOOMED, interruption.Verdict.TAINT)}
    assert set(taint_nodes) == named - already
    keys = [s.workload.key for s in plan.surges]
    assert len(keys) == len(set(keys))
    assert all(s.workload.kind is Kind.DEPLOYMENT for s in plan.surges)
    assert len(plan.notices) == len(notices)
    assert [r.notice for r in plan.notices] == list(notices)
    assert (
        plan.notices[[r.notice.instance_id for r in plan.notices].index("i-foreign")].verdict
        is interruption.Verdict.FOREIGN
    )


@settings(max_examples=100, deadline=None)
@given(clusters())
def test_the_surge_covers_every_doomed_pod_and_keeps_the_floor(c) -> None:
    nodes, pods, _workloads, budgets, _autoscalers, _notices = c
    plan = run(*c)
    cap = {n.name: CFG.node_capacity(n.labels) for n in nodes}
    kinds: dict[str, set[NoticeKind]] = {}
    for r in plan.notices:
        if r.verdict is interruption.Verdict.DOOMED:
            kinds.setdefault(r.node, set()).add(r.notice.kind)
    for s in plan.surges:
        wl_pods = [p for p in pods if p.labels.get("app") == s.workload.name and p.active]
        doomed = [p for p in wl_pods if p.node_name in plan.doomed_nodes]
        assert s.added == len(doomed) == s.record.surge
        assert s.replicas == s.workload.replicas + s.added
        # The spot nodes an autoscaler only drains: their replacements are spot replicas
        drained = set(s.record.spot_drains)
        assert all(cap.get(n) is Capacity.SPOT and kinds[n] == {NoticeKind.DRAIN} for n in drained)
        # The on-demand nodes an autoscaler only drains: their replacements beyond the floor are not
        spare = dict(s.record.spare_drains)
        assert all(cap.get(n) is Capacity.ON_DEMAND and kinds[n] == {NoticeKind.DRAIN} for n in spare)
        on_demand_added = s.added - sum(1 for p in doomed if p.node_name in drained) - sum(spare.values())
        # Once the surge is Ready (its on-demand replicas on on-demand, as its raised floor
        # asks), the workload has as many pods, and as many on-demand pods, as before.
        survivors = [p for p in wl_pods if p not in doomed]
        assert len(survivors) + s.added >= len(wl_pods)
        od_before = sum(1 for p in wl_pods if cap.get(p.node_name) is Capacity.ON_DEMAND)
        od_after = sum(1 for p in survivors if cap.get(p.node_name) is Capacity.ON_DEMAND) + on_demand_added
        floor = floors.floor_for(s.workload, CFG).on_demand
        assert od_after >= min(od_before, floor)
        surged = dataclasses.replace(with_surge(s.workload, s.record.to_json()), replicas=s.replicas)
        assert floors.floor_for(surged, CFG).on_demand == min(s.replicas, floor + on_demand_added)
        if s.budget is not None:
            assert s.budget.min_available == sum(1 for p in wl_pods if p.ready) > 0
            assert not any(b.selector == {"matchLabels": {"app": s.workload.name}} for b in budgets)


@settings(max_examples=100, deadline=None)
@given(clusters(), st.randoms(use_true_random=False))
def test_replay_is_idempotent_and_order_does_not_matter(c, rnd) -> None:
    nodes, pods, workloads, budgets, autoscalers, notices = c
    plan = run(*c)
    shuffled = list(notices) * 2
    rnd.shuffle(shuffled)
    again = run(nodes, pods, workloads, budgets, autoscalers, shuffled)
    assert {t.node for t in again.taints} == {t.node for t in plan.taints}
    assert Counter({s.workload.key: s.added for s in again.surges}) == Counter(
        {s.workload.key: s.added for s in plan.surges}
    )

    nodes2, workloads2, budgets2, autoscalers2 = apply(plan, nodes, workloads, budgets, autoscalers)
    replay = run(nodes2, pods, workloads2, budgets2, autoscalers2, shuffled, now=NOW + 10)
    assert replay.taints == ()
    for s in replay.surges:
        assert s.added == 0 and s.budget is None and s.autoscaler is None
        before = next(x for x in plan.surges if x.workload.key == s.workload.key)
        assert s.record == before.record
