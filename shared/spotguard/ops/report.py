"""What a cycle did to each workload, against the promise: rows, the JSON summary, the table and the plot.

The promise: no Deployment ever serves fewer replicas than it served just
before the notice, and no StatefulSet falls below its on-demand floor.

Spot shares are fractions of replicas: *before* and *after* count serving
replicas at the notice and at the end; *during* is the share of pod-seconds on
spot from the notice until new spot nodes join. The cost counts every pod
bound to a running node, a spot pod at ``spot_price`` of an on-demand one, from
the notice to the end, against the workloads' desired replicas all on
on-demand for the same time.
"""

from __future__ import annotations

import base64
import html
import io
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from spotguard.ops import cycle, money, serving
from spotguard.policy.workloads import Kind

SPOT, OD = serving.SPOT, serving.ON_DEMAND


@dataclass
class Row:
    namespace: str
    name: str
    kind: str
    desired: int
    floor: int
    ready_before: int  # serving just before the notice
    min_ready: int  # lowest serving since
    lost_service: bool
    seconds_below_desired: float
    spot_share_before: float
    spot_share_during: float
    spot_share_after: float
    cost_vs_on_demand: float
    risk: str  # why it lost service or came close, in words ("" when safe)
    # why the promise broke: "physics" (no cluster of this scenario could have had a
    # replacement Ready within the notice), "evicted" (its replacements served in time, then
    # the Eviction API took serving pods on nodes that stay), "spotguard"; "" when it held
    cause: str = ""
    # A Deployment with pods on the doomed nodes: seconds before the reclaim at which as many
    # pods served on nodes that stay as before the notice (negative: after it; None: never)
    margin: float | None = None

    @property
    def key(self) -> str:
        return f"{self.kind}/{self.namespace}/{self.name}"


def _share(spot: float, total: float) -> float:
    return round(spot / total, 4) if total else 0.0


def rows(outcome: cycle.Outcome) -> list[Row]:
    out = []
    spot_price = outcome.options.spot_price
    for key in sorted(outcome.workloads):
        w = outcome.workloads[key]
        b = outcome.before.get(key, serving.Counts())
        r = outcome.rejoin.get(key, serving.Counts())
        a = outcome.after.get(key, serving.Counts())
        floor = outcome.floors[key]
        required = b.total if w.kind is Kind.DEPLOYMENT else floor
        lost = a.lowest < required
        risk = _risk(outcome, w.kind, b, a, floor=floor, required=required, lost=lost, key=key)
        cause = _cause(outcome, key, w.kind, a) if lost else ""
        during_total = r.pod_seconds[SPOT] + r.pod_seconds[OD]
        cost_base = w.replicas * outcome.duration
        cost = (a.pod_seconds[OD] + spot_price * a.pod_seconds[SPOT]) / cost_base if cost_base else 0.0
        out.append(
            Row(
                namespace=w.namespace, name=w.name, kind=str(w.kind), desired=w.replicas, floor=floor,
                ready_before=b.total, min_ready=a.lowest, lost_service=lost,
                seconds_below_desired=round(a.below_seconds, 1),
                spot_share_before=_share(b.serving[SPOT], b.total),
                spot_share_during=_share(r.pod_seconds[SPOT], during_total),
                spot_share_after=_share(a.serving[SPOT], a.total),
                cost_vs_on_demand=round(cost, 4), risk=risk, cause=cause,
                margin=margin(outcome, key) if w.kind is Kind.DEPLOYMENT else None,
            )
        )  # fmt: skip
    return _blame_the_control_plane(outcome, out)


def fewest_broken(outcome: cycle.Outcome) -> int:
    """The fewest Deployments that lose service whatever spotguard does, where the control
    plane cannot make every replacement Ready in time (0 where it can): the shortfall
    (needed - possible replacements) falls on as few workloads as it can, the largest first."""
    r = outcome.replacements
    if r is None or r.possible is None or r.possible >= r.needed:
        return 0
    short = r.needed - r.possible
    wls = outcome.workloads
    deployments = (n for k, n in outcome.at_risk.items() if k in wls and wls[k].kind is Kind.DEPLOYMENT)
    losing = sorted(deployments, reverse=True)
    broken = 0
    for n in losing:
        if short <= 0:
            break
        short -= n
        broken += 1
    return broken


def _blame_the_control_plane(outcome: cycle.Outcome, table: list[Row]) -> list[Row]:
    """Where the control plane bounds the replacements, "physics" is the cause of the fewest
    Deployments that had to lose service (:func:`fewest_broken`), those whose replacements
    came latest; the other lost ones are spotguard's: a better order would have kept them."""
    o = outcome.options
    if cycle.fastest_replacement(o)[0] >= o.reclaim_after:
        return table  # no replacement in time at all: every one is physics (set per row)
    k = fewest_broken(outcome)
    lost = [row for row in table if row.cause in ("physics", "spotguard") and row.kind == str(Kind.DEPLOYMENT)]
    lost.sort(key=lambda row: (row.margin is not None, row.margin if row.margin is not None else 0.0, row.key))
    physics = {row.key for row in lost[:k]}
    blamed = {row.key for row in lost}
    return [
        replace(row, cause="physics" if row.key in physics else "spotguard") if row.key in blamed else row
        for row in table
    ]


def _cause(outcome: cycle.Outcome, key: str, kind: Kind, a: serving.Counts) -> str:
    """Why a workload's promise broke: "physics", "evicted" (it lost serving pods on nodes that
    stay to the Eviction API, an autoscaler's consolidation or a drain, and not to the notice:
    a Deployment whose replacements served before the reclaim or that had nothing on the
    doomed nodes, a StatefulSet), or "spotguard"."""
    if _physics(outcome, kind):
        return "physics"
    if _evicted_not_by_the_notice(outcome, key, kind, a):
        return "evicted"
    return "spotguard"


def _evicted_not_by_the_notice(outcome: cycle.Outcome, key: str, kind: Kind, a: serving.Counts) -> bool:
    """The workload lost serving pods on nodes that stay to the Eviction API, and not to the
    notice: a StatefulSet, a Deployment with nothing on the doomed nodes, or one whose
    replacements served before the reclaim (a positive :func:`margin`)."""
    if not a.evicted:
        return False
    if kind is not Kind.DEPLOYMENT or not outcome.at_risk.get(key):
        return True
    m = margin(outcome, key)
    return m is not None and m > 0


def margin(outcome: cycle.Outcome, key: str) -> float | None:
    """How long before the reclaim a Deployment's replacements were serving (its count before the
    notice on nodes that stay); None for one with nothing on the doomed nodes, or never covered."""
    covered = outcome.after.get(key, serving.Counts()).covered
    if not outcome.at_risk.get(key) or covered is None:
        return None
    return round(outcome.t0 + outcome.options.reclaim_after - covered, 1)


def _physics(outcome: cycle.Outcome, kind: Kind) -> str:
    """Why no cluster of this scenario could have kept a Deployment serving ("" when one could):
    the fastest replacement is not Ready within the notice, or the control plane cannot make
    enough replacements in time. A StatefulSet keeps its floor by placement, never by a race."""
    o = outcome.options
    if kind is not Kind.DEPLOYMENT:
        return ""
    fastest, how = cycle.fastest_replacement(o)
    if fastest >= o.reclaim_after:
        return f"a replacement needs at least {fastest:g}s ({how}), not less than the {o.reclaim_after:g}s notice"
    r = outcome.replacements
    if r is not None and r.possible is not None and r.possible < r.needed:
        return (
            f"the control plane could make at most {r.possible} of the {r.needed} replacements Ready in time: "
            f"at least {fewest_broken(outcome)} Deployments lose service whatever spotguard does"
        )
    return ""


def _risk(
    outcome: cycle.Outcome,
    kind: Kind,
    b: serving.Counts,
    a: serving.Counts,
    *,
    floor: int,
    required: int,
    lost: bool,
    key: str = "",
) -> str:
    """Why a workload lost service, or what brought it close, in words ("" when nothing did)."""
    o = outcome.options
    if lost:
        what = "what it served before the notice" if kind is Kind.DEPLOYMENT else "its on-demand floor"
        why = []
        if o.drainer:
            why.append("the drainer evicted its pods before replacements were Ready")
        if o.pod_startup >= o.reclaim_after:
            why.append(f"its pods take {o.pod_startup:g}s to start, longer than the {o.reclaim_after:g}s notice")
        elif kind is Kind.DEPLOYMENT and cycle.fastest_replacement(o)[0] >= o.reclaim_after:
            why.append(_physics(outcome, kind))  # the launch is what does not fit
        if kind is Kind.STATEFULSET:
            why.append("a StatefulSet cannot surge: only its floor on on-demand is safe")
        if b.serving[OD] == 0:
            why.append("none of its replicas ran on on-demand")
        if _evicted_not_by_the_notice(outcome, key, kind, a):
            m = margin(outcome, key) if kind is Kind.DEPLOYMENT else None
            served = f"its replacements served {m:g}s before the reclaim; then " if m is not None else ""
            why.append(
                f"{served}the Eviction API took {a.evicted} of its serving pods on nodes that stay (a node "
                "autoscaler's consolidation or a drain, after the notice): a PodDisruptionBudget bounds how many "
                "go at once"
            )
        r = outcome.replacements
        if kind is Kind.DEPLOYMENT and r is not None and r.possible is not None and r.possible < r.needed:
            why.append(
                f"the control plane could make at most {r.possible} of the {r.needed} replacements Ready in time "
                f"(--kube-api-qps {r.qps:g}): at least {fewest_broken(outcome)} Deployments lose service whatever "
                "spotguard does"
            )
        return f"fell to {a.lowest} serving, below {required} ({what})" + (f": {'; '.join(why)}" if why else "")
    if kind is Kind.STATEFULSET and a.lowest < b.total:
        return (
            f"ran on {a.lowest} of {b.total} replicas for {a.below_seconds:.0f}s: a StatefulSet cannot surge, "
            f"its floor of {floor} on on-demand kept it serving"
        )
    if kind is Kind.DEPLOYMENT and b.serving[OD] == 0 and b.serving[SPOT]:
        return "every replica ran on spot: it kept serving only because its surge was Ready before the reclaim"
    return ""


def summary(outcome: cycle.Outcome, table: list[Row]) -> dict[str, Any]:
    """The JSON summary (the demo's last line)."""
    desired = sum(r.desired for r in table)
    spot_before = sum(outcome.before.get(r.key, serving.Counts()).serving[SPOT] for r in table)
    total_before = sum(r.ready_before for r in table)
    during_spot = sum(c.pod_seconds[SPOT] for c in outcome.rejoin.values())
    during_all = sum(c.pod_seconds[SPOT] + c.pod_seconds[OD] for c in outcome.rejoin.values())
    after_spot = sum(outcome.after.get(r.key, serving.Counts()).serving[SPOT] for r in table)
    after_all = sum(outcome.after.get(r.key, serving.Counts()).total for r in table)
    optimal = sum(max(0, r.desired - r.floor) for r in table)
    spot_price = outcome.options.spot_price
    cost = sum(c.pod_seconds[OD] + spot_price * c.pod_seconds[SPOT] for c in outcome.after.values())
    base = desired * outcome.duration
    return {
        "interruption_free": not any(r.lost_service for r in table),
        "spot_share_before": _share(spot_before, total_before),
        "spot_share_during": _share(during_spot, during_all),
        "spot_share_after": _share(after_spot, after_all),
        "optimal_spot_share": _share(optimal, desired),
        "cost_vs_on_demand": round(cost / base, 4) if base else 0.0,
        "money": outcome.money,
        "spot_nodes_reclaimed": len(outcome.doomed),
        "spot_nodes_before": outcome.spot_launched,
        "drainer": outcome.options.drainer,
        "drainer_delays": outcome.drainer_delays,
        "seed": outcome.options.seed,
        "time_scale": outcome.options.time_scale,
        "pace": outcome.options.pace,
        "time_scales": outcome.time_scales,
        "scheduler_lag": outcome.scheduler_lag,
        "simulated_seconds": round(outcome.duration, 1),
        "settled": outcome.settled,
        # a provisioned cluster's wait before the notice for its autoscaler to settle (None: fixed nodes)
        "steady": outcome.steady,
        "steady_after": outcome.steady_after,
        "return_to_spot": outcome.returned,
        "notes": outcome.notes,
        "replacements": asdict(outcome.replacements) if outcome.replacements else None,
        "workloads": [
            {
                "namespace": r.namespace,
                "name": r.name,
                "kind": r.kind,
                "desired": r.desired,
                "floor": r.floor,
                "ready_before": r.ready_before,
                "min_ready": r.min_ready,
                "lost_service": r.lost_service,
                "seconds_below_desired": r.seconds_below_desired,
                "spot_share_before": r.spot_share_before,
                "spot_share_during": r.spot_share_during,
                "spot_share_after": r.spot_share_after,
                "cost_vs_on_demand": r.cost_vs_on_demand,
                "risk": r.risk,
                "cause": r.cause,
                "margin_seconds": r.margin,
            }
            for r in table
        ],
    }


def rich_table(table: list[Row], limit: int = 40) -> Any:
    from rich import box
    from rich.table import Table

    t = Table(
        title="serving replicas before the notice, lowest since, time below desired; margin: the "
        "replacements serving this long before the reclaim; spot share before, during, after; cost vs all on-demand",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        padding=(0, 0, 0, 1),
        pad_edge=False,
    )
    t.add_column("workload", no_wrap=True)
    for col in ("floor", "before", "lowest", "below", "margin", "spot", "during", "after", "cost"):
        t.add_column(col, justify="right")
    t.add_column("promise")
    shown = sorted(table, key=lambda r: (not r.lost_service, r.key))[:limit]
    for r in shown:
        t.add_row(
            _label(r), str(r.floor), str(r.ready_before), str(r.min_ready), f"{r.seconds_below_desired:.0f}s",
            "" if r.margin is None else f"{r.margin:+.0f}s",
            f"{r.spot_share_before:.0%}", f"{r.spot_share_during:.0%}", f"{r.spot_share_after:.0%}",
            f"{r.cost_vs_on_demand:.0%}", f"[red]broken ({r.cause})[/red]" if r.lost_service else "[green]kept[/green]",
        )  # fmt: skip
    if len(table) > len(shown):
        t.caption = f"{len(table) - len(shown)} more workloads not shown (all of them are in --json)"
    return t


def _label(r: Row) -> str:
    """``deploy/shop/web``, ``sts/data/db`` (kubectl's short names)."""
    return f"{'deploy' if r.kind == 'Deployment' else 'sts'}/{r.namespace}/{r.name}"


def verdict(data: dict[str, Any]) -> str:
    lost = [w for w in data["workloads"] if w["lost_service"]]
    head = (
        f"spot share {data['spot_share_before']:.0%} before, {data['spot_share_during']:.0%} during, "
        f"{data['spot_share_after']:.0%} after (best possible {data['optimal_spot_share']:.0%}); "
        f"cost {data['cost_vs_on_demand']:.0%} of all on-demand"
        + (f" (a saving of {1 - data['cost_vs_on_demand']:.0%})" if data["cost_vs_on_demand"] < 1 else "")
    )
    if data.get("money"):
        head += "\n" + money.line(data["money"])
    if not lost:
        return (
            head + "\nthe promise held: no Deployment served fewer replicas than before the notice, "
            "no StatefulSet fell below its floor"
        )
    names = ", ".join(f"{w['kind']}/{w['namespace']}/{w['name']} ({w['ready_before']}->{w['min_ready']}, "
                      f"{w.get('cause') or 'cause unknown'})" for w in lost[:10])  # fmt: skip
    physics = sum(1 for w in lost if w.get("cause") == "physics")
    evicted = sum(1 for w in lost if w.get("cause") == "evicted")
    spotguard = len(lost) - physics - evicted
    parts = [f"{physics} of them beyond what any cluster could do in the notice (physics)"] if physics else []
    if evicted:
        parts.append(f"{evicted} by evictions of pods on nodes that stay, not by the notice (evicted)")
    because = f"; {', '.join(parts)}, {spotguard} by spotguard" if parts else "; every one by spotguard"
    return head + f"\nthe promise broke for {len(lost)} workload(s): {names}{because}"


# -- the plot ----------------------------------------------------------------------------------


def _steps(outcome: cycle.Outcome) -> tuple[list[float], dict[str, list[tuple[float, int, int]]]]:
    """Per workload, (t since notice, spot, on-demand) after each change; and the times."""
    per: dict[str, list[tuple[float, int, int]]] = defaultdict(list)
    for t, key, spot, od in outcome.series:
        if key in outcome.workloads and t >= outcome.t0 - 1e-9:
            per[key].append((t - outcome.t0, spot, od))
    times = sorted({p[0] for v in per.values() for p in v} | {0.0, outcome.duration})
    return times, per


def _totals(times: list[float], per: dict[str, list[tuple[float, int, int]]]) -> tuple[list[int], list[int]]:
    """Serving on spot and on on-demand, summed over the workloads, at each of ``times`` (one sweep)."""
    changes = sorted((t, key, spot, od) for key, points in per.items() for t, spot, od in points)
    current: dict[str, tuple[int, int]] = {}
    spot_total: list[int] = []
    od_total: list[int] = []
    spot_sum = od_sum = 0
    j = 0
    for t in times:
        while j < len(changes) and changes[j][0] <= t:
            _, key, spot, od = changes[j]
            old = current.get(key, (0, 0))
            spot_sum += spot - old[0]
            od_sum += od - old[1]
            current[key] = (spot, od)
            j += 1
        spot_total.append(spot_sum)
        od_total.append(od_sum)
    return spot_total, od_total


def _margin(outcome: cycle.Outcome, key: str) -> int:
    """How far a workload stayed above what the promise requires (negative: broken)."""
    w = outcome.workloads[key]
    before = outcome.before.get(key, serving.Counts()).total
    required = before if w.kind is Kind.DEPLOYMENT else outcome.floors[key]
    return outcome.after.get(key, serving.Counts()).lowest - required


COLORS = {"on-demand": "#4c72b0", "spot": "#55a868", "before": "black", "floor": "#8172b2",
          "reclaim": "#c44e52", "returned": "#dd8452", "all-on-demand": "#333333",
          "spot-drainer": "#da8bc3"}  # fmt: skip


def title(outcome: cycle.Outcome, data: dict[str, Any]) -> str:
    """The scenario and what was done to it, then the verdict (for the plot's and the report's heads)."""
    o = outcome.options
    what = f"{len(outcome.doomed)} spot node(s) reclaimed {o.reclaim_after:g}s after the notice"
    if o.drainer:
        what += ", a drainer at the notice"
    return f"{o.scenario or 'scenario'}: {what}\n{verdict(data)}"


def figure(
    outcome: cycle.Outcome, per_workload_limit: int = 12, baselines: Mapping[str, Mapping[str, Any]] | None = None
) -> Any:
    """The matplotlib figure: serving replicas on spot and on-demand over time, in total and per workload (the
    12 that came closest to breaking the promise, where there are more). Every panel has whole replicas on its
    y axis and the same markers, each in its legend: what served before the notice (the promise for a
    Deployment; a StatefulSet's is its floor, also drawn), the reclaim, and the new spot nodes joining.
    With ``baselines`` (``spotguard.ops.baselines.run``), the total panel draws what each served over the
    same window, and every legend entry of the total panel says what it cost an hour."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    times, per = _steps(outcome)
    spot, od = _totals(times, per)
    keys = sorted(per, key=lambda k: (_margin(outcome, k), k))[:per_workload_limit]
    keys.sort()
    rows_n = 1 + (len(keys) + 2) // 3
    fig = plt.figure(figsize=(12, 3.4 * rows_n + 0.8), layout="constrained")
    fig.suptitle(title(outcome, summary(outcome, rows(outcome))), fontsize=10, x=0.01, ha="left")

    def panel(ax: Any, ts: list[float], o: list[int], sp: list[int], *, before: int, floor: int | None,
              size: float, columns: int) -> None:  # fmt: skip
        ax.stackplot(ts, o, sp, step="post", labels=["on-demand", "spot"], colors=[COLORS["on-demand"], COLORS["spot"]])
        ax.axhline(before, color=COLORS["before"], linewidth=0.9, linestyle=":", label=f"before the notice ({before})")
        if floor is not None:
            ax.axhline(floor, color=COLORS["floor"], linewidth=0.9, linestyle="-.", label=f"on-demand floor ({floor})")
        ax.axvline(outcome.options.reclaim_after, color=COLORS["reclaim"], linestyle="--", label="reclaim")
        if outcome.spot_returned is not None:
            ax.axvline(outcome.spot_returned, color=COLORS["returned"], linestyle="-.", label="spot returned")
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        # Headroom above the highest count for the legend, so that it hides no data.
        peak = max([before, *(floor or 0,), *(a + b for a, b in zip(o, sp, strict=True))])
        ax.set_ylim(0, peak * (1.3 if columns > 3 else 1.6) + 1)
        ax.legend(loc="upper left", fontsize=size, ncol=columns, framealpha=0.8)

    grid = fig.add_gridspec(rows_n, 3)
    ax = fig.add_subplot(grid[0, :])
    total_before = sum(outcome.before.get(k, serving.Counts()).total for k in outcome.workloads)
    for name, run in (baselines or {}).items():
        points = run.get("serving_over_time") or []
        if points:
            ts = [float(t) for t, _ in points] + [outcome.duration]
            ns = [int(n) for _, n in points] + [int(points[-1][1])]
            usd = run["money"]["cycle"]["usd_per_hour"]
            ax.step(ts, ns, where="post", color=COLORS[name], linewidth=1.4,
                    label=f"{name} without spotguard (${usd:.3f}/h)")  # fmt: skip
    panel(ax, times, od, spot, before=total_before, floor=None, size=8, columns=5)
    title_ = "serving replicas, all workloads"
    if baselines and outcome.money:
        title_ += f" (spotguard: ${outcome.money['cycle']['usd_per_hour']:.3f}/h)"
    ax.set_title(title_, fontsize=9)
    ax.set_xlabel("simulated seconds since the notice")
    for i, key in enumerate(keys):
        sub = fig.add_subplot(grid[1 + i // 3, i % 3])
        pts = per[key]
        ts = [p[0] for p in pts] + [outcome.duration]
        sp = [p[1] for p in pts] + [pts[-1][1]]
        o = [p[2] for p in pts] + [pts[-1][2]]
        w = outcome.workloads[key]
        floor = outcome.floors[key] if w.kind is Kind.STATEFULSET else None
        panel(sub, ts, o, sp, before=outcome.before.get(key, serving.Counts()).total, floor=floor, size=6.5,
              columns=2)  # fmt: skip
        sub.set_title(key, fontsize=8)
    return fig


def plot(
    outcome: cycle.Outcome,
    path: Path | io.BytesIO,
    per_workload_limit: int = 12,
    baselines: Mapping[str, Mapping[str, Any]] | None = None,
) -> None:
    """:func:`figure` as a PNG."""
    import matplotlib.pyplot as plt

    fig = figure(outcome, per_workload_limit, baselines)
    fig.savefig(path, format="png", dpi=80)
    plt.close(fig)


def write_html(outcome: cycle.Outcome, table: list[Row], data: dict[str, Any], path: Path) -> None:
    """A self-contained HTML report: the verdict, the table and the plot."""
    png = io.BytesIO()
    plot(outcome, png)
    cells = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in (
            r.key, r.desired, r.floor, r.ready_before, r.min_ready, f"{r.seconds_below_desired:.0f}s",
            f"{r.spot_share_before:.0%}", f"{r.spot_share_during:.0%}", f"{r.spot_share_after:.0%}",
            f"{r.cost_vs_on_demand:.0%}", f"broken ({r.cause})" if r.lost_service else "kept", r.risk,
        )) + "</tr>"
        for r in table
    )  # fmt: skip
    heads = "".join(f"<th>{h}</th>" for h in (
        "workload", "desired", "floor", "serving before", "lowest serving", "below desired", "spot before",
        "spot during", "spot after", "cost vs on-demand", "promise", "at risk because",
    ))  # fmt: skip
    image = base64.b64encode(png.getvalue()).decode()
    verdict_html = html.escape(verdict(data)).replace("\n", "<br>")
    path.write_text(
        "<!doctype html><meta charset=utf-8><title>spotguard simulate</title>"
        "<style>body{font-family:sans-serif}td,th{padding:2px 8px;border-bottom:1px solid #ddd}</style>"
        f"<h1>spotguard simulate</h1><p>{verdict_html}</p>"
        f"<img alt='serving replicas over time' src='data:image/png;base64,{image}'>"
        f"<table><tr>{heads}</tr>{cells}</table>"
    )


def as_dict(row: Row) -> dict[str, Any]:
    return asdict(row)
