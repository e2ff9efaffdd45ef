"""A surge's life (spotguard.policy.surgelife): each transition of its state machine, the
steps of its end (spotguard.policy.unwind) and the rules that rank the pods first to go."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any

import pytest
from spotguard.policy import config, interruption, surgelife, unwind
from spotguard.policy.interruption import Autoscaler, Finish
from spotguard.policy.moves import DOOMED_FIRST, SURGE_FIRST
from spotguard.policy.notices import NodeNotice, NoticeKind
from spotguard.policy.surgelife import Event, LifeFacts, SurgeState
from spotguard.policy.surges import LOST, SurgeRecord
from spotguard.policy.views import PodView
from spotguard.policy.workloads import (
    DELETION_COST,
    DO_NOT_DISRUPT,
    SURGE,
    SURGE_PROTECTED,
    SURGE_REPLICA,
    Workload,
)

from tests.interruption.cluster_builders import T0, deployment, node, notice, pod, with_surge

T = 1000.0  # the last doomed node's deadline
S, E = SurgeState, Event


def facts(**kw: Any) -> LifeFacts:
    base: dict[str, Any] = {
        "held": False,
        "over": False,
        "doomed_ready": 2,  # two of four still Ready on the doomed node
        "drained_only": False,
        "ready_elsewhere": 4,
        "target": 4,
        "lost": False,
        "copy": False,
        "last_deadline": T,
        "now": T - 60,
    }
    base.update(kw)
    return LifeFacts(**base)


GONE = {"doomed_ready": 0, "now": T + 5}  # the doomed pods gone (or their node past its deadline)
SHORT = {**GONE, "ready_elsewhere": 3}  # ... and one replacement not Ready yet
GRACE = surgelife.REPLACEMENT_GRACE


@pytest.mark.parametrize(
    ("kw", "state", "event", "remove", "scale"),
    [
        # a notice: the record is written, doomed pods still serve -> the surge covers them
        ({}, S.COVERING, E.NOTICE, True, True),
        ({"copy": True}, S.COVERING, E.NOTICE, True, True),
        ({"lost": True}, S.COVERING, E.NOTICE, True, True),  # a replace while the doomed pods serve
        # the only pods left on doomed nodes are on nodes an autoscaler drains, replacements Ready:
        # they go with the scale back (the record stays, done: the nodes still exist)
        ({"drained_only": True}, S.UNWINDING, E.DRAINED_REPLACED, False, True),
        ({"drained_only": True, "ready_elsewhere": 3}, S.COVERING, E.NOTICE, True, True),
        ({"drained_only": True, "lost": True}, S.COVERING, E.NOTICE, True, True),
        ({"drained_only": True, "copy": True}, S.COVERING, E.NOTICE, True, True),
        # the doomed pods gone, the replacements not all Ready: it waits
        (SHORT, S.WAITING, E.DOOMED_PODS_GONE, True, True),
        ({**SHORT, "now": T + GRACE - 1}, S.WAITING, E.DOOMED_PODS_GONE, True, True),
        # replacements Ready: it unwinds; the record stays (done) while a doomed node exists
        (GONE, S.UNWINDING, E.REPLACEMENTS_READY, False, True),
        ({**GONE, "over": True}, S.UNWINDING, E.REPLACEMENTS_READY, True, True),
        # the owner lowered its count to what is Ready: replacements Ready sooner
        ({**GONE, "ready_elsewhere": 3, "target": 3}, S.UNWINDING, E.REPLACEMENTS_READY, False, True),
        # a copy's surge wrote no count of the owner's: nothing to scale back
        ({**GONE, "copy": True}, S.UNWINDING, E.REPLACEMENTS_READY, False, False),
        # 300 s past the last deadline without the replacements: it unwinds all the same
        ({**SHORT, "now": T + GRACE}, S.UNWINDING, E.GRACE_RAN_OUT, False, True),
        ({**SHORT, "now": T + 400, "over": True, "copy": True}, S.UNWINDING, E.GRACE_RAN_OUT, True, False),
        # the record lost to a replace: the replica surge ends at once at the owner's count ...
        ({**GONE, "lost": True, "ready_elsewhere": 0}, S.UNWINDING, E.RECORD_LOST, True, True),
        # ... the copy's surge (the copy was not undone) waits for the replacements as any other
        ({**GONE, "lost": True, "copy": True, "ready_elsewhere": 3}, S.WAITING, E.DOOMED_PODS_GONE, True, True),
        ({**GONE, "lost": True, "copy": True}, S.UNWINDING, E.REPLACEMENTS_READY, True, False),
        # a held record (scaled back while a doomed node existed): held until its nodes go
        ({"held": True}, S.HELD, E.UNWOUND, False, False),
        ({"held": True, "over": True}, S.UNWINDING, E.NODES_GONE, True, False),
    ],
)
def test_each_transition_of_a_surges_life(
    kw: dict[str, Any], state: SurgeState, event: Event, remove: bool, scale: bool
) -> None:
    step = surgelife.life_step(facts(**kw))
    assert (step.state, step.event) == (state, event), step.reason
    if state is S.UNWINDING:
        assert (step.remove, step.scale) == (remove, scale)


def test_the_reasons_say_why() -> None:
    assert surgelife.life_step(facts()).reason == "2 pods still Ready on doomed nodes"
    assert surgelife.life_step(facts(**GONE, ready_elsewhere=3)).reason == "3 of 4 replacements Ready"
    late = surgelife.life_step(facts(**{**GONE, "ready_elsewhere": 3, "now": T + 400}))
    assert late.reason == "surge older than its deadline by 300s"


# --- the machine as interruption.finish runs it ------------------------------------------

NOW = T0.timestamp()


def surged(replicas: int = 6, surge: int = 2, nodes: tuple[str, ...] = ("s1",), **kw: Any) -> Workload:
    rec = SurgeRecord(replicas=replicas - surge, surge=surge, events=("ev-1",), nodes=nodes, started=NOW, **kw)
    return with_surge(deployment("web", replicas), rec.to_json())


def test_finish_reports_each_surges_state_and_the_event_that_ended_it() -> None:
    web = surged()
    nodes = [node("s1"), node("od1", "on-demand")]
    serving = [pod(web, i, "s1") for i in range(2)] + [pod(web, i, "od1") for i in range(2, 5)]
    done, waiting = interruption.finish(workloads=[web], pods=serving, nodes=nodes, now=NOW + 30)
    assert done == [] and [w.state for w in waiting] == [S.COVERING]
    short = [pod(web, i, "od1") for i in range(2, 5)]
    done, waiting = interruption.finish(workloads=[web], pods=short, nodes=[node("od1", "on-demand")], now=NOW + 30)
    assert done == [] and [w.state for w in waiting] == [S.WAITING]
    ready = [pod(web, i, "od1") for i in range(2, 6)]
    done, _ = interruption.finish(workloads=[web], pods=ready, nodes=[node("od1", "on-demand")], now=NOW + 30)
    assert [(f.event, f.replicas, f.remove) for f in done] == [(E.REPLACEMENTS_READY, 4, True)]


def test_a_notice_starts_a_life_and_a_new_event_id_starts_another_after_a_held_record() -> None:
    cfg = config.Config()
    web = deployment("web", 4)
    nodes = [node("s1"), node("od1", "on-demand")]
    pods = [pod(web, 0, "s1"), pod(web, 1, "s1"), pod(web, 2, "od1"), pod(web, 3, "od1")]
    plan = interruption.plan([notice("i-s1", "ev-1")], nodes=nodes, pods=pods, workloads=[web], config=cfg, now=NOW)
    record = plan.surges[0].record
    started = with_surge(deployment("web", plan.surges[0].replicas), record.to_json())
    _, waiting = interruption.finish(workloads=[started], pods=pods, nodes=nodes, now=NOW + 10)
    assert [w.state for w in waiting] == [S.COVERING]  # NOTICE: the surge covers the doomed pods
    held = with_surge(deployment("web", 4), interruption.finished_record(record).to_json())
    done, waiting = interruption.finish(workloads=[held], pods=pods, nodes=nodes, now=NOW + 10)
    assert (done, waiting) == ([], [])  # HELD: neither over nor waiting
    replay = interruption.plan([notice("i-s1", "ev-1")], nodes=nodes, pods=pods, workloads=[held], config=cfg, now=NOW)
    assert replay.surges[0].added == 0  # the same notice again changes nothing
    again = interruption.plan([notice("i-s1", "ev-2")], nodes=nodes, pods=pods, workloads=[held], config=cfg, now=NOW)
    assert again.surges[0].added == 2 and not again.surges[0].record.done  # a new notice: COVERING again


# --- the steps of the end --------------------------------------------------------------


def web_pod(index: int, node_name: str, **kw: Any) -> PodView:
    return dataclasses.replace(pod(deployment("web", 1), index, node_name), **kw)


def at(seconds: float) -> str:
    return datetime.fromtimestamp(NOW + seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


PROTECTED = {SURGE_PROTECTED: DO_NOT_DISRUPT, DO_NOT_DISRUPT: "true"}


def end(wl: Workload, replicas: int, **kw: Any) -> Finish:
    record = SurgeRecord.of(wl)
    assert record is not None
    base: dict[str, Any] = {"hpa_min": None, "hpa_max": None, "budget": "", "reason": "replacements Ready"}
    base.update(kw)
    return Finish(wl, record, replicas, **base)


def kinds(steps: list[unwind.Step]) -> list[str]:
    return [type(s).__name__ for s in steps]


def test_the_replica_surges_end_in_order() -> None:
    web = surged(hpa="web", hpa_min=4, hpa_max=8, budget="spotguard-surge-web")
    pods = [
        web_pod(0, "s1"),  # dead: first to go
        web_pod(1, "od1", annotations={SURGE_REPLICA: "true", **PROTECTED}),  # a surge replica
        web_pod(2, "od1"),
        web_pod(3, "od1"),
        web_pod(4, "od1", annotations=PROTECTED),
        web_pod(5, "od1", terminating=True, annotations=PROTECTED),  # going: left alone
    ]
    fin = end(web, 4, hpa_min=4, hpa_max=8, budget="spotguard-surge-web")
    steps = unwind.steps(fin, pods, {}, surge_copy=False)
    assert kinds(steps) == ["RankFirstToGo", "EndProtection", "RestoreAutoscaler", "DeleteBudget", "WriteBack"]
    rank, protection, hpa, budget, write = steps
    assert isinstance(rank, unwind.RankFirstToGo) and isinstance(protection, unwind.EndProtection)
    assert [(p.name, dict(c)) for p, c in rank.changes] == [
        ("web-abc12-00000", {DELETION_COST: str(DOOMED_FIRST)}),
        ("web-abc12-00001", {DELETION_COST: str(SURGE_FIRST)}),
    ]
    assert [p.name for p, _ in protection.changes] == ["web-abc12-00001", "web-abc12-00004"]
    assert dict(protection.changes[0][1]) == {SURGE_PROTECTED: None, DO_NOT_DISRUPT: None}
    assert hpa == unwind.RestoreAutoscaler(fin.record, 4, 8)
    assert budget == unwind.DeleteBudget("spotguard-surge-web")
    assert write == unwind.WriteBack(4, None)


def test_the_copys_end_deletes_the_copy_and_its_record_last_and_scales_nothing_back() -> None:
    """The copy carries the record: it goes last, after the budget (a failure before it leaves
    the record, finished again), and the Deployment is not written."""
    web = surged(replicas=4, surge=2, copy=True, budget="spotguard-surge-web")
    fin = dataclasses.replace(end(web, 4, budget="spotguard-surge-web"), scale=False)
    steps = unwind.steps(fin, [web_pod(0, "s1"), web_pod(1, "od1")], {}, surge_copy=True, on_workload=False)
    assert steps == [
        unwind.DeleteBudget("spotguard-surge-web"),
        unwind.DeleteCopy("spotguard-surge-web", "replacements Ready"),
    ]


def test_a_held_copy_end_keeps_the_done_record_on_the_copy_at_zero() -> None:
    web = surged(replicas=4, surge=2, copy=True)
    fin = dataclasses.replace(end(web, 4), scale=False, remove=False)
    steps = unwind.steps(fin, [], {}, surge_copy=True, on_workload=False)
    assert steps == [unwind.HoldCopy("spotguard-surge-web", interruption.finished_record(fin.record))]


def test_a_copy_surge_whose_record_is_still_on_the_deployment_removes_it_first() -> None:
    """A surge begun before the record moved to the copy: the Deployment's record is removed
    (or kept done) before the copy goes, so nothing of the surge is left on the Deployment."""
    web = surged(replicas=4, surge=2, copy=True)
    fin = dataclasses.replace(end(web, 4), scale=False)
    steps = unwind.steps(fin, [], {}, surge_copy=True, on_workload=True)
    assert steps == [unwind.WriteBack(None, None), unwind.DeleteCopy("spotguard-surge-web", "replacements Ready")]
    held = dataclasses.replace(fin, remove=False)
    keep = interruption.finished_record(fin.record)
    assert unwind.steps(held, [], {}, surge_copy=True, on_workload=True) == [
        unwind.WriteBack(None, keep),
        unwind.HoldCopy("spotguard-surge-web", keep),
    ]


def test_a_held_end_keeps_a_done_record_and_ranks_nothing_already_ranked() -> None:
    web = surged()
    fin = dataclasses.replace(end(web, 4), remove=False)
    ranked = [web_pod(0, "s1", annotations={DELETION_COST: str(DOOMED_FIRST)}), web_pod(1, "od1")]
    steps = unwind.steps(fin, ranked, {}, surge_copy=False)
    assert steps == [unwind.WriteBack(4, interruption.finished_record(fin.record))]


@pytest.mark.parametrize(
    ("surge_copy", "replicas_now", "to", "last"),
    [
        (False, 4, 4, unwind.DropLedgerEntry()),  # a replace at the owner's count: nothing to write
        (False, 6, 4, unwind.WriteBack(4, None)),  # a replace above it: scaled back
        # the copy's: the owner's count was never written; the copy (if any) goes with the record
        (True, 6, 6, unwind.DeleteCopy("spotguard-surge-web", "lost")),
    ],
)
def test_a_lost_records_end(surge_copy: bool, replicas_now: int, to: int, last: unwind.Step) -> None:
    rec = SurgeRecord(replicas=4, surge=2, events=("ev-1",), nodes=("s1",), started=NOW, lost=True)
    wl = deployment("web", replicas_now)
    fin = Finish(wl, rec, to, None, None, "", "lost", True, not surge_copy)
    assert unwind.steps(fin, [], {}, surge_copy=surge_copy)[-1] == last


def test_a_conflict_on_the_last_write_decides_again_on_the_workload_read_anew() -> None:
    nodes = [node("od1", "on-demand")]
    web = surged(hpa="web", hpa_min=4)
    ready = [pod(web, i, "od1") for i in range(6)]
    fin = end(web, 4, hpa_min=4)
    # Someone scaled the workload to 9 meanwhile: the end keeps their change, restores no autoscaler.
    fresh = dataclasses.replace(web, replicas=9)
    more = [pod(web, i, "od1") for i in range(9)]
    again = unwind.again(fresh, fin, pods=more, nodes=nodes, now=NOW + 30, marks={}, surge_copy=False)
    assert again is not None and (again.replicas, again.hpa_min, again.hpa_max) == (7, None, None)
    assert unwind.write_back(again) == unwind.WriteBack(7, None)
    # The record was lost (only the ledger has it) and the workload read anew lacks it too.
    lost = dataclasses.replace(fin, record=dataclasses.replace(fin.record, lost=True))
    bare = deployment("web", 6)
    again = unwind.again(bare, lost, pods=ready, nodes=nodes, now=NOW + 30, marks={}, surge_copy=False)
    assert again is not None and again.event is E.RECORD_LOST and again.workload.annotations[LOST] == "true"
    assert SURGE in again.workload.annotations
    # Read anew, the surge is not over (a doomed pod serves again): nothing is written.
    serving = [*ready, pod(web, 9, "s1")]
    nodes_now = [node("s1"), *nodes]
    assert unwind.again(web, fin, pods=serving, nodes=nodes_now, now=NOW + 30, marks={}, surge_copy=False) is None


def hpa(min_replicas: int, max_replicas: int) -> Autoscaler:
    return Autoscaler("shop", "web", "Deployment", "web", min_replicas, max_replicas)


@pytest.mark.parametrize(
    ("fresh", "want"),
    [
        (hpa(6, 8), (4, 8)),  # still spotguard's values: restored
        (hpa(5, 8), (None, 8)),  # the user changed the minimum meanwhile: theirs
        (hpa(6, 10), (4, None)),
        (hpa(5, 10), (None, None)),
    ],
)
def test_a_conflict_on_the_autoscaler_leaves_the_users_changes(fresh: Autoscaler, want: tuple[Any, Any]) -> None:
    rec = SurgeRecord(replicas=4, surge=2, hpa="web", hpa_min=4, hpa_max=8, hpa_set=6, hpa_max_set=8)
    assert unwind.limits_after_conflict(rec, fresh, 4, 8) == want


# --- the pods that go first ------------------------------------------------------------


def mark(kind: NoticeKind, action: str = "terminate") -> NodeNotice:
    return NodeNotice(event_id="ev", kind=kind, time=NOW, until=NOW + 120, action=action)


INT, REB = NoticeKind.INTERRUPTION, NoticeKind.REBALANCE


@pytest.mark.parametrize(
    ("rebalance", "node_mark", "dead"),
    [
        # an older record (no rebalance list): the node's own notice tells
        (None, None, True),  # the node's mark gone (the node is gone)
        (None, mark(INT), True),
        (None, mark(INT, "stop"), False),  # a stopped instance may start again
        (None, mark(INT, ""), True),
        (None, mark(REB), False),  # a rebalance recommendation's node lives on
        # the record names the node for a rebalance: dead only where a reclaim's mark came since
        (("s1",), None, False),
        (("s1",), mark(REB), False),
        (("s1",), mark(INT), True),
        (("s1",), mark(INT, "hibernate"), False),
        # the record says an interruption took over the node: dead, whatever its mark still says
        (("s2",), None, True),
        (("s2",), mark(REB), True),  # the interruption's taint write failed, and is retried
        (("s2",), mark(INT), True),
        (("s2",), mark(INT, "stop"), False),
    ],
)
def test_which_doomed_nodes_are_dead_at_the_end(
    rebalance: tuple[str, ...] | None, node_mark: NodeNotice | None, dead: bool
) -> None:
    rec = SurgeRecord(replicas=4, surge=2, nodes=("s1",), started=NOW, rebalance=rebalance)
    assert unwind.dies(rec, "s1", {} if node_mark is None else {"s1": node_mark}) is dead


@pytest.mark.parametrize(
    ("annotations", "created", "ours"),
    [
        ({SURGE_REPLICA: "true"}, "", True),  # marked by the webhook
        ({}, at(0), True),  # created since the surge began (the webhook let it through unmarked)
        ({}, at(-1), False),  # older than the surge
        ({}, "", False),  # unknown age, unmarked
    ],
)
def test_which_pods_are_the_surges_own(annotations: dict[str, str], created: str, ours: bool) -> None:
    rec = SurgeRecord(replicas=4, surge=2, nodes=("s1",), started=NOW + 0.5)
    p = web_pod(0, "od1", annotations=annotations, creation_timestamp=created)
    assert unwind.surge_replica(rec, p) is ours


def test_dead_pods_go_first_then_the_newest_surge_replicas_as_many_as_are_left() -> None:
    rec = SurgeRecord(replicas=4, surge=3, nodes=("s1",), started=NOW)
    dead = web_pod(0, "s1")
    old = web_pod(1, "od1", creation_timestamp=at(-100))
    unmarked_new = web_pod(2, "od1", creation_timestamp=at(20))
    marked_older = web_pod(3, "od1", annotations={SURGE_REPLICA: "true"}, creation_timestamp=at(10))
    marked_newer = web_pod(4, "od1", annotations={SURGE_REPLICA: "true"}, creation_timestamp=at(15))
    pods = [dead, old, unmarked_new, marked_older, marked_newer]
    ranks = unwind.first_to_go(rec, pods, 3, {})
    assert [(p.name[-1], c) for p, c in ranks] == [("0", DOOMED_FIRST), ("4", SURGE_FIRST), ("3", SURGE_FIRST)]
    assert [p.name[-1] for p, _ in unwind.first_to_go(rec, pods, 4, {})] == ["0", "4", "3", "2"]
    assert [p.name[-1] for p, _ in unwind.first_to_go(rec, pods, 1, {})] == ["0"]  # the dead cover it
    # A surge replica on a node the surge names is not an extra: it is dead or lives with it.
    on_doomed = web_pod(5, "s1", annotations={SURGE_REPLICA: "true"})
    alive = {"s1": mark(REB)}
    assert unwind.first_to_go(rec, [on_doomed, marked_newer], 2, alive) == [(marked_newer, SURGE_FIRST)]
