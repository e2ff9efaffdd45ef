"""What spotguard saves in money, and what it keeps serving, beside what a user would otherwise run.

On a provisioned scenario (Karpenter; default infra/scenarios/demo-karpenter.yaml) the
runs see the same workloads and the same event (every spot node gets its notice; the
instances go 120 s later):

- ``spotguard``: the demo's full cycle (webhook, notice handler, node-added);
- ``spotguard+headroom``: the same, with node-added keeping on-demand headroom (low-priority
  placeholder pods, ``--headroom``, default ``all-spot``: every spot node's surge, as every spot
  node gets the notice here) from the placement on, so its price is in the steady bill and its
  effect in the margins (docs/headroom.md);
- ``spotguard+rebalance-surge``: the earliest signal: the same, with an EC2 rebalance
  recommendation for the doomed nodes ``--rebalance-lead`` seconds (default 120) before their
  warning, and spotguard set to surge on it (``rebalance-action: surge``); billed from the
  recommendation. It shows what acting early buys (the margins) and costs (the surge's nodes
  for the lead's length); not what it costs when EC2 recommends a rebalance that no warning
  follows (a surge of ``rebalance-surge-seconds``, 600 s by default, for nothing), which
  depends on how often that happens on your instance types;
- ``all-on-demand``: no spotguard, the NodePool limited to on-demand (nothing to reclaim);
- ``spot-drainer``: no spotguard, the NodePool as given (Karpenter picks spot), a drainer
  cordoning and evicting at the notice as aws-node-termination-handler does.

Each run also gives its steady state: the bill's rate just before the notice, every pod
placed and the node autoscaler settled (``settled``: nothing changed for as long as it
takes to act, spotguard.ops.steady) (``steady_per_hour_usd``, and
``steady_saving_vs_all_on_demand``): what an hour without an interruption costs.

Each run's bill comes from the simulated cloud (instance-seconds x the us-east-1 price
of each instance; docs/sim.md "Capacity and money"), over the same window: from the
notice to the end of the spotguard cycle. Serving is judged as the demo judges it
(a pod on a reclaimed node stops serving at once): per run, the workloads that served
fewer replicas than before the notice, and the serving replicas lost at worst; for the
spotguard runs also per Deployment the margin (seconds before the reclaim at which its
pre-notice count served on nodes that stay) and the serving before the notice and at its lowest.

Prints ONE JSON line::

    .venv/bin/python bench/cost.py [--scenario infra/scenarios/demo-karpenter.yaml] [--time-scale 20]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from spotguard.ops import baselines, cycle, money, report
from spotguard_sim import scenario

ROOT = Path(__file__).resolve().parents[1]
NOTICE = baselines.NOTICE
POD_STARTUP = baselines.POD_STARTUP


def with_spotguard(
    objects: list[dict[str, Any]], scale: float, headroom: str = "off", lead: float = 0.0
) -> tuple[dict[str, Any], float]:
    outcome = cycle.run(cycle.Options(objects=objects, time_scale=scale, pod_startup=POD_STARTUP,
                                      reclaim_after=NOTICE, headroom=headroom, rebalance_lead=lead,
                                      rebalance_action="surge" if lead else "taint"))
    table = report.rows(outcome)
    data = report.summary(outcome, table)
    lost = {r.key: r.ready_before - r.min_ready for r in table
            if r.kind == "Deployment" and r.min_ready < r.ready_before}
    below_floor = [r.key for r in table if r.kind == "StatefulSet" and r.min_ready < r.floor]
    return {"promise_held": data["interruption_free"], "spot_nodes_reclaimed": data["spot_nodes_reclaimed"],
            "headroom": headroom, "rebalance_lead_seconds": lead,
            "money": data["money"], "workloads_below_before": len(lost) + len(below_floor),
            "serving_lost_at_worst": sum(lost.values()),
            "seconds_below_desired": round(sum(r.seconds_below_desired for r in table), 1),
            "margin_seconds": {r.key: None if r.margin is None else round(r.margin, 1)
                               for r in table if r.kind == "Deployment" and r.margin is not None},
            "serving": {r.key: [r.ready_before, r.min_ready] for r in table},
            "settled": outcome.steady, "settled_after": outcome.steady_after,
            "billed_seconds": round(outcome.billed, 1)}, outcome.billed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", default=str(ROOT / "infra" / "scenarios" / "demo-karpenter.yaml"))
    parser.add_argument("--time-scale", type=float, default=20.0)
    parser.add_argument("--quick", action="store_true", help="accepted for bench/run_all.py (same sizes)")
    parser.add_argument("--headroom", choices=("largest-node", "all-spot", "none"), default="all-spot",
                        help="the spotguard+headroom run's cover (none: leave that run out)")
    parser.add_argument("--rebalance-lead", type=float, default=120.0, metavar="SECONDS",
                        help="the spotguard+rebalance-surge run's recommendation, this long before the warning "
                             "(0: leave that run out)")
    args = parser.parse_args()
    logging.basicConfig(level=os.environ.get("SPOTGUARD_LOG_LEVEL", "WARNING"), stream=sys.stderr)
    started = time.monotonic()
    objects = scenario.load(args.scenario)
    if not cycle.provisioned(objects):
        print(f"bench/cost.py: {args.scenario} launches no spot capacity (no NodePool allowing spot)",
              file=sys.stderr)
        return 2
    guarded, window = with_spotguard(objects, args.time_scale)
    runs = {"spotguard": guarded}
    if args.headroom != "none":
        runs["spotguard+headroom"], _ = with_spotguard(objects, args.time_scale, args.headroom)
    if args.rebalance_lead > 0:
        runs["spotguard+rebalance-surge"], _ = with_spotguard(objects, args.time_scale, lead=args.rebalance_lead)
    runs.update(baselines.run(objects, scale=args.time_scale, window=window))
    base = runs["all-on-demand"]["money"]["cycle"]["usd"]
    steady_base = runs["all-on-demand"]["money"]["before_per_hour"]
    for run in runs.values():
        usd = run["money"]["cycle"]["usd"]
        run["cost_usd"] = usd
        run["cost_per_hour_usd"] = run["money"]["cycle"]["usd_per_hour"]
        run["saving_vs_all_on_demand"] = money.saving(usd, base)
        # the steady state: the bill's rate just before the notice, every pod placed (what a
        # day without interruptions costs), beside all on-demand's
        run["steady_per_hour_usd"] = run["money"]["before_per_hour"]
        run["steady_saving_vs_all_on_demand"] = money.saving(run["money"]["before_per_hour"], steady_base)
    print(json.dumps({
        "benchmark": "cost", "run_seconds": round(time.monotonic() - started, 1),
        "scenario": os.path.relpath(args.scenario, ROOT), "time_scale": args.time_scale,
        "window_seconds": round(window, 1), "notice_seconds": NOTICE, "runs": runs,
        "load_average": os.getloadavg()[0],
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
