"""Reclaim every spot node at once and see whether every workload kept serving.

The demo runs the full cycle on the built-in simulated cluster, wired as in
production: the admission webhook (gunicorn, HTTPS, registered through the
shipped webhook configuration) places every pod; EC2 interruption warnings for
every spot node at once go through moto's EventBridge rule and SQS queue to
the spot-interruption poller; the nodes are reclaimed two minutes later (pods
take 30 s to start); then as many new spot nodes join and node-added moves the
workloads back to spot. --drainer adds a drainer that cordons and evicts 0 to
2 s after the notice (seeded by --seed), racing spotguard as
aws-node-termination-handler does.

It checks the user's promise, judged by what serves (a pod on a reclaimed node
stops serving at once, whatever the API still says): no Deployment ever serves
fewer replicas than just before the notice, and no StatefulSet falls below its
on-demand floor. It exits 1 when the promise broke, 2 on a usage error, 130
when interrupted (everything it started is stopped and its keys removed).

example:
  spotguard demo                      # about 40 s at the default 20x
  spotguard demo --drainer --seed 7 --plot demo.png
  spotguard demo --json | tail -n 1 | jq .interruption_free
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import logging
import os
import signal
import sys
from pathlib import Path

from spotguard.logs import UserError

ROOT = Path(__file__).resolve().parents[2]
# Nodes launched by Karpenter, as on the clusters spotguard is for (demo.yaml: fixed nodes).
DEFAULT_SCENARIO = ROOT / "infra" / "scenarios" / "demo-karpenter.yaml"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument(
        "--scenario", default=str(DEFAULT_SCENARIO), metavar="FILE",
        help="Kubernetes YAML or a `spotguard snapshot` with nodes and workloads (infra/scenarios/demo-karpenter.yaml: "
        "a Karpenter NodePool launches every node; demo.yaml: fixed nodes)",
    )  # fmt: skip
    parser.add_argument("--time-scale", type=float, default=20.0, help="simulated seconds per real second (20)")
    add_pace(parser)
    parser.add_argument(
        "--pod-startup", "--ready-delay", dest="pod_startup", type=float, default=30.0, metavar="SECONDS",
        help="seconds a pod takes to become Ready (30)",
    )  # fmt: skip
    parser.add_argument("--reclaim-after", type=float, default=120.0, metavar="SECONDS",
                        help="seconds from the notice to the reclaim (120, as EC2)")  # fmt: skip
    parser.add_argument(
        "--drainer",
        action="store_true",
        help="also drain every doomed node 0-2 s after the notice, as aws-node-termination-handler",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the drainer's delays (0)")
    parser.add_argument("--no-return", action="store_true", help="stop after the reclaim (no return to spot)")
    parser.add_argument(
        "--headroom", choices=("off", "largest-node", "all-spot"), default="off",
        help="node-added keeps on-demand headroom (low-priority placeholder pods) for the surge of the spot node "
             "that needs the most (largest-node) or of every spot node (all-spot); billed from the placement on "
             "(docs/headroom.md). Default off",
    )  # fmt: skip
    parser.add_argument(
        "--rebalance-lead", type=float, default=0.0, metavar="SECONDS",
        help="the earliest signal: an EC2 rebalance recommendation for the doomed nodes this long before their "
             "interruption warning (0: none; EC2 sends one when a node is at elevated risk, often before the "
             "warning, but may send it with or after it). Default 0",
    )  # fmt: skip
    parser.add_argument(
        "--rebalance-action", choices=("ignore", "taint", "surge"), default="taint",
        help="what spotguard does at a rebalance recommendation (its setting rebalance-action; default taint)",
    )  # fmt: skip
    parser.add_argument(
        "--baselines", action="store_true",
        help="on a provisioned scenario (a Karpenter NodePool), also run the same workloads and notice without "
             "spotguard: all on-demand, and spot with a drainer at the notice; print their cost and serving",
    )  # fmt: skip
    parser.add_argument("--plot", metavar="FILE.png", help="write a PNG of serving replicas on spot and on-demand")
    parser.add_argument(
        "--json",
        action="store_true",
        help="print the summary as one JSON object on the last line of stdout (the rest to stderr)",
    )


def add_pace(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--pace", choices=("auto", "fixed"), default="auto",
        help="auto: the notice and the return to spot run slower than --time-scale where this machine could not "
        "keep a real control plane's pace (a large scenario); fixed: one speed throughout (auto)",
    )  # fmt: skip


def options_from(args: argparse.Namespace) -> tuple[object, Path | None]:
    from spotguard_sim import scenario as scenario_mod

    from spotguard.ops import cycle

    if args.time_scale <= 0:
        raise UserError(
            f"--time-scale {args.time_scale:g}: give a positive number (20 runs 20 simulated seconds a second)"
        )
    if args.pod_startup < 0:
        raise UserError(f"--pod-startup {args.pod_startup:g}: a startup time cannot be negative")
    if args.reclaim_after <= 0:
        raise UserError(f"--reclaim-after {args.reclaim_after:g}: give a positive number of seconds")
    plot = Path(args.plot) if args.plot else None
    if plot is not None:
        if plot.suffix.lower() != ".png":
            raise UserError(f"--plot {plot}: the plot is a PNG; name the file something.png")
        if not plot.parent.is_dir():
            raise UserError(f"--plot {plot}: the folder {plot.parent} does not exist")
    path = Path(args.scenario)
    if not path.is_file():
        raise UserError(f"scenario {path} not found: give a Kubernetes YAML file with --scenario")
    options = cycle.Options(
        objects=scenario_mod.load(path), scenario=str(path), time_scale=args.time_scale,
        pod_startup=args.pod_startup, reclaim_after=args.reclaim_after, drainer=args.drainer, seed=args.seed,
        return_to_spot=not args.no_return, pace=args.pace, headroom=getattr(args, "headroom", "off"),
        rebalance_lead=getattr(args, "rebalance_lead", 0.0),
        rebalance_action=getattr(args, "rebalance_action", "taint"),
    )  # fmt: skip
    cycle.check(options)
    if getattr(args, "baselines", False) and not any(o.get("kind") == "NodePool" for o in options.objects):
        raise UserError("--baselines: the scenario has no Karpenter NodePool; the baselines launch their own "
                        "capacity (try --scenario infra/scenarios/demo-karpenter.yaml)")
    return options, plot


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from spotguard.ops import cycle, live, money, report, signals

    options, plot = options_from(args)
    assert isinstance(options, cycle.Options)
    # `kill -USR1 <pid>` prints every thread's stack to stderr: what a demo that seems stuck is doing
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    if getattr(args, "log_level", None) is None and "SPOTGUARD_LOG_LEVEL" not in os.environ:
        # The demo tells its own story; the components' logs only when asked for.
        logging.getLogger().setLevel(logging.WARNING)
    out = sys.stderr if args.json else sys.stdout
    console = Console(file=out, highlight=False, width=None if out.isatty() else 160)
    console.print(
        f"spotguard demo: {'every spot node' if options.interrupt == 'all-spot' else options.interrupt} reclaimed "
        f"{options.reclaim_after:g}s after the notice, pods start in {options.pod_startup:g}s, "
        f"time x{options.time_scale:g}"
        + (f", a drainer 0-2s after the notice (seed {options.seed})" if options.drainer else "")
        + (f", on-demand headroom for {options.headroom}" if options.headroom != "off" else "")
        + (f", a rebalance recommendation {options.rebalance_lead:g}s before the warning "
           f"(rebalance-action {options.rebalance_action})" if options.rebalance_lead > 0 else "")
    )
    with signals.terminate_as_interrupt(), live.LiveView(console) as view:
        outcome = cycle.run(options, view)
    table = report.rows(outcome)
    data = report.summary(outcome, table)
    console.print(report.rich_table(table))
    for note in outcome.notes:
        console.print(f"note: {note}")
    console.print(report.verdict(data))
    if getattr(args, "baselines", False):
        from spotguard.ops import baselines

        console.print("running the baselines (the same workloads and notice, without spotguard)...")
        runs = baselines.run(options.objects, scale=options.time_scale, window=outcome.duration,
                             notice=options.reclaim_after, pod_startup=options.pod_startup)
        base = runs["all-on-demand"]["money"]["cycle"]["usd"]
        for name, found in runs.items():
            console.print(baselines.line(name, found, base if name != "all-on-demand" else None))
        usd = data["money"]["cycle"]["usd"]
        data["baselines"] = runs
        data["saving_vs_all_on_demand"] = money.saving(usd, base)
        if base:
            console.print(f"spotguard: ${usd:.4f} over the same window, {baselines.against(usd, base)}")
    if plot is not None:
        report.plot(outcome, plot, baselines=data.get("baselines"))
        console.print(f"plot written to {plot}")
    if args.json:
        print(json.dumps(data), flush=True)
    return 0 if data["interruption_free"] else 1
