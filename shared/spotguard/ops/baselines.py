"""What a user would otherwise run, on the same workloads and the same notice, without spotguard.

- ``all-on-demand``: every NodePool limited to on-demand (no spot, nothing to reclaim);
- ``spot-drainer``: the NodePools as given (Karpenter picks spot), no spotguard, a drainer
  cordoning and evicting at the notice as aws-node-termination-handler does.

Each places the workloads (no webhook: pods as their owners wrote them), gives every spot
node its notice with the instances going ``notice`` seconds later, and bills ``window``
simulated seconds from the notice (the spotguard cycle's length, so the bills compare);
serving is judged as the demo judges it (:class:`spotguard.ops.serving.Serving`).
"""

from __future__ import annotations

import copy
import time
from typing import Any

from spotguard_sim import billing, costs, nodepools

from spotguard.logs import UserError
from spotguard.ops import cycle, functions, money, serving, steady
from spotguard.policy import config as config_mod

NOTICE = 120.0
POD_STARTUP = 30.0
NAMES = ("all-on-demand", "spot-drainer")


def on_demand_only(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The scenario with every NodePool limited to on-demand."""
    out = []
    for o in objects:
        if o.get("kind") != "NodePool":
            out.append(o)
            continue
        pool = copy.deepcopy(o)
        reqs = [r for r in nodepools.requirements(pool) if r.get("key") != nodepools.CAPACITY_TYPE]
        reqs.append({"key": nodepools.CAPACITY_TYPE, "operator": "In", "values": ["on-demand"]})
        pool["spec"]["template"]["spec"]["requirements"] = reqs
        out.append(pool)
    return out


def without_spotguard(objects: list[dict[str, Any]], *, drainer: bool, scale: float, window: float,
                      notice: float = NOTICE, pod_startup: float = POD_STARTUP) -> dict[str, Any]:
    """Place the workloads (no webhook), give every spot node its notice, and bill ``window`` seconds."""
    cfg = config_mod.Config()
    infra, apps = cycle.split(objects)
    with cycle.measured_cluster(infra, objects, time_scale=scale, ready_delay_seconds=pod_startup,
                                drainer=drainer) as sim:
        tracker = serving.Serving(sim.clock.now, lambda labels: cfg.node_capacity(labels).value)
        tracker.start(sim.store)
        try:
            sim.store.apply_objects(apps)
            wanted = sum(int((o.get("spec") or {}).get("replicas", 1)) for o in apps
                         if o.get("kind") in ("Deployment", "StatefulSet"))
            try:
                functions.wait_until(lambda: sum(c.total for c in tracker.snapshot().values()) >= wanted,
                                     sim.clock.real(600) + 30, "every pod to be placed and Ready")
                placed = True
            except UserError:
                placed = False
            settled = steady.settle(sim, objects, lambda: steady.placing(tracker, wanted)) if placed else None
            spot = [n["metadata"]["name"] for n in sim.store.list("nodes")[0]
                    if cfg.node_capacity(n["metadata"].get("labels") or {}).value == serving.SPOT]
            t0 = sim.clock.now()
            tracker.arm({k: c.total for k, c in tracker.snapshot().items()})
            tracker.will_die(spot, t0 + notice)
            if spot:
                sim.reclaim(spot, after_seconds=notice)
            while sim.clock.now() < t0 + window:
                tracker.tick()
                time.sleep(0.1)
            tracker.settle()
            counts = tracker.snapshot()
            end = sim.clock.now()
            bill = money.measure(billing.of(sim.store).spans(), sim.settings.capacity.prices, t0=t0,
                                 settled=t0 + notice, end=end)
        finally:
            tracker.stop(sim.store)
    lost = {k: c.before - c.lowest for k, c in counts.items() if c.lowest < c.before}
    return {"placed": placed, "spot_nodes_reclaimed": len(spot), "money": bill,
            "settled": None if settled is None else settled.as_json(),
            "workloads_below_before": len(lost), "serving_lost_at_worst": sum(lost.values()),
            "seconds_below_desired": round(sum(c.below_seconds for c in counts.values()), 1),
            # every workload's serving replicas together, [seconds since the notice, count] at each change
            "serving_over_time": [list(p) for p in serving.totals_over_time(tracker.series, t0)]}



def run(objects: list[dict[str, Any]], *, scale: float, window: float, notice: float = NOTICE,
        pod_startup: float = POD_STARTUP) -> dict[str, dict[str, Any]]:
    """Both baselines (JSON-ready), by name."""
    return {
        "all-on-demand": without_spotguard(on_demand_only(objects), drainer=False, scale=scale, window=window,
                                           notice=notice, pod_startup=pod_startup),
        "spot-drainer": without_spotguard(objects, drainer=True, scale=scale, window=window, notice=notice,
                                          pod_startup=pod_startup),
    }


def against(usd: float, base_usd: float) -> str:
    """``12% cheaper than all on-demand`` (or dearer)."""
    saving = costs.saving(usd, base_usd) or 0.0
    return f"{abs(saving):.0%} {'cheaper' if saving >= 0 else 'dearer'} than all on-demand"


def line(name: str, run: dict[str, Any], base_usd: float | None) -> str:
    usd = run["money"]["cycle"]["usd"]
    saving = f", {against(usd, base_usd)}" if base_usd else ""
    return (f"baseline {name}: ${run['money']['cycle']['usd_per_hour']:.3f}/h, ${usd:.4f} over the same window"
            f"{saving}; {run['workloads_below_before']} workload(s) served fewer replicas than before the notice "
            f"({run['serving_lost_at_worst']} serving replicas lost at worst)")
