"""The plot of a cycle (`spotguard demo --plot`, `simulate --report`): read by a person without the table."""

from __future__ import annotations

from pathlib import Path

from spotguard.ops import cycle, report, serving
from spotguard.policy.workloads import Kind, Workload

SPOT, OD = serving.SPOT, serving.ON_DEMAND
WEB = "Deployment/shop/web"
DB = "StatefulSet/data/db"


def _counts(spot: int, od: int, lowest: int) -> serving.Counts:
    return serving.Counts(serving={SPOT: spot, OD: od}, before=spot + od, lowest=lowest,
                          pod_seconds={SPOT: 100.0 * spot, OD: 100.0 * od})  # fmt: skip


def outcome() -> cycle.Outcome:
    """Two small workloads through a notice at t=100, the reclaim 120 s later, spot back at 260."""
    t0 = 100.0
    series = [
        (t0, WEB, 1, 1), (t0 + 5, WEB, 1, 2), (t0 + 40, WEB, 1, 3), (t0 + 120, WEB, 0, 3), (t0 + 170, WEB, 0, 2),
        (t0 + 300, WEB, 1, 1),
        (t0, DB, 1, 2), (t0 + 120, DB, 0, 2), (t0 + 160, DB, 0, 3), (t0 + 320, DB, 1, 2),
    ]  # fmt: skip
    return cycle.Outcome(
        workloads={WEB: Workload(Kind.DEPLOYMENT, "shop", "web", 2), DB: Workload(Kind.STATEFULSET, "data", "db", 3)},
        floors={WEB: 1, DB: 2},
        doomed=["spot-1"],
        drainer_delays={},
        before={WEB: _counts(1, 1, 2), DB: _counts(1, 2, 3)},
        rejoin={WEB: _counts(0, 2, 2), DB: _counts(0, 3, 2)},
        after={WEB: _counts(1, 1, 2), DB: _counts(1, 2, 2)},
        duration=400.0,
        series=series,
        t0=t0,
        settled=True,
        returned="done",
        notes=[],
        options=cycle.Options(objects=[], scenario="infra/scenarios/demo.yaml"),
        spot_returned=260.0,
    )


def test_every_panel_has_whole_replicas_and_every_marker_in_its_legend(tmp_path: Path) -> None:
    # GIVEN a cycle of two small workloads WHEN it is plotted
    fig = report.figure(outcome())
    # THEN the title says which scenario and the verdict
    head = fig._suptitle.get_text()
    assert "infra/scenarios/demo.yaml" in head and "1 spot node(s) reclaimed" in head
    assert "the promise held" in head
    # AND every panel (the total and each workload) counts whole replicas and names every marker
    assert len(fig.axes) == 3
    for ax in fig.axes:
        ticks = [t for t in ax.get_yticks() if ax.get_ylim()[0] <= t <= ax.get_ylim()[1]]
        assert len(ticks) >= 2 and all(float(t).is_integer() for t in ticks), (ax.get_title(), ticks)
        labels = [t.get_text() for t in ax.get_legend().get_texts()]
        for marker in ("on-demand", "spot", "before the notice", "reclaim", "spot returned"):
            assert any(label.startswith(marker) for label in labels), (ax.get_title(), marker, labels)
    db = next(ax for ax in fig.axes if ax.get_title() == DB)
    assert "on-demand floor (2)" in [t.get_text() for t in db.get_legend().get_texts()]
    # AND the PNG is written
    report.plot(outcome(), tmp_path / "cycle.png")
    assert (tmp_path / "cycle.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def _lost(objects: list[dict], pod_startup: float) -> cycle.Outcome:
    """web fell from 2 to 1 serving on a cluster made of ``objects``."""
    o = outcome()
    o.after[WEB] = _counts(1, 1, 1)
    o.options = cycle.Options(objects=objects, pod_startup=pod_startup, reclaim_after=120.0)
    return o


NODEPOOL = {"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": "default"},
            "spec": {"template": {"spec": {"requirements": []}}}}  # fmt: skip
ON_DEMAND_NODE = {"apiVersion": "v1", "kind": "Node",
                  "metadata": {"name": "od-1", "labels": {"node.kubernetes.io/capacity": "on-demand"}}}  # fmt: skip


def test_a_broken_promise_names_physics_when_no_cluster_could_launch_and_start_a_replacement_in_time() -> None:
    # GIVEN on-demand capacity that only Karpenter launches (1 s batch, at least 30 s to a
    # Ready node) and pods that take 95 s to start: 126 s, longer than the 120 s notice
    row = next(r for r in report.rows(_lost([NODEPOOL], pod_startup=95)) if r.key == WEB)
    # THEN web's broken promise is physics, and the risk says what does not fit
    assert row.lost_service and row.cause == "physics"
    assert "a replacement needs at least 126s" in row.risk and "launch of at least 30s" in row.risk
    # WHEN an on-demand node is already there (only the start counts: 95 s fits)
    row = next(r for r in report.rows(_lost([NODEPOOL, ON_DEMAND_NODE], pod_startup=95)) if r.key == WEB)
    # THEN it is spotguard's
    assert row.cause == "spotguard" and "a replacement needs" not in row.risk
    # AND with pods that start in 30 s Karpenter's launch fits too: spotguard's
    assert next(r for r in report.rows(_lost([NODEPOOL], pod_startup=30)) if r.key == WEB).cause == "spotguard"


def test_the_verdict_and_json_say_which_broken_promises_physics_explains() -> None:
    o = _lost([NODEPOOL], pod_startup=95)
    table = report.rows(o)
    data = report.summary(o, table)
    web = next(w for w in data["workloads"] if w["name"] == "web")
    assert web["cause"] == "physics"
    assert next(w for w in data["workloads"] if w["name"] == "db")["cause"] == ""
    text = report.verdict(data)
    assert "(2->1, physics)" in text and "1 of them beyond what any cluster could do in the notice" in text


def test_a_dip_by_evictions_after_the_replacements_served_is_named_evicted() -> None:
    # GIVEN web fell 2 -> 1 (pods start in 30 s: a cluster could have kept it), its
    # replacements serving 20 s before the reclaim, then one of its pods on a node that
    # stays taken by the Eviction API (Karpenter's consolidation)
    o = _lost([NODEPOOL], pod_startup=30)
    o.at_risk = {WEB: 1}
    o.after[WEB].covered = o.t0 + 100
    o.after[WEB].evicted = 1
    row = next(r for r in report.rows(o) if r.key == WEB)
    # THEN its cause says so, and the risk what bounds it
    assert (row.cause, row.margin) == ("evicted", 20.0)
    assert "the Eviction API took 1 of its serving pods" in row.risk and "PodDisruptionBudget" in row.risk
    text = report.verdict(report.summary(o, report.rows(o)))
    assert "1 by evictions of pods on nodes that stay, not by the notice (evicted), 0 by spotguard" in text
    # AND one whose replacements came after the reclaim is spotguard's, evictions or not
    o.after[WEB].covered = o.t0 + 130
    assert next(r for r in report.rows(o) if r.key == WEB).cause == "spotguard"


def test_the_plot_draws_each_baselines_serving_and_its_cost_beside_spotguards() -> None:
    # GIVEN a cycle with its bill, and both baselines as spotguard.ops.baselines.run gives them
    o = outcome()
    window = {"usd_per_hour": 1.234, "usd": 0.1, "seconds": 400.0}
    o.money = {"before_per_hour": 1.5, "during": window, "after_per_hour": 1.2, "cycle": window,
               "same_nodes_on_demand": {**window, "usd": 0.3}, "unpriced_instance_types": []}  # fmt: skip
    runs = {
        "all-on-demand": {"money": {"cycle": {"usd_per_hour": 2.5}}, "serving_over_time": [[0.0, 5], [300.0, 5]]},
        "spot-drainer": {"money": {"cycle": {"usd_per_hour": 0.9}}, "serving_over_time": [[0.0, 5], [121.0, 2]]},
    }
    fig = report.figure(o, baselines=runs)
    # THEN the total panel holds one line per baseline, labelled with its cost an hour, drawn as it served
    total = fig.axes[0]
    labels = [t.get_text() for t in total.get_legend().get_texts()]
    assert "all-on-demand without spotguard ($2.500/h)" in labels
    assert "spot-drainer without spotguard ($0.900/h)" in labels
    drainer = next(line for line in total.get_lines() if line.get_label().startswith("spot-drainer"))
    assert list(drainer.get_ydata()) == [5, 2, 2] and list(drainer.get_xdata()) == [0.0, 121.0, o.duration]
    # AND the title gives spotguard's own cost beside them
    assert "spotguard: $1.234/h" in total.get_title()
    # AND without baselines the panel has no such line
    assert not [t for t in report.figure(outcome()).axes[0].get_legend().get_texts() if "without" in t.get_text()]


def test_the_serving_total_over_time_starts_at_the_notice_and_changes_only_on_a_change() -> None:
    series = [(90.0, "a", 1, 1), (95.0, "b", 0, 3), (100.0, "a", 1, 1), (100.0, "b", 0, 3), (130.0, "a", 0, 1),
              (130.0, "b", 0, 2), (140.0, "b", 0, 2), (150.0, "a", 1, 1)]  # fmt: skip
    assert serving.totals_over_time(series, 100.0) == [(0.0, 5), (30.0, 3), (50.0, 4)]
    assert serving.totals_over_time(series[:2], 100.0) == [(0.0, 5)]


def test_each_deployment_at_risk_has_its_margin_in_the_table_and_the_json() -> None:
    """Issue 23 item 2: the margin (the replacements serving on nodes that stay vs the reclaim)
    per workload. web had a pod on the doomed node and was covered 40 s after the notice: 80 s
    before the reclaim at 120 s; a StatefulSet (its pod's identity is replaced only after the
    old one is gone) and a Deployment with nothing on the doomed nodes have none."""
    import io

    from rich.console import Console

    o = outcome()
    o.options = cycle.Options(objects=[], reclaim_after=120.0)
    o.after[WEB].covered = o.t0 + 40
    o.at_risk = {WEB: 1, DB: 1}
    rows = {r.key: r for r in report.rows(o)}
    assert rows[WEB].margin == 80.0 and rows[DB].margin is None
    data = report.summary(o, list(rows.values()))
    assert {w["name"]: w["margin_seconds"] for w in data["workloads"]} == {"web": 80.0, "db": None}
    out = io.StringIO()
    Console(file=out, width=200).print(report.rich_table(list(rows.values())))
    assert "+80s" in out.getvalue() and "margin" in out.getvalue()
    # covered after the reclaim: a negative margin; nothing at risk: none
    o.after[WEB].covered = o.t0 + 150
    assert next(r for r in report.rows(o) if r.key == WEB).margin == -30.0
    o.at_risk = {}
    assert next(r for r in report.rows(o) if r.key == WEB).margin is None


def test_a_dip_by_evictions_of_a_workload_the_notice_never_touched_is_named_evicted() -> None:
    # GIVEN web with nothing on the doomed nodes that fell 2 -> 1 when the Eviction API took one
    # of its pods (Karpenter consolidating an on-demand node after the surges), and db below its
    # floor the same way
    o = _lost([NODEPOOL], pod_startup=30)
    o.at_risk = {}
    o.after[WEB].evicted = 1
    o.after[DB] = _counts(1, 2, 1)
    o.after[DB].evicted = 1
    rows = {r.key: r for r in report.rows(o)}
    # THEN both are the evictions', not spotguard's, and the risk names the Eviction API
    assert rows[WEB].cause == "evicted" and rows[DB].cause == "evicted"
    assert rows[WEB].risk.startswith("fell to 1 serving, below 2") and "replacements served" not in rows[WEB].risk
    assert "the Eviction API took 1 of its serving pods" in rows[DB].risk
    # AND without an eviction, web's dip is spotguard's
    o.after[WEB].evicted = 0
    assert next(r for r in report.rows(o) if r.key == WEB).cause == "spotguard"
