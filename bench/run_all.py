"""Run every benchmark in bench/ and write bench/RESULTS.md.

Every ``bench/*.py`` (except this file) is a benchmark that prints one JSON line
at the end; each runs in its own process, one after another (they share the
machine with nothing else of ours). The table in RESULTS.md has, per benchmark,
its key figures, the aim, whether it was met, the machine (cores, CPU model,
load average before and after) and the date.

    .venv/bin/python bench/run_all.py             # full sizes (tens of minutes on 2 cores)
    .venv/bin/python bench/run_all.py --quick     # smaller sizes, a few minutes; aims not judged
    .venv/bin/python bench/run_all.py --only admission --only sim
    .venv/bin/python bench/run_all.py --list
    .venv/bin/python bench/run_all.py --readme    # full run; the table goes into README.md too

A benchmark this file does not know yet is still run (with no arguments) and
its numeric figures listed; add it to :data:`KNOWN` to give it quick-run
arguments, key figures and an aim. Exit status 1 when a benchmark failed or
(in a full run) missed its aim.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
RESULTS = BENCH / "RESULTS.md"
Result = dict[str, Any]


@dataclass(frozen=True)
class Known:
    """How to run one benchmark quickly, and how to read its JSON line."""

    quick: list[str]
    figures: Callable[[Result], str]
    aim: str
    met: Callable[[Result], bool] | None = None
    full: list[str] = field(default_factory=list)


def _num(value: Any, digits: int = 2) -> str:
    if isinstance(value, bool) or value is None:
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def _sim(r: Result) -> str:
    return (
        f"{_num(r.get('nodes'))} nodes, {_num(r.get('pods'))} pods: "
        f"bound at **{_num(r.get('scheduled_per_second'), 0)}/s**, "
        f"Ready at **{_num(r.get('pods_per_second'), 0)}/s** "
        f"(created {_num(r.get('created_per_second'), 0)}/s); all pods listed through the gateway in "
        f"**{_num(r.get('list_pods_seconds'))} s** (model objects: {_num(r.get('list_pods_deserialized_seconds'))} s)"
    )


def _admission(r: Result) -> str:
    return (
        f"p50 **{_num(r.get('p50_ms'))} ms**, p99 **{_num(r.get('p99_ms'))} ms** against a no-op's "
        f"{_num(r.get('noop_p99_ms'))} ms (**ratio {_num(r.get('p99_ratio'))}**), "
        f"{_num(r.get('throughput_rps'), 0)} reviews/s; **{_num(r.get('api_requests_per_pod'))} API requests "
        f"a pod** ({_num(r.get('api_requests_100_pods'))} for 100 pods)"
    )


def _interruption(r: Result) -> str:
    return (
        f"{_num(r.get('notices'))} notices, {_num(r.get('nodes'))} nodes, {_num(r.get('pods'))} pods: last surge "
        f"written **{_num(r.get('seconds'))} s** after the first message ({_num(r.get('seconds_with_events'))} s "
        f"with Events); **{_num(r.get('api_writes'))} API writes** for {_num(r.get('affected_workloads'))} "
        f"affected workloads (budget {_num(r.get('write_budget'))})"
    )


def _admission_large(r: Result) -> str:
    return (
        f"{r.get('scenario')}: {_num(r.get('pods_admitted'))} of {_num(r.get('pods_wanted'))} pods through the "
        f"webhook, **{_num(r.get('webhook_call_failures'))} failed calls**, "
        f"{_num(r.get('pods_without_placement'))} unplaced, {_num(r.get('workloads_off_floor'))} workloads off "
        f"their floor, all placed in {_num(r.get('seconds_to_place_all'))} s"
    )


def _chaos(r: Result) -> str:
    runs = r.get("runs") or []
    each = "; ".join(
        f"{x.get('faults')}{_scale_of(x, r)}: worst margin {_num(x.get('worst_margin'))}, smallest margin in time "
        f"{_seconds_margin(x)}, back after {_num(x.get('recovered_after_s'), 0)} simulated s" for x in runs
    )
    held = r.get("promise_held")
    return f"every spot node at once, x{_num(r.get('time_scale'), 0)}: **promise held: {held}** ({each})"


def _scale_of(run: Result, whole: Result) -> str:
    """The run's scale, as " (at x4)", where it differs from the benchmark's; "" otherwise."""
    scale = run.get("time_scale")
    return "" if scale is None or scale == whole.get("time_scale") else f" (at x{_num(scale, 0)})"


def _seconds_margin(run: Result) -> str:
    """The smallest of a run's per-Deployment margins (its replacements serving that long before
    the reclaim), or "n/a" (a run from before the margins were measured)."""
    values = [m for m in (run.get("margin_seconds") or {}).values() if m is not None]
    return f"{min(values):.0f} s before the reclaim" if values else "n/a"


def _drainer_race(r: Result) -> str:
    held = r.get("promise_held") or {}
    return "; ".join(f"{k}: {'**held**' if v else 'broken'}" for k, v in sorted(held.items()))


def _reconcile(r: Result) -> str:
    return (
        f"one pass: **{_num(r.get('seconds'))} s** ({_num(r.get('cpu_seconds'))} s of CPU), "
        f"**{_num(r.get('api_requests'))} API requests, {_num(r.get('api_writes'))} writes**, "
        f"peak RSS {_num(r.get('max_rss_mb'), 0)} MB; optimal: {r.get('optimal')}"
    )


def _return_to_spot(r: Result) -> str:
    return (
        f"{r.get('scenario')}: {_num(r.get('serving_on_spot_at_end'))} of {_num(r.get('replicas_to_move'))} "
        f"replicas back on spot, optimum reached: **{r.get('optimal')}** in **{_num(r.get('simulated_seconds'), 0)} "
        f"simulated s**, {_num(r.get('api_requests'))} API requests ({_num(r.get('api_requests_per_replica_moved'))} "
        f"a replica moved)"
    )


def _cost(r: Result) -> str:
    runs = r.get("runs") or {}

    def usd(value: Any) -> str:  # cents on a large bill, a tenth of one on a small one
        return _num(value, 3 if isinstance(value, float) and value < 1 else 2)

    def versus(saving: Any, name: str) -> str:
        if not isinstance(saving, (int, float)) or name == "all-on-demand":
            return ""
        return f" ({abs(saving):.0%} {'cheaper' if saving >= 0 else 'dearer'} than all on-demand)"

    def one(name: str) -> str:
        x = runs.get(name) or {}
        steady = x.get("steady_per_hour_usd")
        return (f"{name} ${usd(x.get('cost_per_hour_usd'))}/h over the notice cycle"
                + versus(x.get("saving_vs_all_on_demand"), name)
                + (f", ${usd(steady)}/h steady" + versus(x.get("steady_saving_vs_all_on_demand"), name)
                   if steady is not None else "")
                + f", {_num(x.get('workloads_below_before'))} workloads below their pre-notice serving")
    names = ("spotguard", "spotguard+headroom", "spotguard+rebalance-surge", "all-on-demand", "spot-drainer")
    return f"{r.get('scenario')}: " + "; ".join(one(n) for n in names if n in runs)


KNOWN: dict[str, Known] = {
    "cost": Known(
        quick=[],
        figures=_cost,
        aim="cost and serving beside all on-demand and spot with a drainer (a measurement: no target yet)",
        met=lambda r: bool(r.get("runs")),
    ),
    "chaos": Known(
        quick=["--faults", "none"],
        figures=_chaos,
        aim="the promise held with and without 20 % mixed API faults",
        met=lambda r: r.get("promise_held") is True,
    ),
    "demo_drainer": Known(
        quick=["--seeds", "2"],
        figures=lambda r: (
            f"the default demo with a drainer at the notice: promise held in **{_num(r.get('held'))} of "
            f"{_num(r.get('runs'))}** seeds (break rate {_num(r.get('break_rate'))}), the return finished in "
            f"{_num(r.get('returned'))}; {_num(r.get('real_seconds_median'), 1)} s real a run (median, max "
            f"{_num(r.get('real_seconds_max'), 1)} s)"
        ),
        aim="the promise held in every run; a run under 60 s real",
        met=lambda r: r.get("held") == r.get("runs") and (r.get("real_seconds_max") or 1e9) < 60,
        full=["--seeds", "20"],
    ),
    "drainer_race": Known(
        quick=["--seeds", "1", "--protections", "guard"],
        figures=_drainer_race,
        aim="with the eviction guard, the promise held whoever is first",
        met=lambda r: all(v for k, v in (r.get("promise_held") or {}).items() if k.endswith("/guard")),
    ),
    "reconcile": Known(
        quick=["--scenario", "infra/scenarios/medium.yaml"],
        figures=_reconcile,
        aim="< 2 s, reads only (0 writes) at the optimum",
        met=lambda r: r.get("seconds", 99) < 2.0 and r.get("api_writes") == 0,
    ),
    "return_to_spot": Known(
        quick=["--scenario", "infra/scenarios/demo.yaml"],
        full=["--scenario", "infra/scenarios/medium.yaml"],
        figures=_return_to_spot,
        aim="the optimum reached; a few API requests a replica moved",
        met=lambda r: r.get("optimal") is True,
    ),
    "admission_large": Known(
        quick=["--scenario", "infra/scenarios/demo.yaml"],
        figures=_admission_large,
        aim="0 failed webhook calls, every pod placed, every floor exact",
        met=lambda r: r.get("webhook_call_failures") == 0
        and r.get("pods_without_placement") == 0
        and r.get("workloads_off_floor") == 0,
    ),
    "sim": Known(
        quick=["--nodes", "100", "--pods", "2000"],
        figures=_sim,
        aim="≥ 300 pods/s bound (issue 26) and ≥ 100 Ready; listing 20,000 pods < 1 s",
        met=lambda r: r.get("scheduled_per_second", 0) >= 300 and r.get("pods_per_second", 0) >= 100
        and r.get("list_pods_seconds", 99) < 1.0,
    ),
    "admission": Known(
        quick=["--requests", "300", "--seconds", "1"],
        figures=_admission,
        aim="p99 ≤ 2x a no-op endpoint's; ≤ 2 API requests a pod once warm",
        met=lambda r: r.get("p99_ratio", 99) <= 2.0 and r.get("api_requests_per_pod", 99) <= 2.0,
    ),
    "interruption": Known(
        quick=["--nodes", "200", "--workloads", "400", "--pods", "4000", "--notices", "100"],
        figures=_interruption,
        aim="< 10 s; writes ≤ nodes + 3 x affected workloads",
        met=lambda r: r.get("seconds", 99) < 10 and r.get("api_writes", 1 << 30) <= r.get("write_budget", 0),
    ),
}


def discover() -> list[str]:
    return sorted(p.stem for p in BENCH.glob("*.py") if p.name != Path(__file__).name and not p.name.startswith("_"))


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def commit() -> str:
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    return done.stdout.strip() or "unknown"


@dataclass
class Run:
    name: str
    command: list[str]
    result: Result | None = None
    error: str = ""
    seconds: float = 0.0
    load_before: str = ""
    load_after: str = ""
    date: str = ""


def run_one(name: str, quick: bool, timeout: float) -> Run:
    known = KNOWN.get(name)
    args = (known.quick if quick else known.full) if known else []
    command = [sys.executable, str(BENCH / f"{name}.py"), *args]
    run = Run(name, command, load_before=load(), date=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M"))
    print(f"run_all: {name}: {' '.join(command[1:])} (load {run.load_before})", file=sys.stderr, flush=True)
    started = time.monotonic()
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        run.error = f"timed out after {timeout:.0f} s"
    else:
        lines = [line for line in done.stdout.splitlines() if line.strip()]
        try:
            run.result = json.loads(lines[-1]) if lines else None
        except ValueError:
            run.result = None
        if not isinstance(run.result, dict):
            run.result = None
            tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
            run.error = f"exit {done.returncode}, no JSON line: {tail[:300]}"
        elif done.returncode != 0:
            run.error = f"exit {done.returncode}"
    run.seconds = time.monotonic() - started
    run.load_after = load()
    print(f"run_all: {name}: {run.error or 'ok'} in {run.seconds:.0f} s", file=sys.stderr, flush=True)
    return run


def figures(run: Run) -> str:
    if run.result is None:
        return f"**failed**: {run.error}"
    known = KNOWN.get(run.name)
    if known is not None:
        try:
            return known.figures(run.result)
        except (TypeError, ValueError) as exc:
            return f"(cannot summarise: {exc})"
    numbers = [(k, v) for k, v in run.result.items() if isinstance(v, int | float) and not isinstance(v, bool)]
    return ", ".join(f"{k} {_num(v)}" for k, v in numbers[:8]) or "(no numeric figures)"


def verdict(run: Run, quick: bool) -> str:
    known = KNOWN.get(run.name)
    if run.result is None:
        return "failed"
    if run.error:
        return f"failed ({run.error})"
    if known is None or known.met is None:
        return "—"
    if quick:
        return "not judged (quick sizes)"
    return "met" if known.met(run.result) else "**not met**"


def table(runs: list[Run], quick: bool, machine: str) -> str:
    rows = [
        "| benchmark | key figures | aim | met | machine (cores, CPU, load before → after) | date (UTC) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for run in runs:
        known = KNOWN.get(run.name)
        command = " ".join(["bench/" + Path(run.command[1]).name, *run.command[2:]])
        rows.append(
            f"| `{command}` | {figures(run)} | {known.aim if known else '—'} | {verdict(run, quick)} "
            f"| {machine}, load {run.load_before} → {run.load_after} | {run.date} |"
        )
    return "\n".join(rows)


def oversubscribed(runs: list[Run], cores: int) -> list[str]:
    """A warning when other work shared the machine: the load average was above the core count."""
    loads = [float(x) for r in runs for x in (r.load_before.split("/")[0], r.load_after.split("/")[0]) if x]
    if not loads or max(loads) <= cores:
        return []
    return [
        f"**The machine was oversubscribed** (1-minute load average up to {max(loads):.1f} on {cores} cores): "
        "other work shared it, so times and rates are pessimistic and an aim missed here may be met on an "
        "idle machine. Counts (API requests, writes) do not depend on the load.",
        "",
    ]


def machine() -> tuple[int, str]:
    cores = os.cpu_count() or 0
    return cores, f"{cores} cores, {cpu_model()}"


def write(runs: list[Run], quick: bool, path: Path) -> None:
    cores, machine_ = machine()
    lines = [
        "# Benchmark results",
        "",
        f"Written by `bench/run_all.py{' --quick' if quick else ''}` at commit {commit()}, "
        f"Python {platform.python_version()}, {platform.system()} {platform.release()}.",
        "Every benchmark runs against the simulated cluster over HTTPS on loopback, one at a time; "
        "the load averages (1/5/15 min) show how busy the machine was. "
        + (
            "This was a **quick run** (smaller sizes than the aims are stated for): aims are not judged."
            if quick
            else "Full sizes."
        ),
        "",
        table(runs, quick, machine_),
        "",
        *oversubscribed(runs, cores),
        "Raw JSON lines:",
        "",
        "```",
        *(
            json.dumps({"benchmark": r.name, "run_seconds": round(r.seconds, 1), **(r.result or {"error": r.error})})
            for r in runs
        ),
        "```",
        "",
    ]
    path.write_text("\n".join(lines), encoding="utf-8")


README = ROOT / "README.md"
README_START = "<!-- bench/run_all.py: start -->"
README_END = "<!-- bench/run_all.py: end -->"


def write_readme(runs: list[Run], path: Path) -> None:
    """Put the table of a full run into the README's performance section, between the markers
    (with the commit and the machine): the README shows what the last full run measured."""
    cores, machine_ = machine()
    text = path.read_text(encoding="utf-8")
    if README_START not in text or README_END not in text:
        raise SystemExit(f"run_all: {path} has no {README_START} ... {README_END} section")
    head, rest = text.split(README_START, 1)
    _, tail = rest.split(README_END, 1)
    when = runs[0].date if runs else ""
    body = [
        README_START,
        "",
        f"Written by `bench/run_all.py --readme` at commit {commit()}, {when} UTC, on {machine_} "
        f"(Python {platform.python_version()}); the load average before and after each benchmark is in "
        "its row. Raw JSON lines: [bench/RESULTS.md](bench/RESULTS.md).",
        "",
        table(runs, False, machine_),
        "",
        *oversubscribed(runs, cores),
        README_END,
    ]
    path.write_text(head + "\n".join(body) + tail, encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller sizes (aims are not judged)")
    parser.add_argument("--only", action="append", default=[], metavar="NAME", help="run only this benchmark")
    parser.add_argument("--skip", action="append", default=[], metavar="NAME", help="do not run this benchmark")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per benchmark (default 3600)")
    parser.add_argument(
        "--out", type=Path, default=RESULTS, help=f"where to write (default {RESULTS.relative_to(ROOT)})"
    )
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    parser.add_argument(
        "--readme", action="store_true", help="also put the table in README.md (a full run of every benchmark only)"
    )
    args = parser.parse_args(argv)
    names = discover()
    if args.list:
        for name in names:
            print(name, "" if name in KNOWN else "(not in KNOWN: run with no arguments)")
        return 0
    unknown = sorted(set(args.only + args.skip) - set(names))
    if unknown:
        parser.error(f"no such benchmark: {', '.join(unknown)} (there are {', '.join(names)})")
    chosen = [n for n in names if (not args.only or n in args.only) and n not in args.skip]
    runs = [run_one(name, args.quick, args.timeout) for name in chosen]
    write(runs, args.quick, args.out)
    print(f"run_all: wrote {args.out}", file=sys.stderr)
    if args.readme:
        if args.quick or args.only or args.skip:
            print("run_all: --readme takes a full run of every benchmark; README.md left alone", file=sys.stderr)
        else:
            write_readme(runs, README)
            print(f"run_all: wrote the table into {README}", file=sys.stderr)
    bad = [r.name for r in runs if r.result is None or r.error or verdict(r, args.quick) == "**not met**"]
    if bad:
        print(f"run_all: failed or missed the aim: {', '.join(bad)}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
