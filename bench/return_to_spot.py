"""Benchmark the return to spot: how long node-added takes to bring a cluster back to its optimum.

The situation after every spot node was reclaimed: the scenario's on-demand
nodes only, every pod placed by the admission webhook (HTTPS, as in production)
and Ready, so the replicas above each workload's floor spilled onto on-demand.
Then the scenario's spot nodes join at once; node-added hears of each
(Knative ApiServerSource ``dev.knative.apiserver.resource.add`` CloudEvents)
and is pinged every 60 simulated seconds (the shipped PingSource), as the demo
does; each delivery follows its moves in flight with a pass every 10 s for up to
90 s (spotguard.nodeadded.service). The
simulated cluster runs every controller with the scenario's Settings
(kube-controller-manager at ``--kube-api-qps`` 20 by default), pods start in
``--pod-startup`` seconds, and serving replicas are counted as the demo counts
them (:mod:`spotguard.ops.serving`).

On a provisioned scenario (one with a Karpenter NodePool, e.g.
``infra/scenarios/large-karpenter.yaml``) no node is given: the NodePools first
allow on-demand only (spot capacity is out), every pod is placed on the
on-demand nodes Karpenter launches for them, then the scenario's NodePools are
applied as written (spot capacity returns) and node-added, pinged every 60
simulated seconds and told of every node that joins, moves the replicas above each floor back by launching spot
capacity. There ``simulated_seconds`` runs from that return, and the run also
counts the workloads that served fewer replicas than the owner's count (a
StatefulSet's move evicts one pod at a time: one below is counted apart,
``statefulsets_one_below_while_evicting``), or fewer on on-demand than their
floor, at any moment after it (``below_owner``, ``below_floor``), and the
on-demand nodes before and after (Karpenter consolidates the emptied ones).

``simulated_seconds`` is from the join to the optimum (every workload at its
desired count with every replica above its floor serving on spot, and no move
half done), or to ``--timeout``; ``api_requests`` / ``api_writes`` /
``by_verb`` are node-added's own requests, counted by its gateway.

Prints ONE JSON line at the end::

    {"scenario": ..., "nodes_joined": ..., "workloads": ..., "replicas_to_move": ...,
     "simulated_seconds": ..., "optimal": true, "api_requests": ..., "api_writes": ..., ...}

    .venv/bin/python bench/return_to_spot.py [--scenario infra/scenarios/large.yaml] [--time-scale 20]
    .venv/bin/python bench/return_to_spot.py --scenario infra/scenarios/large-karpenter.yaml
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", default=str(ROOT / "infra" / "scenarios" / "large.yaml"))
    parser.add_argument("--time-scale", type=float, default=20.0)
    parser.add_argument("--pod-startup", type=float, default=30.0)
    parser.add_argument("--timeout", type=float, default=7200.0, help="simulated seconds to wait for the optimum")
    args = parser.parse_args()
    logging.getLogger().setLevel(logging.WARNING)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)

    from spotguard.gateway import kube
    from spotguard.nodeadded import app, reconciler, service
    from spotguard.ops import cycle, functions, serving
    from spotguard.policy import config, floors
    from spotguard_sim import scenario

    cfg = config.Config()
    objects = scenario.load(args.scenario)
    infra, apps = cycle.split(objects)
    spot = [o for o in infra if o.get("kind") == "Node" and cfg.node_capacity(cycle._labels(o)).value == serving.SPOT]
    pools = [o for o in infra if o.get("kind") == "NodePool"]
    kept = [o for o in infra if o not in spot and o not in pools] + [_on_demand_only(p) for p in pools]
    scale = args.time_scale
    with contextlib.ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="spotguard-bench-")))
        sim = stack.enter_context(
            cycle.measured_cluster(kept, objects, time_scale=scale, ready_delay_seconds=args.pod_startup)
        )
        sim.store.apply_objects([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "spotguard"}}])
        tracker = serving.Serving(sim.clock.now, lambda labels: cfg.node_capacity(labels).value)
        tracker.start(sim.store)
        stack.callback(tracker.stop, sim.store)
        stack.enter_context(cycle._ticking(tracker))
        workers = 2 if sum(cycle._replicas(o) for o in apps) > 1000 else 1
        admission = stack.enter_context(functions.admission_server(sim, workdir, workers, time_scale=scale))
        started = time.monotonic()
        sim.store.apply_objects(apps)
        wls = cycle._workloads(sim.store)
        floor = {k: min(w.replicas, floors.floor_for(w, cfg).on_demand) for k, w in wls.items()}

        def placed() -> bool:
            counts = tracker.snapshot()
            return all(counts.get(k, serving.Counts()).total >= w.replicas for k, w in wls.items())

        # Provisioned: every pod waits for a node Karpenter launches (30-40 s) in batches.
        slack = 3 if pools else 1
        functions.wait_until(
            placed, slack * (4 * args.pod_startup / scale + 120 + sum(floor.values()) / 5), "every pod Ready"
        )
        print(f"placed in {time.monotonic() - started:.0f}s", file=sys.stderr, flush=True)
        to_move = sum(max(0, w.replicas - floor[k]) for k, w in wls.items())

        # node-added, as functions.node_added serves it, with its gateway kept to count its requests
        k = kube.Kube(sim.api_client())
        svc = service.Service(
            lambda: reconciler.Reconciler(
                k,
                config.Config(),
                clock=sim.clock.now,
                admission_cache_seconds=admission.workload_cache_seconds + reconciler.READ_IN_FLIGHT_SECONDS,
            ),
            join_wait=max(2.0, 60.0 / scale),
            poll=0.05,
            follow_sleep=sim.clock.sleep,
            follow_clock=sim.clock.now,
        )
        from werkzeug.serving import make_server

        server = make_server("127.0.0.1", 0, app.create_app(svc), threaded=True)
        thread = threading.Thread(target=server.serve_forever, name="node-added", daemon=True)
        thread.start()
        stack.callback(thread.join, 10)
        stack.callback(server.shutdown)
        sender = functions.CloudEventsNodeAdded(f"http://127.0.0.1:{server.server_port}/", sim.url)
        stack.callback(sender.close)

        on_demand_nodes = tracker.live_nodes(serving.ON_DEMAND)
        t0 = sim.clock.now()
        real0 = time.monotonic()
        tracker.arm({k: w.replicas for k, w in wls.items()})
        # node-added gets what the shipped wiring sends: a ping a minute, an event per node that joins
        deliveries = functions.Deliveries(sim, sender)
        sim.store.apply_objects(spot)
        for pool in pools:  # spot capacity returns: the NodePools as the scenario writes them
            sim.store.mutate("nodepools", pool["metadata"]["name"], None, _requirements_of(pool))

        reached: dict[str, float] = {}  # workload -> simulated seconds after the join it was last made optimal

        def optimal() -> bool:
            counts = tracker.snapshot()
            now = sim.clock.now() - t0
            ok = True
            for key, w in wls.items():
                c = counts.get(key, serving.Counts())
                if c.serving[serving.SPOT] >= w.replicas - floor[key] and c.total == w.replicas:
                    reached.setdefault(key, now)
                else:
                    reached.pop(key, None)
                    ok = False
            return ok

        done = False
        while sim.clock.now() - t0 < args.timeout:
            if optimal():
                done = True
                break
            deliveries.tick()
            time.sleep(0.2)
        elapsed = sim.clock.now() - t0
        counts = tracker.snapshot()
        on_spot = sum(counts.get(key, serving.Counts()).serving[serving.SPOT] for key in wls)
        stats = k.stats.snapshot()
        with tracker.lock:
            series = list(tracker.series)
        lowest_on_demand: dict[str, int] = {}
        for when, key, _spot, od in series:
            if when >= t0:
                lowest_on_demand[key] = min(lowest_on_demand.get(key, od), od)
        below_floor = sorted(k for k, od in lowest_on_demand.items() if k in floor and od < floor[k])
        # A Deployment's moves create before they remove: never below the owner's count. A
        # StatefulSet's evict one pod at a time (same name, no surge possible): one below, within
        # its budget and above its floor; more than one below is a failure.
        lows = {k: c.lowest for k, c in counts.items() if k in wls}
        below_owner = sorted(
            k for k, low in lows.items() if low < wls[k].replicas - (1 if k.startswith("StatefulSet/") else 0)
        )
        evicting = sorted(k for k, low in lows.items() if k.startswith("StatefulSet/") and low == wls[k].replicas - 1)
        result: dict[str, Any] = {
            "scenario": os.path.relpath(args.scenario, ROOT),
            "nodes_joined": len(spot),
            "workloads": len(wls),
            "replicas": sum(w.replicas for w in wls.values()),
            "replicas_to_move": to_move,
            "serving_on_spot_at_end": on_spot,
            "optimal": done,
            "simulated_seconds": round(elapsed, 1),
            "real_seconds": round(time.monotonic() - real0, 1),
            "time_scale": scale,
            "pod_startup": args.pod_startup,
            "api_requests": stats.requests,
            "api_writes": stats.writes,
            "api_requests_per_replica_moved": round(stats.requests / max(1, on_spot), 2),
            "by_verb": dict(stats.by_verb),
            "provisioned": bool(pools),
            "below_floor": len(below_floor),
            "below_owner": len(below_owner),
            "statefulsets_one_below_while_evicting": len(evicting),
            "below_examples": (below_floor + below_owner)[:5],
            "on_demand_nodes_before": len(on_demand_nodes),
            "on_demand_nodes_after": len(tracker.live_nodes(serving.ON_DEMAND)),
            "spot_nodes_after": len(tracker.live_nodes(serving.SPOT)),
            "slowest": sorted(((round(v, 1), key) for key, v in reached.items()), reverse=True)[:5],
            "passes_delivered": sender.delivered,
            "load_average": round(os.getloadavg()[0], 1),
        }
    print(json.dumps(result), flush=True)
    return 0 if done else 1


def _on_demand_only(pool: dict[str, Any]) -> dict[str, Any]:
    """The NodePool while spot capacity is out: its capacity-type requirement narrowed to on-demand."""
    out = json.loads(json.dumps(pool))
    reqs = out["spec"]["template"]["spec"].setdefault("requirements", [])
    reqs[:] = [r for r in reqs if r.get("key") != "karpenter.sh/capacity-type"]
    reqs.append({"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]})
    return out


def _requirements_of(pool: dict[str, Any]) -> Any:
    wanted = json.loads(json.dumps(pool["spec"]["template"]["spec"].get("requirements") or []))

    def put_back(obj: dict[str, Any]) -> None:
        obj["spec"]["template"]["spec"]["requirements"] = wanted

    return put_back


if __name__ == "__main__":
    sys.exit(main())
