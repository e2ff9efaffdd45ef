"""The cycle's pace: phases that ask more of the simulated cluster than this machine can
simulate at full speed run slower, so that the simulated cluster never lags a real one."""

from __future__ import annotations

from pathlib import Path

import pytest
from spotguard.logs import UserError
from spotguard.ops import cycle
from spotguard.sim import scenario as scenario_mod

from tests.ops.support import SCENARIOS, last_json, spotguard

LARGE = scenario_mod.load(SCENARIOS / "large.yaml")


def options(objects: list[dict], **kw: object) -> cycle.Options:
    return cycle.Options(objects=objects, **kw)  # type: ignore[arg-type]


def test_a_small_notice_runs_at_the_asked_scale() -> None:
    # GIVEN 15 pods lost, 90 s to replace them: well within what the machine simulates at x20
    o = options(LARGE)
    assert cycle.notice_scale(o, 15) == 20.0


def test_the_large_scenario_notice_runs_at_the_control_planes_pace() -> None:
    # GIVEN large.yaml's 17,640 lost Deployment pods and its controller-manager at 20 QPS
    o = options(LARGE)
    scale = cycle.notice_scale(o, 17_640)
    # THEN the simulated controller-manager's 20 pods a simulated second stay within the
    # machine's faithful rate: 20 * scale <= FAITHFUL_PODS_PER_SECOND
    assert scale == pytest.approx(cycle.FAITHFUL_PODS_PER_SECOND / 20, abs=0.01)
    assert 20 * scale <= cycle.FAITHFUL_PODS_PER_SECOND


def test_without_a_client_limit_the_whole_replacement_sets_the_pace() -> None:
    # GIVEN a controller-manager without a client rate limit (qps 0): all 1,800 pods at once
    objects = [o for o in LARGE if o.get("kind") != "Settings"] + [
        {"apiVersion": "sim.spotguard.io/v1", "kind": "Settings", "metadata": {"name": "x"},
         "controllerManager": {"kubeAPIQPS": 0}},
    ]  # fmt: skip
    scale = cycle.notice_scale(options(objects), 1_800)
    assert scale == pytest.approx(cycle.FAITHFUL_PODS_PER_SECOND / (1_800 / 90), abs=0.01)


def test_fixed_keeps_one_speed() -> None:
    o = options(LARGE, pace="fixed")
    assert cycle.notice_scale(o, 17_640) == 20.0
    assert cycle.return_scale(o, 560, 30) == 20.0


def test_the_return_is_paced_by_the_workloads_moving_at_once() -> None:
    o = options(LARGE)
    assert cycle.return_scale(o, 5, 30) == 20.0  # the demo: a handful of moves a minute
    slow = cycle.return_scale(o, 560, 30)  # large.yaml: 560 workloads, one pod each per 75 s
    assert slow * 560 / (30 + 30 + cycle.PING_SECONDS) <= cycle.FAITHFUL_PODS_PER_SECOND
    assert slow < 20.0


def test_an_unknown_pace_is_a_plain_error() -> None:
    with pytest.raises(UserError, match="auto or fixed"):
        cycle.check(options(scenario_mod.load(SCENARIOS / "small.yaml"), pace="fast"))


def test_a_paced_notice_is_reported_and_keeps_simulated_time_continuous(tmp_path: Path) -> None:
    # GIVEN the small scenario asked at x100, its notice losing every spot pod with 35 s to
    # replace them: more pods a real second than the machine simulates faithfully at x100
    proc = spotguard(
        "simulate", "--scenario", str(SCENARIOS / "small.yaml"), "--interrupt", "all-spot", "--output", "json",
        "--time-scale", "100", "--pod-startup", "5", "--reclaim-after", "40", "--no-return",
    )  # fmt: skip
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    data = last_json(proc)
    # THEN the notice ran slower than asked, the report says so, and the promise held
    scales = data["time_scales"]
    assert scales["placing"] == 100 and scales["notice"] < 100, scales
    assert any("ran at x" in n for n in data["notes"]), data["notes"]
    assert data["interruption_free"] is True, data["workloads"]
    # AND the Deployments that lost pods say how long before the reclaim their replacements
    # served on nodes that stay (their margin, inside the 40 s); the StatefulSet has none
    margins = {w["name"]: w["margin_seconds"] for w in data["workloads"]}
    assert margins["db"] is None and margins["web"] is not None, margins
    assert all(0 < m <= 40 for m in margins.values() if m is not None), margins
    # AND simulated time ran on from the notice: the reclaim came and the cycle settled
    assert data["simulated_seconds"] >= 40 and data["settled"] is True
    # AND --pace fixed runs the same notice at x100
    fixed = last_json(spotguard(
        "simulate", "--scenario", str(SCENARIOS / "small.yaml"), "--interrupt", "all-spot", "--output", "json",
        "--time-scale", "100", "--pod-startup", "5", "--reclaim-after", "40", "--no-return", "--pace", "fixed",
    ))  # fmt: skip
    assert fixed["time_scales"] == {"placing": 100, "notice": 100}


def test_a_scheduler_slower_than_a_real_one_is_named() -> None:
    assert cycle._lag_notes("after the notice", (500, 2.0, 30.0)) == []  # a few stragglers: a real one has them too
    (note,) = cycle._lag_notes("after the notice", (500, 12.0, 40.0))
    assert "after the notice the simulated scheduler left pods waiting up to 40s" in note
    assert "99th percentile 12s" in note and "harsher than a real cluster's" in note


def test_a_real_control_planes_share_is_counted_from_its_first_pod() -> None:
    # GIVEN large.yaml's 17,640 lost pods, the first replacement created 25 s after the notice
    r = cycle._replacements(options(LARGE), 17_640, created=1_609, creating=120 - 25)
    # THEN a real controller-manager at 20 QPS (burst 30) would have created 20 * 95 + 30 by the reclaim
    assert (r.possible, r.expected) == (20 * 90 + 30, 20 * 95 + 30)
    assert cycle._replacement_notes(options(LARGE), r)[1:] == []  # 1,609 of 1,930: not the machine lagging
    slow = cycle._replacements(options(LARGE), 17_640, created=900, creating=95)
    assert "harsher than a real cluster's" in cycle._replacement_notes(options(LARGE), slow)[-1]


def test_a_busier_machine_paces_the_notice_slower() -> None:
    # GIVEN a machine whose 1-minute load is three times its cores (three runs side by side)
    share = cycle.machine_share(load=6.0, cores=2)
    assert share == pytest.approx(1 / 3)
    assert cycle.machine_share(load=1.5, cores=2) == 1.0
    # THEN the notice is paced to a third of the speed an idle machine gets
    o = options(LARGE)
    idle, busy = cycle.notice_scale(o, 17_640), cycle.notice_scale(o, 17_640, share)
    assert busy == pytest.approx(idle / 3, abs=0.01)
    assert cycle.return_scale(o, 560, 30, share) < cycle.return_scale(o, 560, 30)
