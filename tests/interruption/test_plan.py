"""The pure interruption plan: taints, surges, budgets, autoscalers, quorum, scale back."""

from __future__ import annotations

import dataclasses

import pytest
from spotguard.policy import config, floors, interruption
from spotguard.policy.interruption import Autoscaler, Budget, Verdict
from spotguard.policy.notices import NodeNotice, NoticeKind
from spotguard.policy.surges import SurgeRecord
from spotguard.policy.tolerations import Taint
from spotguard.policy.workloads import INTERRUPTION_TAINT

from tests.interruption.cluster_builders import deployment, node, notice, pod, statefulset, with_surge

CFG = config.Config()
NOW = 1_000_000.0


def cluster() -> tuple[list, list, list]:
    nodes = [node("s1"), node("s2"), node("s3"), node("od1", "on-demand")]
    web = deployment("web", 4)
    api = deployment("api", 2)
    db = statefulset("db", 3)
    pods = [
        pod(web, 0, "s1"),
        pod(web, 1, "s1"),
        pod(web, 2, "s2"),
        pod(web, 3, "od1"),
        pod(api, 0, "s3"),
        pod(api, 1, "od1"),
        pod(db, 0, "od1"),
        pod(db, 1, "s1"),
        pod(db, 2, "s2"),
    ]
    return nodes, pods, [web, api, db]


def make_plan(notices, nodes=None, pods=None, workloads=None, **kw):
    n, p, w = cluster()
    return interruption.plan(
        notices,
        nodes=n if nodes is None else nodes,
        pods=p if pods is None else pods,
        workloads=w if workloads is None else workloads,
        config=kw.pop("config", CFG),
        now=NOW,
        **kw,
    )


def by_name(plan):
    return {s.workload.name: s for s in plan.surges}


def test_one_notice_taints_the_node_and_surges_its_deployments() -> None:
    plan = make_plan([notice("i-s1", "ev-1")])
    assert [(t.node, t.event_id) for t in plan.taints] == [("s1", "ev-1")]
    assert plan.taints[0].taint_json() == {"key": INTERRUPTION_TAINT, "value": "ev-1", "effect": "NoSchedule"}
    surges = by_name(plan)
    assert set(surges) == {"web"}
    web = surges["web"]
    assert (web.added, web.replicas, web.record.replicas, web.record.surge) == (2, 6, 4, 2)
    assert web.record.nodes == ("s1",) and web.record.events == ("ev-1",)
    assert web.record.started == NOW
    assert web.budget == interruption.BudgetStep("spotguard-surge-web", 4)
    assert plan.notices[0].verdict is Verdict.DOOMED


def test_a_burst_is_one_entry_per_node_and_per_workload() -> None:
    notices = [notice("i-s1", "ev-1"), notice("i-s2", "ev-2"), notice("i-s1", "ev-1"), notice("i-s3", "ev-3")]
    notices += [notice("i-s2", "ev-2")] * 5
    plan = make_plan(notices)
    assert sorted(t.node for t in plan.taints) == ["s1", "s2", "s3"]
    surges = by_name(plan)
    assert set(surges) == {"web", "api"}
    assert surges["web"].added == 3 and surges["web"].replicas == 7
    assert surges["web"].record.events == ("ev-1", "ev-2")
    assert surges["api"].added == 1
    assert len(plan.notices) == len(notices)


def test_surges_go_out_most_at_risk_first() -> None:
    # GIVEN every spot node doomed at once: "alone" (1 replica, on spot: nothing left), "big"
    # (10 on spot, 1 on on-demand), "small" (2 on spot, 1 on on-demand), "also-small" (2 + 1)
    nodes = [node("s1"), node("od1", "on-demand")]
    alone, big, small, also = (deployment("alone", 1), deployment("big", 11), deployment("small", 3),
                               deployment("also-small", 3))
    pods = [pod(alone, 0, "s1"), *(pod(big, i, "s1") for i in range(10)), pod(big, 10, "od1")]
    for wl in (small, also):
        pods += [pod(wl, 0, "s1"), pod(wl, 1, "s1"), pod(wl, 2, "od1")]
    plan = make_plan([notice("i-s1")], nodes=nodes, pods=pods, workloads=[big, small, alone, also])
    # THEN the surges are written in that order: the one with nothing left serving first, then
    # the smallest (each whole sooner, while the controller-manager creates pods a few tens a
    # second), then by name
    assert [s.workload.name for s in plan.surges] == ["alone", "also-small", "small", "big"]


def test_a_pod_placed_on_a_covered_doomed_node_after_the_surge_gets_a_replacement_too() -> None:
    """Under API 500s the taint of a doomed node can fail (retried) while its surge is written:
    a surge pod (or any new pod) bound there meanwhile dies with the node. The next plan of the
    same notice (the retry, the reconcile) adds one replica for each such pod; pods that left
    the node (evicted, gone) take nothing back, and a replay with nothing new adds nothing."""
    first = make_plan([notice("i-s1", "ev-1")])
    web = first.surges[0]
    assert web.record.counts == (("s1", 2),)
    surged = dataclasses.replace(with_surge(web.workload, web.record.to_json()), replicas=web.replicas)
    _nodes, pods, wls = cluster()
    wls = [surged if w.name == "web" else w for w in wls]
    landed = [*pods, pod(surged, 4, "s1")]  # a surge pod bound to s1 before its taint
    again = by_name(make_plan([notice("i-s1", "ev-1")], pods=landed, workloads=wls))["web"]
    assert (again.added, again.replicas, again.record.surge) == (1, 7, 3)
    assert again.record.counts == (("s1", 3),) and again.write_workload

    evicted = [p for p in pods if not (p.node_name == "s1" and p.name.startswith("web"))]
    evicted.append(pod(surged, 0, "s1"))  # one of the two left (the drainer took the other)
    step = by_name(make_plan([notice("i-s1", "ev-1")], pods=evicted, workloads=wls))["web"]
    assert step.added == 0 and step.record.counts == (("s1", 2),) and not step.write_workload

    # a record written before counts were kept: today's count is taken as covered
    old = SurgeRecord.parse(web.record.to_json().replace(',"counts":{"s1":2}', ""))
    assert old is not None and old.counts == ()
    legacy = dataclasses.replace(with_surge(web.workload, old.to_json()), replicas=web.replicas)
    wls = [legacy if w.name == "web" else w for w in wls]
    step = by_name(make_plan([notice("i-s1", "ev-1")], pods=landed, workloads=wls))["web"]
    assert step.added == 0 and step.record.counts == (("s1", 3),)


def test_a_surge_copys_pods_on_a_newly_doomed_node_extend_the_surge_in_copy_mode() -> None:
    """A copy of spot slots (its surge replaced pods a node autoscaler only drained) has two
    pods on s3; a warning comes for s3, where web has no pod of its own. In copy mode web's
    surge covers s3 too (its record names the node, counts the two), so the copy's state
    machine grows the copy for them; before, web had no surge step at all and the copy's pods
    died at the reclaim with no replacement. The replica surge has no copy: nothing changes."""
    from spotguard.policy.views import Owner
    from spotguard.policy.workloads import SURGE_OF

    _nodes, pods, wls = cluster()
    web = next(w for w in wls if w.name == "web")
    copy_pods = [
        dataclasses.replace(
            pod(web, 10 + i, "s3"),
            name=f"spotguard-surge-web-x{i}",
            labels={"app": "web", SURGE_OF: "web"},
            owner=Owner("ReplicaSet", "spotguard-surge-web"),
        )
        for i in range(2)
    ]
    plan = make_plan([notice("i-s3", "ev-3")], pods=[*pods, *copy_pods], surge_copy=True)
    step = by_name(plan)["web"]
    assert step.record.nodes == ("s3",) and step.record.counts == (("s3", 2),) and step.added == 2
    assert step.replicas == 4  # the copy's surge never writes the Deployment's count
    assert "web" not in by_name(make_plan([notice("i-s3", "ev-3")], pods=[*pods, *copy_pods]))


def test_foreign_and_ignored_notices() -> None:
    plan = make_plan(
        [
            notice("i-elsewhere", "ev-9"),
            notice("i-s1", "ev-r", NoticeKind.STATE_CHANGE, state="running"),
        ]
    )
    assert [r.verdict for r in plan.notices] == [Verdict.FOREIGN, Verdict.IGNORED]
    assert plan.foreign == (plan.notices[0].notice,)
    assert not plan.taints and not plan.surges


def test_an_existing_taint_is_not_written_again() -> None:
    nodes, _pods, _wls = cluster()
    nodes[0] = node("s1", taints=[{"key": INTERRUPTION_TAINT, "value": "ev-0", "effect": "NoSchedule"}])
    plan = make_plan([notice("i-s1", "ev-1")], nodes=nodes)
    assert plan.taints == ()
    assert by_name(plan)["web"].added == 2  # the surge is still planned (it was not recorded)


def test_replay_adds_nothing_and_a_new_node_adds_only_its_pods() -> None:
    first = make_plan([notice("i-s1", "ev-1")])
    web = first.surges[0]
    surged = dataclasses.replace(with_surge(web.workload, web.record.to_json()), replicas=web.replicas)
    _, _pods, wls = cluster()
    wls = [surged if w.name == "web" else w for w in wls]
    replay = make_plan([notice("i-s1", "ev-1")] * 10, workloads=wls)
    step = by_name(replay)["web"]
    assert step.added == 0 and not step.write_workload
    assert step.record == web.record

    later = make_plan([notice("i-s2", "ev-2")], workloads=wls)
    step = by_name(later)["web"]
    assert (step.added, step.replicas) == (1, 7)
    assert (step.record.replicas, step.record.surge) == (4, 3)
    assert step.record.nodes == ("s1", "s2") and step.record.events == ("ev-1", "ev-2")
    assert step.record.started == NOW


def test_user_budget_means_no_temporary_budget() -> None:
    users = [Budget("shop", "web-pdb", {"matchLabels": {"app": "web"}})]
    assert by_name(make_plan([notice("i-s1")], budgets=users))["web"].budget is None
    other_ns = [Budget("other", "web-pdb", {"matchLabels": {"app": "web"}})]
    assert by_name(make_plan([notice("i-s1")], budgets=other_ns))["web"].budget is not None
    exprs = [Budget("shop", "all", {"matchExpressions": [{"key": "app", "operator": "In", "values": ["web"]}]})]
    assert by_name(make_plan([notice("i-s1")], budgets=exprs))["web"].budget is None


def test_our_budget_is_not_created_twice() -> None:
    ours = [Budget("shop", "spotguard-surge-web", {"matchLabels": {"app": "web"}}, ours=True)]
    step = by_name(make_plan([notice("i-s1")], budgets=ours))["web"]
    assert step.budget is None and step.record.budget == "spotguard-surge-web"


def test_budget_min_available_is_the_ready_count() -> None:
    _nodes, pods, wls = cluster()
    pods[3] = pod(wls[0], 3, "od1", ready=False)
    assert by_name(make_plan([notice("i-s1")], pods=pods))["web"].budget.min_available == 3


def test_autoscaler_minimum_rises_to_the_surge_and_the_original_is_recorded() -> None:
    hpa = [Autoscaler("shop", "web", "Deployment", "web", min_replicas=2, max_replicas=5)]
    step = by_name(make_plan([notice("i-s1")], autoscalers=hpa))["web"]
    assert step.autoscaler == interruption.AutoscalerStep("web", 6, 6)
    assert (step.record.hpa, step.record.hpa_min, step.record.hpa_max) == ("web", 2, 5)
    rec = SurgeRecord.parse(step.record.to_json())
    assert rec == step.record


def test_statefulset_quorum_warning() -> None:
    plan = make_plan([notice("i-s1"), notice("i-s2", "ev-2")])
    assert [(w.workload.name, w.doomed, w.floor) for w in plan.warnings] == [("db", 2, 2)]
    assert "below the quorum floor of 2" in plan.warnings[0].message
    assert "db" not in by_name(plan)
    only_one = make_plan([notice("i-s1")])
    assert only_one.warnings == ()


def test_statefulset_counts_pods_on_nodes_tainted_earlier() -> None:
    nodes, _, _ = cluster()
    nodes[1] = node("s2", taints=[{"key": INTERRUPTION_TAINT, "value": "ev-0", "effect": "NoSchedule"}])
    plan = make_plan([notice("i-s1")], nodes=nodes)
    assert [w.workload.name for w in plan.warnings] == ["db"]


@pytest.mark.parametrize(
    ("action", "taints", "surges", "verdict"),
    [
        (config.RebalanceAction.IGNORE, 0, 0, Verdict.IGNORED),
        (config.RebalanceAction.TAINT, 1, 0, Verdict.TAINT),
        (config.RebalanceAction.SURGE, 1, 1, Verdict.DOOMED),
    ],
)
def test_rebalance_actions(action, taints, surges, verdict) -> None:
    cfg = dataclasses.replace(CFG, rebalance_action=action)
    plan = make_plan([notice("i-s1", "rb-1", NoticeKind.REBALANCE)], config=cfg)
    assert len(plan.taints) == taints and len(plan.surges) == surges
    assert plan.notices[0].verdict is verdict


@pytest.mark.parametrize("state", ["shutting-down", "terminated", "stopping", "stopped"])
def test_state_change_to_a_doomed_state_surges(state) -> None:
    plan = make_plan([notice("i-s1", "sc-1", NoticeKind.STATE_CHANGE, state=state)])
    assert by_name(plan)["web"].added == 2


def test_interruption_names_the_taint_over_a_rebalance() -> None:
    cfg = dataclasses.replace(CFG, rebalance_action=config.RebalanceAction.SURGE)
    plan = make_plan([notice("i-s1", "rb-1", NoticeKind.REBALANCE), notice("i-s1", "ev-1")], config=cfg)
    assert [(t.node, t.event_id, t.kind) for t in plan.taints] == [("s1", "ev-1", NoticeKind.INTERRUPTION)]


def _mark(kind: NoticeKind, until: float, event: str = "ev-0", time: float = NOW) -> NodeNotice:
    return NodeNotice(event_id=event, kind=kind, time=time, until=until, action="terminate")


REBALANCE_TAINT = [{"key": INTERRUPTION_TAINT, "value": "rb-1", "effect": "NoSchedule"}]


def test_an_interruption_rewrites_a_rebalance_mark_that_ends_sooner_than_the_reclaim() -> None:
    """The recommendation came 80 s before the warning, with a 120 s rebalance surge: its mark
    ends at +40 s, the reclaim is at +120 s. Left saying rebalance, the node would be released
    by the eviction guard, and its surge ended, at +40 s (chaos drainer-after-rebalance-surge
    under timeouts: cart 4 -> 3)."""
    nodes, _pods, _wls = cluster()
    nodes[0] = node("s1", taints=REBALANCE_TAINT)
    marks = {"s1": _mark(NoticeKind.REBALANCE, NOW + 40, "rb-1", NOW - 80)}
    plan = make_plan([notice("i-s1", "ev-1")], nodes=nodes, node_notices=marks)
    assert [(t.node, t.event_id, t.kind, t.notice and t.notice.until) for t in plan.taints] == [
        ("s1", "ev-1", NoticeKind.INTERRUPTION, NOW + 120)
    ]


def test_a_late_rebalance_recommendation_never_replaces_a_reclaims_mark() -> None:
    """Reordered messages: the warning was handled first; the recommendation sent before it
    arrives after, and its (shorter) deadline must not turn the node back into a rebalance's."""
    cfg = dataclasses.replace(CFG, rebalance_action=config.RebalanceAction.SURGE, rebalance_surge_seconds=30)
    nodes, _pods, _wls = cluster()
    nodes[0] = node("s1", taints=REBALANCE_TAINT)
    marks = {"s1": _mark(NoticeKind.INTERRUPTION, NOW + 100, "ev-1")}
    plan = make_plan([notice("i-s1", "rb-1", NoticeKind.REBALANCE)], nodes=nodes, node_notices=marks, config=cfg)
    assert plan.taints == ()


@pytest.mark.parametrize(
    ("old", "new", "stands"),
    [
        (_mark(NoticeKind.INTERRUPTION, NOW + 100, "ev-1"), _mark(NoticeKind.INTERRUPTION, NOW + 100, "ev-1"), True),
        (_mark(NoticeKind.INTERRUPTION, NOW + 50, "ev-1"), _mark(NoticeKind.INTERRUPTION, NOW + 100, "ev-2"), True),
        (_mark(NoticeKind.INTERRUPTION, NOW + 100, "ev-1"), _mark(NoticeKind.INTERRUPTION, NOW + 50, "ev-2"), False),
        (_mark(NoticeKind.INTERRUPTION, NOW - 1, "ev-1"), _mark(NoticeKind.INTERRUPTION, NOW + 100, "ev-2"), False),
        (_mark(NoticeKind.REBALANCE, NOW + 40, "rb-1"), _mark(NoticeKind.INTERRUPTION, NOW + 120, "ev-1"), False),
        (_mark(NoticeKind.REBALANCE, NOW + 40, "rb-1"), _mark(NoticeKind.STATE_CHANGE, NOW + 120, "sc-1"), False),
        (_mark(NoticeKind.INTERRUPTION, NOW + 100, "ev-1"), _mark(NoticeKind.REBALANCE, NOW + 30, "rb-1"), True),
        (_mark(NoticeKind.REBALANCE, NOW + 40, "rb-1"), _mark(NoticeKind.REBALANCE, NOW + 600, "rb-2"), True),
    ],
)
def test_which_mark_stands(old: NodeNotice, new: NodeNotice, stands: bool) -> None:
    assert interruption.mark_stands(old, new, NOW) is stands


def test_opted_out_workloads_are_left_alone() -> None:
    _nodes, _pods, wls = cluster()
    wls[0] = deployment("web", 4, **{"spotguard.io/enabled": "false"})
    plan = make_plan([notice("i-s1")], workloads=wls)
    assert "web" not in by_name(plan)
    assert any("web" in s for s in plan.skipped)


def test_match_by_resolved_dns_name() -> None:
    nodes = [node("ip-10-0-0-1.ec2.internal", instance="")]
    nodes = [dataclasses.replace(nodes[0], provider_id="")]
    plan = interruption.plan(
        [notice("i-abc")],
        nodes=nodes,
        pods=[],
        workloads=[],
        config=CFG,
        now=NOW,
        resolved={"i-abc": "ip-10-0-0-1.ec2.internal"},
    )
    assert plan.notices[0].node == "ip-10-0-0-1.ec2.internal"
    assert [t.node for t in plan.taints] == ["ip-10-0-0-1.ec2.internal"]


def test_surge_raises_the_floor() -> None:
    web = deployment("web", 6)
    assert floors.floor_for(web, CFG).on_demand == 1
    rec = SurgeRecord(replicas=4, surge=2, nodes=("s1",), started=NOW)
    f = floors.floor_for(with_surge(web, rec.to_json()), CFG)
    assert (f.on_demand, f.surge, f.source) == (3, 2, "default")
    done = dataclasses.replace(rec, surge=0, done=True)
    assert floors.floor_for(with_surge(web, done.to_json()), CFG).on_demand == 1
    assert floors.floor_for(with_surge(web, "{not json"), CFG).on_demand == 1
    assert floors.floor_for(with_surge(deployment("w", 2), rec.to_json()), CFG).on_demand == 2  # clamped


@pytest.mark.parametrize("text", ["", "[]", "{}", '{"replicas": "x", "surge": 1}', '{"replicas": 1}', "nope"])
def test_unreadable_records_are_none(text) -> None:
    assert SurgeRecord.parse(text) is None


# --- scaling back ---------------------------------------------------------------


def surged_web(nodes=("s1",), surge=2, replicas=6, started=NOW, **kw):
    rec = SurgeRecord(replicas=replicas - surge, surge=surge, events=("ev-1",), nodes=nodes, started=started, **kw)
    return with_surge(deployment("web", replicas), rec.to_json())


def test_finish_waits_while_doomed_pods_are_ready() -> None:
    web = surged_web()
    nodes = [node("s1"), node("od1", "on-demand")]
    pods = [pod(web, i, "s1") for i in range(2)] + [pod(web, i, "od1") for i in range(2, 6)]
    done, waiting = interruption.finish(workloads=[web], pods=pods, nodes=nodes, now=NOW + 30)
    assert done == [] and "still Ready" in waiting[0].reason


def test_finish_waits_for_the_replacements() -> None:
    web = surged_web()
    nodes = [node("od1", "on-demand")]
    pods = [pod(web, i, "od1", ready=i < 5) for i in range(2, 6)]
    done, waiting = interruption.finish(workloads=[web], pods=pods, nodes=nodes, now=NOW + 30)
    assert done == [] and "3 of 4" in waiting[0].reason


def test_finish_scales_back_keeping_the_users_change() -> None:
    web = surged_web(replicas=9)  # the user scaled 6 -> 9 during the surge (4 + 2 -> 7 + 2)
    nodes = [node("od1", "on-demand")]
    pods = [pod(web, i, "od1") for i in range(9)]
    done, _ = interruption.finish(workloads=[web], pods=pods, nodes=nodes, now=NOW + 30)
    assert [(f.replicas, f.remove, f.scale) for f in done] == [(7, True, True)]


def test_a_rebalance_surge_whose_node_a_reclaim_followed_waits_for_the_reclaim() -> None:
    """The record still says rebalance (the interruption's write to the workload failed and is
    retried), but the node's mark says the reclaim comes at +200 s: past the rebalance's end
    (+120 s) the surge waits while the doomed pods serve, instead of ending and leaving them
    to die with the node."""
    web = surged_web(until=(("s1", NOW + 120),), rebalance=("s1",))
    nodes = [node("s1"), node("od1", "on-demand")]
    pods = [pod(web, i, "s1") for i in range(2)] + [pod(web, i, "od1") for i in range(2, 6)]
    done, _ = interruption.finish(workloads=[web], pods=pods, nodes=nodes, now=NOW + 130)
    assert [f.reason for f in done] == ["replacements Ready and the doomed pods gone"]  # no mark: ends
    reclaim = {"s1": _mark(NoticeKind.INTERRUPTION, NOW + 200, "ev-2", NOW + 80)}
    done, waiting = interruption.finish(workloads=[web], pods=pods, nodes=nodes, now=NOW + 130, marks=reclaim)
    assert done == [] and "still Ready on doomed nodes" in waiting[0].reason
    still_rebalance = {"s1": _mark(NoticeKind.REBALANCE, NOW + 120, "rb-1")}
    done, _ = interruption.finish(workloads=[web], pods=pods, nodes=nodes, now=NOW + 130, marks=still_rebalance)
    assert len(done) == 1
    # Past the reclaim its pods serve nothing: the surge ends on its replacements.
    done, _ = interruption.finish(workloads=[web], pods=pods, nodes=nodes, now=NOW + 201, marks=reclaim)
    assert [f.replicas for f in done] == [4]


def test_a_surge_held_by_a_reclaim_mark_is_not_reported_overdue() -> None:
    """The alert reads the deadline the scale back holds the surge to: a rebalance's surge
    whose node has a reclaim's mark is not overdue until the reclaim (+200 s)."""
    web = surged_web(until=(("s1", NOW + 120),), rebalance=("s1",))
    record = SurgeRecord.of(web)
    assert record is not None
    reclaim = {"s1": _mark(NoticeKind.INTERRUPTION, NOW + 200, "ev-2", NOW + 80)}
    assert interruption.deadline_passed(record, NOW + 130) is True  # the record alone
    assert interruption.deadline_passed(record, NOW + 130, marks=reclaim) is False
    assert interruption.deadline_passed(record, NOW + 200, marks=reclaim) is True
    still_rebalance = {"s1": _mark(NoticeKind.REBALANCE, NOW + 120, "rb-1")}
    assert interruption.deadline_passed(record, NOW + 130, marks=still_rebalance) is True


def test_only_a_rebalance_surge_whose_node_lives_is_left_to_the_spot_interruption_function() -> None:
    rebalance = SurgeRecord.of(surged_web(until=(("s1", NOW + 120),), rebalance=("s1",)))
    reclaim = SurgeRecord.of(surged_web())
    assert rebalance is not None and reclaim is not None
    assert interruption.rebalance_node_lives(rebalance, {"s1", "od1"}) is True
    assert interruption.rebalance_node_lives(rebalance, {"od1"}) is False  # the node is gone
    assert interruption.rebalance_node_lives(reclaim, {"s1", "od1"}) is False  # not a rebalance's


def test_finish_while_the_node_exists_keeps_a_done_record() -> None:
    web = surged_web(budget="spotguard-surge-web")
    nodes = [node("s1"), node("od1", "on-demand")]
    pods = [pod(web, i, "s1", ready=False) for i in range(2)] + [pod(web, i, "od1") for i in range(2, 6)]
    done, _ = interruption.finish(workloads=[web], pods=pods, nodes=nodes, now=NOW + 30)
    assert [(f.replicas, f.remove, f.budget) for f in done] == [(4, False, "spotguard-surge-web")]
    kept = interruption.finished_record(done[0].record)
    assert kept.done and kept.surge == 0 and kept.nodes == ("s1",)
    # A replay of the same notice on the scaled-back workload does nothing...
    back = with_surge(deployment("web", 4), kept.to_json())
    plan = interruption.plan([notice("i-s1")], nodes=nodes, pods=pods, workloads=[back], config=CFG, now=NOW + 40)
    assert plan.surges[0].added == 0
    # ...and once the node is gone the done record is removed, without scaling.
    done, _ = interruption.finish(workloads=[back], pods=[], nodes=[node("od1", "on-demand")], now=NOW + 200)
    assert [(f.remove, f.scale) for f in done] == [(True, False)]


def test_finish_restores_the_autoscaler() -> None:
    web = surged_web(hpa="web", hpa_min=2, hpa_max=5)
    hpa = [Autoscaler("shop", "web", "Deployment", "web", min_replicas=6, max_replicas=6)]
    pods = [pod(web, i, "od1") for i in range(4)]
    done, _ = interruption.finish(
        workloads=[web], pods=pods, nodes=[node("od1", "on-demand")], now=NOW + 30, autoscalers=hpa
    )
    assert [(f.hpa_min, f.hpa_max) for f in done] == [(2, 5)]
    user_changed = [Autoscaler("shop", "web", "Deployment", "web", min_replicas=3, max_replicas=10)]
    done, _ = interruption.finish(
        workloads=[web], pods=pods, nodes=[node("od1", "on-demand")], now=NOW + 30, autoscalers=user_changed
    )
    assert [(f.hpa_min, f.hpa_max) for f in done] == [(None, 5)]


def test_an_old_surge_ends_even_with_doomed_pods_ready() -> None:
    web = surged_web()
    pods = [pod(web, i, "s1") for i in range(2)]
    done, _ = interruption.finish(
        workloads=[web],
        pods=pods,
        nodes=[node("s1")],
        now=NOW + interruption.SURGE_MAX_SECONDS + interruption.REPLACEMENT_GRACE + 1,
    )
    assert len(done) == 1 and "older than its deadline" in done[0].reason


def test_selector_semantics() -> None:
    m = interruption.selector_matches
    assert m({}, {"a": "b"}) and not m(None, {"a": "b"})
    assert m({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["x"]}]}, {})
    assert not m({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, {})
    assert m({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}, {"b": "1"})
    assert not m({"matchExpressions": [{"key": "a", "operator": "Bogus"}]}, {"a": "1"})


def test_taint_view_is_recognised() -> None:
    n = node("s1")
    assert not interruption.has_interruption_taint(n)
    n = dataclasses.replace(n, taints=(Taint(INTERRUPTION_TAINT, "e", "NoSchedule"),))
    assert interruption.has_interruption_taint(n)


# --- the owner's count, deadlines, new notices, draining -------------------------------


@pytest.mark.parametrize(
    ("current", "expected"),
    [
        (9, 6),  # untouched since spotguard wrote it: the count before the surge
        (6, 6),  # a GitOps revert to the manifest
        (3, 3),  # scaled down by a person
        (11, 8),  # scaled up by 2 (a person or an autoscaler): 6 + 2
        (0, 0),  # the owner scaled to zero: theirs
    ],
)
def test_owner_replicas(current, expected) -> None:
    rec = SurgeRecord(replicas=6, surge=3, written=9)
    assert interruption.owner_replicas(rec, current) == expected


def test_finish_scales_back_to_the_owners_count_after_a_revert() -> None:
    rec = SurgeRecord(replicas=6, surge=3, written=9, nodes=("s1",), started=NOW, until=(("s1", NOW + 120),))
    web = with_surge(deployment("web", 6), rec.to_json())  # reverted to 6 by GitOps
    pods = [pod(web, i, "od1") for i in range(6)]
    done, _ = interruption.finish(workloads=[web], pods=pods, nodes=[node("od1", "on-demand")], now=NOW + 30)
    assert [f.replicas for f in done] == [6]


def test_finish_ends_once_the_node_is_past_its_reclaim_time_whatever_the_api_says() -> None:
    rec = SurgeRecord(replicas=4, surge=2, written=6, nodes=("s1",), started=NOW, until=(("s1", NOW + 120),))
    web = with_surge(deployment("web", 6), rec.to_json())
    # The node is dead but the API still shows it and its pods Ready (a real cluster does, ~40 s).
    pods = [pod(web, i, "s1") for i in range(2)] + [pod(web, i, "od1") for i in range(2, 6)]
    nodes = [node("s1"), node("od1", "on-demand")]
    done, waiting = interruption.finish(workloads=[web], pods=pods, nodes=nodes, now=NOW + 100)
    assert done == [] and "still Ready" in waiting[0].reason
    done, _ = interruption.finish(workloads=[web], pods=pods, nodes=nodes, now=NOW + 121)
    assert [f.replicas for f in done] == [4]


def test_a_new_event_id_surges_again_after_a_finished_record() -> None:
    _nodes, _pods, wls = cluster()
    old = SurgeRecord(replicas=4, surge=0, events=("rbl-1",), nodes=("s1",), started=NOW - 1000, done=True)
    wls[0] = with_surge(wls[0], old.to_json())
    replay = by_name(make_plan([notice("i-s1", "rbl-1")], workloads=wls))["web"]
    assert replay.added == 0 and not replay.write_workload
    fresh = by_name(make_plan([notice("i-s1", "itn-2")], workloads=wls))["web"]
    assert fresh.added == 2 and fresh.record.events == ("itn-2",) and not fresh.record.done


def test_an_interruption_takes_over_a_rebalance_surge_with_its_own_deadline() -> None:
    cfg = dataclasses.replace(CFG, rebalance_action=config.RebalanceAction.SURGE)
    first = by_name(make_plan([notice("i-s1", "rb-1", NoticeKind.REBALANCE)], config=cfg))["web"]
    _nodes, _pods, wls = cluster()
    wls[0] = with_surge(deployment("web", first.replicas), first.record.to_json())
    later = by_name(make_plan([notice("i-s1", "itn-1")], workloads=wls, config=cfg))["web"]
    assert later.added == 0 and later.write_workload
    assert "itn-1" in later.record.events
    t0 = interruption.notice_time(notice("i-s1"), NOW)
    assert dict(later.record.until)["s1"] == t0 + 120 < dict(first.record.until)["s1"]


def test_a_stale_interruption_is_ignored() -> None:
    t = notice("i-s1").time.timestamp()
    on_time = interruption.plan([notice("i-s1")], nodes=cluster()[0], pods=[], workloads=[], config=CFG, now=t + 100)
    assert on_time.notices[0].verdict is Verdict.DOOMED
    late = t + 120 + interruption.STALE_SECONDS + 1
    plan = interruption.plan([notice("i-s1")], nodes=cluster()[0], pods=[], workloads=[], config=CFG, now=late)
    assert plan.notices[0].verdict is Verdict.IGNORED


def test_evictions_keep_the_ready_count_from_before_the_notice() -> None:
    rec = SurgeRecord(replicas=4, surge=2, written=6, nodes=("s1",), started=NOW, until=(("s1", NOW + 120),), ready=4)
    web = with_surge(deployment("web", 6), rec.to_json())
    nodes = [node("s1"), node("od1", "on-demand")]
    doomed = [pod(web, i, "s1") for i in range(2)]
    # One replacement Ready: one doomed pod may go.
    pods = [*doomed, pod(web, 2, "od1"), pod(web, 3, "od1"), pod(web, 4, "od1"), pod(web, 5, "od1", ready=False)]
    assert len(interruption.evictions(workloads=[web], pods=pods, nodes=nodes, now=NOW + 10)) == 1
    # Both Ready: both go; past the reclaim time: nothing to evict.
    pods[-1] = pod(web, 5, "od1")
    assert len(interruption.evictions(workloads=[web], pods=pods, nodes=nodes, now=NOW + 10)) == 2
    assert interruption.evictions(workloads=[web], pods=pods, nodes=nodes, now=NOW + 121) == []


def test_an_autoscaler_that_undid_the_surge_before_its_minimum_was_raised_is_overruled() -> None:
    rec = SurgeRecord(replicas=4, surge=2, written=6, events=("ev-1",), nodes=("s1",), started=NOW)
    hpa = [Autoscaler("shop", "web", "Deployment", "web", min_replicas=4, max_replicas=8)]
    web = with_surge(deployment("web", 4), rec.to_json())  # the autoscaler scaled it back to 4
    step = by_name(make_plan([notice("i-s1")], workloads=[web], autoscalers=hpa))["web"]
    assert (step.replicas, step.record.replicas, step.write_workload) == (6, 4, True)
    assert step.autoscaler == interruption.AutoscalerStep("web", 6, 8, interruption.restore_key(rec))
    # With its minimum raised, a lower count is someone else's choice: theirs.
    raised = [Autoscaler("shop", "web", "Deployment", "web", min_replicas=6, max_replicas=8)]
    three = with_surge(deployment("web", 3), dataclasses.replace(rec, hpa="web", hpa_min=4, hpa_set=6).to_json())
    step = by_name(make_plan([notice("i-s1")], workloads=[three], autoscalers=raised))["web"]
    assert step.record.replicas == 3


def test_a_rise_to_the_autoscaler_minimum_spotguard_set_is_not_the_owners_change() -> None:
    # A replace rebased the surge at the owner's 6 while the autoscaler's minimum stayed at the
    # 9 spotguard set; the autoscaler then brought the count back to 9. That rise is spotguard's
    # own minimum at work: the count to go back to stays 6 (found by the replace test: the
    # scale back went to 9 and only the autoscaler's next write brought it to 6).
    rec = SurgeRecord(
        replicas=6, surge=3, written=6, events=("ev-1",), nodes=("s1",), started=NOW, hpa="web", hpa_min=6, hpa_set=9
    )
    held = [Autoscaler("shop", "web", "Deployment", "web", min_replicas=9, max_replicas=12)]
    web = with_surge(deployment("web", 9), rec.to_json())
    step = by_name(make_plan([notice("i-s1")], workloads=[web], autoscalers=held))["web"]
    assert (step.replicas, step.record.replicas, step.record.written) == (9, 6, 9)
    pods = [pod(web, i, "od1") for i in range(9)]
    done, _ = interruption.finish(
        workloads=[web], pods=pods, nodes=[node("od1", "on-demand")], now=NOW + 30, autoscalers=held
    )
    assert [(f.replicas, f.hpa_min) for f in done] == [(6, 6)]
    # The user set another minimum meanwhile: theirs, and a rise to it is theirs too.
    theirs = [Autoscaler("shop", "web", "Deployment", "web", min_replicas=8, max_replicas=12)]
    done, _ = interruption.finish(
        workloads=[with_surge(deployment("web", 8), rec.to_json())],
        pods=pods,
        nodes=[node("od1", "on-demand")],
        now=NOW + 30,
        autoscalers=theirs,
    )
    assert [(f.replicas, f.hpa_min) for f in done] == [(8, None)]


def hpa_json(min_replicas: int, max_replicas: int, **annotations: str) -> dict:
    return {
        "metadata": {"namespace": "shop", "name": "web", "annotations": annotations},
        "spec": {
            "scaleTargetRef": {"kind": "Deployment", "name": "web"},
            "minReplicas": min_replicas,
            "maxReplicas": max_replicas,
        },
    }


def test_an_autoscaler_raise_that_failed_leaves_spotguards_earlier_minimum_which_is_restored() -> None:
    # Found by the chaos suite under timeouts: a second notice's surge wrote its record (the
    # minimum to be 5) and then its autoscaler raise timed out, so the autoscaler still held
    # the 4 of spotguard's first raise. The scale back took that 4 for the user's and left it.
    first = SurgeRecord(
        replicas=3, surge=1, written=4, events=("ev-1",), nodes=("s1",), started=NOW, hpa="web", hpa_min=3, hpa_set=4
    )
    # The first raise wrote the limits it set on the autoscaler too.
    set_min, set_max = interruption.HPA_SET_MIN, interruption.HPA_SET_MAX
    at_four = [Autoscaler.from_json(hpa_json(4, 8, **{set_min: "4", set_max: "8"}))]
    web = with_surge(deployment("web", 4), first.to_json())
    nodes = [node("s1"), node("s2"), node("od1", "on-demand")]
    pods = [pod(web, 0, "s1"), pod(web, 1, "s2")] + [pod(web, i, "od1") for i in range(2, 4)]
    step = by_name(make_plan([notice("i-s2")], nodes=nodes, pods=pods, workloads=[web], autoscalers=at_four))["web"]
    assert step.autoscaler == interruption.AutoscalerStep("web", 5, 8)
    assert (step.record.hpa_min, step.record.hpa_set) == (3, 5)
    # The record is written; the raise to 5 fails: the autoscaler holds 4 still.
    surged = with_surge(deployment("web", 5), step.record.to_json())
    # A redelivery plans again: 3 stays the minimum to put back, 5 the one to raise to.
    again = by_name(make_plan([notice("i-s2")], nodes=nodes, pods=pods, workloads=[surged], autoscalers=at_four))["web"]
    assert (again.record.hpa_min, again.autoscaler) == (3, interruption.AutoscalerStep("web", 5, 8))
    # The nodes go: the autoscaler is put back to 3 and the workload to its owner's 3.
    serving = [pod(surged, i, "od1") for i in range(6)]
    done, _ = interruption.finish(
        workloads=[surged], pods=serving, nodes=[node("od1", "on-demand")], now=NOW + 200, autoscalers=at_four
    )
    assert [(f.hpa_min, f.replicas) for f in done] == [(3, 3)]
    # A minimum the user set meanwhile (neither of spotguard's values) is still theirs, even
    # the value of an earlier raise of spotguard's once the autoscaler records a later one.
    for users in (hpa_json(6, 8, **{set_min: "4"}), hpa_json(4, 8, **{set_min: "5"})):
        done, _ = interruption.finish(
            workloads=[surged],
            pods=serving,
            nodes=[node("od1", "on-demand")],
            now=NOW + 200,
            autoscalers=[Autoscaler.from_json(users)],
        )
        theirs = users["spec"]["minReplicas"]
        assert [(f.hpa_min, f.replicas) for f in done] == [(None, theirs)]


def test_a_drained_nodes_pods_go_with_the_scale_back_once_the_replacements_are_ready() -> None:
    """Karpenter evicted a consolidated node's pods once the guard let them go; each evicted
    pod's ReplicaSet, still at the surged count, created one more pod, and Karpenter launched
    a node for it (the demo with a drainer: a node every consolidation, removed again once the
    surge was over: the return to spot never settled). With the replacements Ready, the surge
    ends while the drained pods still serve, and they are the ones its scale back removes."""
    web = surged_web(nodes=("od2",))
    nodes = [node("od1", "on-demand"), node("od2", "on-demand")]
    pods = [pod(web, i, "od2") for i in range(2)] + [pod(web, i, "od1") for i in range(2, 6)]
    drain = {"od2": NodeNotice(event_id="drain/od2/1", kind=NoticeKind.DRAIN, time=NOW, until=NOW + 300)}
    done, waiting = interruption.finish(workloads=[web], pods=pods, nodes=nodes, now=NOW + 30, marks=drain)
    assert waiting == []
    assert [(f.replicas, f.remove, f.scale, f.reason) for f in done] == [
        (4, False, True, "replacements Ready: the drained pods go with the scale back")]
    # the replacements not all Ready yet: it waits as before
    pods[-1] = pod(web, 5, "od1", ready=False)
    done, waiting = interruption.finish(workloads=[web], pods=pods, nodes=nodes, now=NOW + 30, marks=drain)
    assert done == [] and "still Ready on doomed nodes" in waiting[0].reason
    # a node being reclaimed (an interruption's mark) keeps its pods serving until the reclaim
    pods[-1] = pod(web, 5, "od1")
    reclaim = {"od2": _mark(NoticeKind.INTERRUPTION, NOW + 120)}
    done, waiting = interruption.finish(workloads=[web], pods=pods, nodes=nodes, now=NOW + 30, marks=reclaim)
    assert done == [] and "still Ready on doomed nodes" in waiting[0].reason


def test_a_retried_handling_does_not_raise_the_limits_a_surges_end_has_put_back() -> None:
    """A surge's end put api's minimum back (3) and failed at its next write (the budget's
    delete, a 500); a retried notice then read the surge still running and the minimum
    below the surged count, and raised it again (5); the end, retried, found nothing of
    its own to restore and scaled back to 3: the autoscaler brought api back to 5 for good
    (consolidation-after-reclaim under 20 % 500s). The end marks the autoscaler it puts
    back (same patch): a handling of that surge leaves it alone."""
    rec = SurgeRecord(replicas=3, surge=2, written=5, events=("ev-1",), nodes=("s1",), started=NOW, hpa="web",
                      hpa_min=3, hpa_set=5)
    web = with_surge(deployment("web", 5), rec.to_json())
    put_back = [Autoscaler("shop", "web", "Deployment", "web", min_replicas=3, max_replicas=8,
                           restored=interruption.restore_key(rec))]
    step = by_name(make_plan([notice("i-s1")], workloads=[web], autoscalers=put_back))["web"]
    assert step.autoscaler is None
    # a user's lowering (no end's mark, or another surge's) is raised over, as before
    for hpa in (dataclasses.replace(put_back[0], restored=""), dataclasses.replace(put_back[0], restored="1.000")):
        step = by_name(make_plan([notice("i-s1")], workloads=[web], autoscalers=[hpa]))["web"]
        assert step.autoscaler == interruption.AutoscalerStep("web", 5, 8)
        assert step.autoscaler.surge == interruption.restore_key(rec)
    # the mark is read from the autoscaler as written
    raw = hpa_json(3, 8, **{interruption.HPA_RESTORED: interruption.restore_key(rec)})
    assert Autoscaler.from_json(raw).restored == interruption.restore_key(rec)
