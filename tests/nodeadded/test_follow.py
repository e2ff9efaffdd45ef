"""A delivery follows the moves it leaves in flight (spotguard.nodeadded.service).

The shipped schedules deliver a pass a minute; a move needs a pass to begin it and one once
its new replicas are Ready. A delivery whose pass leaves moves in flight runs further passes
every ``follow_every`` seconds for at most ``follow_seconds`` (from the delivery's start):
here on the simulated cluster, through the served admission webhook, on its clock.

- web's move begins and finishes inside one scheduled delivery (without the follow it waits
  for the next one);
- nothing in flight: no follow pass; a held move is not followed;
- ``follow_seconds`` 0: never; the window bounds the passes;
- a follow pass that fails ends the follow, and the delivery still succeeds.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest
from spotguard.nodeadded import reconciler, service, triggers
from spotguard.policy import config
from spotguard_sim import testing

from tests.interruption import sim_scenario
from tests.nodeadded import harness as h

TIME_SCALE = 20.0
NS = "shop"
CFG = config.Config(rebalance_settle_seconds=0)
SCHEDULE = triggers.Trigger(triggers.Kind.SCHEDULE, detail="test")


def spilled_cluster(tmp_path: Any, ready_delay: float) -> contextlib.AbstractContextManager[Any]:
    """web 3 on on-demand (floor 1), two spot nodes with room: a move of 2 replicas is planned.
    Pods are Ready ``ready_delay`` simulated seconds after they start."""
    return h.spilled_cluster(tmp_path, 3, 2, TIME_SCALE, ready_delay)


@pytest.fixture
def spilled(tmp_path: Any) -> Iterator[Any]:
    with spilled_cluster(tmp_path, 10.0) as sim:
        yield sim


def service_for(sim: Any, rec: reconciler.Reconciler | None = None, **kw: Any) -> service.Service:
    rec = rec or h.reconciler_for(sim, CFG)
    kw.setdefault("follow_seconds", 90.0)
    kw.setdefault("follow_every", 10.0)
    return service.Service(
        lambda: rec, join_wait=0.0, owner=None, follow_sleep=sim.clock.sleep, follow_clock=sim.clock.now, **kw
    )


def annotations(sim: Any) -> dict[str, str]:
    return sim.store.get("deployments", "web", NS)["metadata"].get("annotations") or {}


def test_a_move_begins_and_finishes_inside_one_delivery(spilled: Any) -> None:
    svc = service_for(spilled)
    answer = svc.handle(SCHEDULE)
    assert answer.report is not None and answer.report.in_flight, h.summary(answer.report)
    assert answer.followed >= 1
    # Back at the optimum before the next minute's delivery: web 1 on on-demand, 2 on spot.
    assert h.placement(spilled.store)["Deployment/shop/web"] == (1, 2, 0)
    assert "spotguard.io/rebalance" not in annotations(spilled)
    assert answer.to_json()["followed"] == answer.followed


def test_without_the_follow_the_move_waits_for_the_next_delivery(spilled: Any) -> None:
    svc = service_for(spilled, follow_seconds=0.0)
    answer = svc.handle(SCHEDULE)
    assert answer.report is not None and answer.report.in_flight and answer.followed == 0
    assert h.placement(spilled.store)["Deployment/shop/web"] != (1, 2, 0)  # not back before the next delivery
    assert answer.report.again or "spotguard.io/rebalance" in annotations(spilled)


def test_nothing_in_flight_is_not_followed(tmp_path: Any) -> None:
    nodes = [sim_scenario.namespace(NS), sim_scenario.node("od-0", "on-demand")]
    with testing.running_cluster(nodes, time_scale=TIME_SCALE) as sim:
        sim.store.apply_objects([sim_scenario.deployment("web", 2)])
        h.wait_until(lambda: h.ready_pods(sim.store) == 2, 30, "every pod Ready")
        rec = h.reconciler_for(sim, CFG)
        answer = service_for(sim, rec).handle(SCHEDULE)
        assert answer.report is not None and not answer.report.in_flight and answer.followed == 0


def test_the_window_bounds_the_passes_and_a_hold_is_not_followed(tmp_path: Any) -> None:
    # New replicas Ready only 400 s after they start: a 100 s window (from the delivery's start,
    # its first pass and the admission cache wait included: 13-50 simulated s here) at every 10 s.
    with spilled_cluster(tmp_path, 400.0) as sim:
        rec = h.reconciler_for(sim, CFG)
        began = sim.clock.now()
        answer = service_for(sim, rec, follow_seconds=100.0).handle(SCHEDULE)
        took = sim.clock.now() - began
        assert answer.report is not None and 5 <= answer.followed <= 10, h.summary(answer.report)
        assert took <= 100.0 + 20.0  # the last pass's own time beyond the window
        last = rec.reconcile()
        assert last.in_flight and [str(p.action) for p in last.progress] == ["wait"]
        # Held: not in flight, not followed.
        [step] = last.progress
        held = dataclasses.replace(step, record=dataclasses.replace(step.record, hold_until=1e12, reason="held"))
        assert not dataclasses.replace(last, progress=[held]).in_flight


def test_a_failing_follow_pass_ends_the_follow_not_the_delivery(spilled: Any) -> None:
    rec = h.reconciler_for(spilled, CFG)
    svc = service_for(spilled, rec)
    passes: list[str] = []
    real = rec.reconcile

    def once_then_fail(**kw: Any) -> reconciler.Report:
        passes.append(kw.get("trigger", ""))
        if len(passes) > 1:
            spilled.faults.set(verb="list", resource="pods", error_rate=1.0, status=500)
        return real(**kw)

    rec.reconcile = once_then_fail  # type: ignore[method-assign]
    answer = svc.handle(SCHEDULE)
    spilled.faults.clear()
    assert answer.result == "reconciled" and answer.report is not None and answer.report.in_flight
    assert answer.followed == 1 and passes == ["schedule", "follow"]
    assert svc.ready() is None


def test_a_slow_api_server_does_not_stretch_the_follow_past_its_window(tmp_path: Any) -> None:
    """Each list answered 0.3 real seconds late (6 simulated seconds at x20, and a pass lists
    several times): no follow pass starts later than a period before the window's end, so the
    delivery ends within the window and one pass (inside a function's timeout)."""
    with spilled_cluster(tmp_path, 400.0) as sim:
        rec = h.reconciler_for(sim, CFG)
        sim.faults.set(verb="list", latency_seconds=0.3)
        began = sim.clock.now()
        answer = service_for(sim, rec, follow_seconds=60.0).handle(SCHEDULE)
        took = sim.clock.now() - began
        sim.faults.clear()
        assert answer.report is not None and answer.followed >= 1, h.summary(answer.report)
        last_pass = answer.report.seconds * TIME_SCALE  # the first pass's length, in simulated seconds
        assert took <= 60.0 + last_pass + 5.0, (took, answer.followed, last_pass)
