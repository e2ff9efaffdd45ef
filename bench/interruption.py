"""Benchmark the spot-interruption handler: 500 notices at once on a large simulated cluster.

The simulated cluster (1,000 nodes, 2,000 workloads, 20,000 pods by default) is
served over HTTPS by this process, loaded in its steady state: every pod bound
and Ready, on-demand floors on on-demand nodes, the rest spread over spot
nodes; half of the Deployments carry a PodDisruptionBudget of their own, one
in ten an HorizontalPodAutoscaler. The controllers are off (nothing reacts
to the writes, so only the handler is measured). The handler runs in a child
process (its own core, as it would in its own Lambda or pod), receives every
notice in one delivery and carries out one plan.

``seconds`` is the time from the first message received to the last surge
written (every taint, surge record, surge copy, budget and autoscaler write done;
``seconds_with_events``: the end of ``handle()``, its Events written too);
``api_writes`` is counted by the gateway (``Kube.stats``); ``client_cpu_seconds`` is the
handler process's CPU over the handling, ``server_cpu_seconds`` the simulated API server's
(this process) meanwhile: both share the machine's cores. ``--surge replicas``
measures the replica surge (``surge_copy: false``) instead of the default copy.

Prints ONE JSON line at the end::

    {"notices": 500, "nodes": 1000, "workloads": 2000, "pods": 20000, "seconds": ...,
     "api_writes": ..., "affected_workloads": ..., "write_budget": ..., ...}

    .venv/bin/python bench/interruption.py [--nodes 1000] [--workloads 2000] [--pods 20000] [--notices 500]
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import _served
from spotguard_sim import objects

Obj = objects.Obj
NAMESPACES = 20


def build(args: argparse.Namespace) -> tuple[list[Obj], list[str], dict[str, int]]:
    """The cluster's objects, the spot node names, and what it holds."""
    rnd = random.Random(args.seed)
    n_od = max(1, round(args.nodes * (1 - args.spot_fraction)))
    nodes = []
    for i in range(args.nodes):
        cap = "on-demand" if i < n_od else "spot"
        name = f"ip-10-{i // 250}-{i % 250}-{i % 7}.ec2.internal"
        provider = objects.provider_id(f"us-east-1{'abc'[i % 3]}", objects.instance_id(i))
        nodes.append(objects.node(name, cap, zone=None, cpu="64", memory="256Gi", pods="250", provider=provider))
    on_demand = [n["metadata"]["name"] for n in nodes[:n_od]]
    spot = [n["metadata"]["name"] for n in nodes[n_od:]]

    # Replica counts that add up to the pod count.
    replicas = [1 + rnd.randrange(2 * args.pods // args.workloads - 1) for _ in range(args.workloads)]
    diff = args.pods - sum(replicas)
    i = 0
    while diff:
        step = 1 if diff > 0 else -1
        if replicas[i % len(replicas)] + step >= 1:
            replicas[i % len(replicas)] += step
            diff -= step
        i += 1

    objs: list[Obj] = [objects.namespace(f"ns-{n}") for n in range(NAMESPACES)] + [objects.namespace("spotguard")]
    objs += nodes
    counts = {"deployments": 0, "statefulsets": 0, "user_budgets": 0, "autoscalers": 0}
    for w, n in enumerate(replicas):
        ns = f"ns-{w % NAMESPACES}"
        sts = w % 10 == 9
        name = f"{'db' if sts else 'app'}-{w}"
        uid = f"00000000-0000-4000-8000-{w:012x}"
        template = objects.pod_template(name, containers=[objects.container("c", "pause", cpu=None)])
        if sts:
            objs.append(objects.statefulset(name, n, namespace=ns, template=template, uid=uid))
        else:
            objs.append(objects.deployment(name, n, namespace=ns, template=template, uid=uid))
        counts["statefulsets" if sts else "deployments"] += 1
        floor = (n // 2 + 1 if n >= 2 else 1) if sts else 1
        h = f"{w:010x}"[-10:]
        for p in range(n):
            node = rnd.choice(on_demand) if p < floor else rnd.choice(spot)
            if sts:
                pod_name, owner = f"{name}-{p}", {"kind": "StatefulSet", "name": name}
                labels = {"app": name, "apps.kubernetes.io/pod-index": str(p)}
            else:
                pod_name, owner = f"{name}-{h}-{p:05d}", {"kind": "ReplicaSet", "name": f"{name}-{h}"}
                labels = {"app": name, "pod-template-hash": h}
            labels["spotguard.io/placement"] = "on-demand" if p < floor else "spot"
            objs.append(_served.ready_pod(pod_name, ns, node, {**owner, "uid": uid}, labels))
        if not sts and w % 2 == 0:
            objs.append(objects.pdb(name, name, namespace=ns, max_unavailable=1))
            counts["user_budgets"] += 1
        if not sts and w % 10 == 1:
            objs.append(objects.hpa(name, name, n, n * 2, namespace=ns))
            counts["autoscalers"] += 1
    return objs, spot, counts


def child(args: argparse.Namespace) -> int:
    """Run the handler against the served cluster: one delivery of every notice."""
    from spotguard.gateway import kube
    from spotguard.interruption.handler import Handler, Outcome
    from spotguard.policy.config import Config
    from spotguard.policy.notices import Notice, NoticeKind

    logging.basicConfig(level=logging.WARNING)
    raw = json.loads(Path(args.notices_file).read_text())
    k = kube.connect(args.kubeconfig)
    handler = Handler(k, Config(surge_copy=args.surge == "copy"), workers=args.workers)
    started = time.perf_counter()  # the first message received
    cpu = time.process_time()
    notices = [
        Notice(
            event_id=n["id"],
            kind=NoticeKind.INTERRUPTION,
            instance_id=n["instance"],
            time=datetime.now(UTC),
            action="terminate",
        )
        for n in raw
    ]
    outcomes = _served.profiled(handler.handle, notices, profile=args.profile, lines=40)
    total = time.perf_counter() - started
    timings = handler.last_timings
    # The last surge written: every taint, scale, budget and autoscaler write done (the
    # Events, best effort, are written after them).
    seconds = timings["surges_written"]  # the read included
    out = {
        "seconds": round(seconds, 3),
        "seconds_with_events": round(total, 3),
        "read_seconds": round(timings["read"], 3),
        "plan_seconds": round(timings["plan"], 3),
        "outcomes": {o.value: outcomes.count(o) for o in Outcome},
        "api_requests": k.stats.requests,
        "api_writes": k.stats.writes,
        "lists": k.stats.count("list"),
        "taint_writes": k.stats.count("patch", "nodes"),
        "workload_writes": k.stats.count("patch", "deployments.apps"),
        "copy_writes": k.stats.count("create", "replicasets.apps") + k.stats.count("patch", "replicasets.apps"),
        "budget_writes": k.stats.count("create", "poddisruptionbudgets.policy"),
        "autoscaler_writes": k.stats.count("patch", "horizontalpodautoscalers.autoscaling"),
        "event_writes": k.stats.count("create", "events"),
        "client_cpu_seconds": round(time.process_time() - cpu, 3),
    }
    print(json.dumps(out))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--workloads", type=int, default=2000)
    parser.add_argument("--pods", type=int, default=20000)
    parser.add_argument("--notices", type=int, default=500)
    parser.add_argument("--spot-fraction", type=float, default=0.7)
    parser.add_argument("--workers", type=int, default=16, help="the handler's write threads")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--surge",
        choices=("copy", "replicas"),
        default="copy",
        help="the surge: spotguard's copy of each Deployment (the default) or its spec.replicas",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--profile", action="store_true", help="profile the handler (cProfile, on stderr)")
    parser.add_argument("--kubeconfig", help=argparse.SUPPRESS)
    parser.add_argument("--notices-file", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)
    if args.pods < args.workloads:
        parser.error("--pods must be at least --workloads")

    from spotguard_sim import testing

    logging.basicConfig(level=logging.WARNING)
    t = time.perf_counter()
    objs, spot, counts = build(args)
    rnd = random.Random(args.seed + 1)
    doomed = rnd.sample(spot, min(args.notices, len(spot)))
    by_name = {n["metadata"]["name"]: n for n in objs if n["kind"] == "Node"}
    notices = [
        {"id": f"bench-{i:04d}", "instance": by_name[name]["spec"]["providerID"].rsplit("/", 1)[1]}
        for i, name in enumerate(doomed)
    ]
    doomed_set = set(doomed)
    affected: set[tuple[str, str]] = set()
    kinds: dict[str, int] = {"Deployment": 0, "StatefulSet": 0}
    for o in objs:
        if o["kind"] == "Pod" and o["spec"]["nodeName"] in doomed_set:
            ref = o["metadata"]["ownerReferences"][0]
            key = (
                o["metadata"]["namespace"],
                ref["name"].rsplit("-", 1)[0] if ref["kind"] == "ReplicaSet" else ref["name"],
            )
            if key not in affected:
                affected.add(key)
                kinds["Deployment" if ref["kind"] == "ReplicaSet" else "StatefulSet"] += 1
    with testing.running_cluster(controllers=False) as sim:
        _served.load_frozen(sim, objs)
        del objs, by_name
        load_seconds = time.perf_counter() - t
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "notices.json"
            path.write_text(json.dumps(notices))
            extra = ["--notices-file", str(path), "--workers", str(args.workers), "--surge", args.surge]
            server_cpu = time.process_time()
            result = _served.run_child(__file__, sim.kubeconfig, extra, profile=args.profile)
            server_cpu = time.process_time() - server_cpu
        if isinstance(result, int):
            return result
        # A surge's record: on its copy (the copy's surge: the Deployment is not written), or
        # on the Deployment (the replica surge).
        surged = sum(
            1
            for d in sim.store.list("deployments")[0]
            if "spotguard.io/surge" in (d["metadata"].get("annotations") or {})
        ) + sum(
            1
            for rs in sim.store.list("replicasets")[0]
            if "spotguard.io/surge-record" in (rs["metadata"].get("annotations") or {})
        )
    line = {
        "surge": args.surge,
        "notices": len(notices),
        "nodes": args.nodes,
        "workloads": args.workloads,
        "pods": args.pods,
        "seconds": result["seconds"],
        "api_writes": result["api_writes"],
        "doomed_nodes": len(doomed),
        "affected_workloads": len(affected),
        "affected_deployments": kinds["Deployment"],
        "affected_statefulsets": kinds["StatefulSet"],
        "surged_deployments": surged,
        "write_budget": len(doomed) + 3 * len(affected),
        **{k: v for k, v in result.items() if k not in ("seconds", "api_writes")},
        **counts,
        "load_seconds": round(load_seconds, 1),
        "server_cpu_seconds": round(server_cpu, 3),
    }
    print(json.dumps(line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
