"""What if these spot nodes went now? A what-if on a cluster description or a snapshot.

Loads the scenario (Kubernetes YAML, a `kubectl get -o yaml` export, or a
`spotguard snapshot`) into the simulated cluster, lets spotguard's admission
webhook place every pod, sends EC2 interruption warnings for the chosen spot
nodes at once (through EventBridge and SQS to the spot-interruption poller),
reclaims them two minutes later, then lets new spot nodes join (node-added
moves workloads back, where this spotguard has it).

It reports, per workload, the lowest serving count against the promise (a
Deployment never below what it served just before the notice, a StatefulSet
never below its on-demand floor), the time below its desired count, the
spot share before, during and after, the cost against all on-demand, and
which workloads are at risk and why. Exit status: 0 when the promise held,
1 when it broke for some workload, 2 for a usage error.

--interrupt takes `all-spot`, a number N (N spot nodes picked with --seed), or
node names. The pods of a snapshot are placed anew by the webhook (the
simulated cluster runs its own controllers), so their spread may differ.

examples:
  spotguard simulate --scenario infra/scenarios/demo.yaml --interrupt all-spot
  spotguard simulate --scenario cluster.yaml --interrupt spot-1 spot-2 --drainer --report whatif.html
  spotguard simulate --scenario cluster.yaml --interrupt 3 --pod-startup 90 --output json
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from spotguard.demo import add_pace
from spotguard.logs import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--scenario", required=True, metavar="FILE", help="Kubernetes YAML, an export or a snapshot")
    parser.add_argument(
        "--interrupt", nargs="+", required=True, metavar="all-spot|N|NODE",
        help="which spot nodes get the notice: all-spot, a number, or node names",
    )  # fmt: skip
    parser.add_argument("--pod-startup", type=float, default=30.0, metavar="SECONDS",
                        help="seconds a pod takes to become Ready (30)")  # fmt: skip
    parser.add_argument("--reclaim-after", type=float, default=120.0, metavar="SECONDS",
                        help="seconds from the notice to the reclaim (120)")  # fmt: skip
    parser.add_argument("--drainer", action="store_true", help="a drainer evicts 0-2 s after the notice")
    parser.add_argument("--seed", type=int, default=0, help="seed for the drainer's delays and for N nodes (0)")
    parser.add_argument("--time-scale", type=float, default=20.0, help="simulated seconds per real second (20)")
    add_pace(parser)
    parser.add_argument("--no-return", action="store_true", help="stop after the reclaim (no return to spot)")
    parser.add_argument("--keep-logs", metavar="DIR",
                        help="keep the functions' and the simulated cluster's logs in DIR")  # fmt: skip
    parser.add_argument("--report", metavar="FILE.html|FILE.png", help="write the report (HTML with the plot, or PNG)")
    parser.add_argument("--output", choices=("text", "json"), default="text", help="text for a person, json (text)")


def interrupt_of(values: list[str]) -> str | int | list[str]:
    if values == ["all-spot"]:
        return "all-spot"
    if len(values) == 1 and values[0].lstrip("-").isdigit():
        n = int(values[0])
        if n < 1:
            raise UserError(f"--interrupt {n}: give at least 1 node, all-spot, or node names")
        return n
    if "all-spot" in values:
        raise UserError("--interrupt all-spot stands alone: give all-spot, a number, or node names")
    return list(values)


def keep_logs_of(args: argparse.Namespace) -> Path | None:
    keep = getattr(args, "keep_logs", None)
    if keep is None:
        return None
    path = Path(keep)
    if path.exists() and not path.is_dir():
        raise UserError(f"--keep-logs {path}: not a folder")
    if path.is_dir() and any(path.iterdir()):
        raise UserError(f"--keep-logs {path}: the folder is not empty (give a new or empty one)")
    return path


def options_from(args: argparse.Namespace) -> tuple[Any, Path | None]:
    from spotguard_sim import scenario as scenario_mod

    from spotguard.ops import cycle

    report = Path(args.report) if args.report else None
    if report is not None:
        if report.suffix.lower() not in (".html", ".png"):
            raise UserError(f"--report {report}: name the file something.html or something.png")
        if not report.parent.is_dir():
            raise UserError(f"--report {report}: the folder {report.parent} does not exist")
    path = Path(args.scenario)
    if not path.is_file():
        raise UserError(f"scenario {path} not found: give a Kubernetes YAML file or a snapshot with --scenario")
    options = cycle.Options(
        objects=scenario_mod.load(path), scenario=str(path), interrupt=interrupt_of(args.interrupt),
        time_scale=args.time_scale, pod_startup=args.pod_startup, reclaim_after=args.reclaim_after,
        drainer=args.drainer, seed=args.seed, return_to_spot=not args.no_return, pace=args.pace,
        keep_logs=keep_logs_of(args),
    )  # fmt: skip
    cycle.check(options)
    return options, report


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from spotguard.ops import cycle, live, report, signals

    if args.time_scale <= 0:
        raise UserError(f"--time-scale {args.time_scale:g}: give a positive number")
    options, out_file = options_from(args)
    if getattr(args, "log_level", None) is None and "SPOTGUARD_LOG_LEVEL" not in os.environ:
        logging.getLogger().setLevel(logging.WARNING)
    as_json = args.output == "json"
    stream = sys.stderr if as_json else sys.stdout
    console = Console(file=stream, highlight=False, width=None if stream.isatty() else 160)
    with signals.terminate_as_interrupt(), live.LiveView(console, enabled=not as_json) as view:
        outcome: cycle.Outcome = cycle.run(options, view)
    table = report.rows(outcome)
    data = report.summary(outcome, table)
    if out_file is not None:
        if out_file.suffix.lower() == ".png":
            report.plot(outcome, out_file)
        else:
            report.write_html(outcome, table, data, out_file)
    if as_json:
        print(json.dumps(data), flush=True)
    else:
        console.print(report.rich_table(table))
        at_risk = [r for r in table if r.risk]
        for r in at_risk:
            console.print(f"at risk: {r.key}: {r.risk}")
        for note in outcome.notes:
            console.print(f"note: {note}")
        console.print(report.verdict(data))
        if out_file is not None:
            console.print(f"report written to {out_file}")
    return 0 if data["interruption_free"] else 1
