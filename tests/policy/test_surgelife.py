"""A surge's life (spotguard.policy.surgelife): each transition of its state machine, the
steps of its end (spotguard.policy.unwind) and the rules that rank the pods first to go."""

from __future__ import annotations

from typing import Any

import pytest
from spotguard.policy import config, interruption, surgelife
from spotguard.policy.surgelife import Event, LifeFacts, SurgeState
from spotguard.policy.surges import SurgeRecord
from spotguard.policy.workloads import (
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
