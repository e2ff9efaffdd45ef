"""Benchmark one node-added reconcile pass over the large scenario, at its optimum.

The simulated cluster is ``infra/scenarios/large.yaml`` (1,000 nodes: 300
on-demand, 700 spot; 360 Deployments of 50 replicas and 200 StatefulSets of 10:
20,000 pods; and the four system DaemonSets' 4,000 pods, one of each per node),
served over HTTPS by this process and loaded in its steady state: every pod
bound and Ready, each workload's floor on on-demand nodes and the rest spread
over spot nodes (the optimum), a ReplicaSet per Deployment, and the admission
webhook's reservation Lease per ReplicaSet. The controllers are off.
The reconciler runs in a child process (its own core, as in its own pod or
Lambda) and makes one pass, which must find nothing to do: only list calls and
no writes.

Prints ONE JSON line at the end::

    {"nodes": 1000, "pods": 20000, "seconds": ..., "max_rss_mb": ..., "api_requests": ...,
     "api_writes": 0, "by_verb": {...}, ...}

    .venv/bin/python bench/reconcile.py [--scenario infra/scenarios/large.yaml] [--profile]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import _served

ROOT = Path(__file__).resolve().parents[1]
Obj = dict[str, Any]
CREATED = "2026-01-01T00:00:00Z"


def build(scenario: str) -> tuple[list[Obj], dict[str, int]]:
    """The scenario's objects plus, at the optimum, every pod, ReplicaSet and reservation Lease."""
    from spotguard.policy import config, floors, patches
    from spotguard.policy.workloads import Workload
    from spotguard_sim import objects, settings
    from spotguard_sim import scenario as scenario_mod

    _timings, objs = settings.split(scenario_mod.load(scenario))
    objs.append(objects.namespace("spotguard"))
    nodes = [o for o in objs if o["kind"] == "Node"]
    capacity = objects.CAPACITY
    on_demand = [n["metadata"]["name"] for n in nodes if n["metadata"]["labels"].get(capacity) == "on-demand"]
    spot = [n["metadata"]["name"] for n in nodes if n["metadata"]["labels"].get(capacity) == "spot"]
    # node-added's first pass labels every spot node (patches.SPOT_NODE_LABEL): in the steady
    # state they carry it, and a pass has nothing to label
    for n in nodes:
        if n["metadata"]["name"] in spot:
            n["metadata"]["labels"][patches.SPOT_NODE_LABEL] = patches.SPOT_NODE_VALUE
    cfg = config.Config()
    cursor = {"on-demand": 0, "spot": 0}
    pods: list[Obj] = []
    daemons: list[Obj] = []
    extra: list[Obj] = []
    workloads = [o for o in objs if o["kind"] in ("Deployment", "StatefulSet")]
    for w, wl in enumerate(workloads):
        meta, spec = wl["metadata"], wl["spec"]
        name, ns = meta["name"], meta["namespace"]
        uid = f"00000000-0000-4000-8000-{w:012x}"
        meta["uid"] = uid
        floor = floors.floor_for(Workload.from_json(wl), cfg).on_demand
        template = spec["template"]
        sts = wl["kind"] == "StatefulSet"
        h = f"{w:010x}"
        if not sts:
            extra.append(
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "metadata": {
                        "name": f"{name}-{h}",
                        "namespace": ns,
                        "labels": {**template["metadata"]["labels"], "pod-template-hash": h},
                        "ownerReferences": [owner_ref("Deployment", name, uid)],
                    },
                    "spec": {
                        "replicas": spec["replicas"],
                        "selector": {"matchLabels": {**spec["selector"]["matchLabels"], "pod-template-hash": h}},
                        "template": template,
                    },
                }
            )
        for p in range(spec["replicas"]):
            where = "on-demand" if p < floor else "spot"
            pool = on_demand if where == "on-demand" else spot
            node = pool[cursor[where] % len(pool)]
            cursor[where] += 1
            labels = {**template["metadata"]["labels"], "spotguard.io/placement": where}
            if sts:
                pod_name, owner = f"{name}-{p}", {"kind": "StatefulSet", "name": name, "uid": uid}
                labels["apps.kubernetes.io/pod-index"] = str(p)
            else:
                pod_name, owner = f"{name}-{h}-{p:05d}", {"kind": "ReplicaSet", "name": f"{name}-{h}", "uid": uid}
                labels["pod-template-hash"] = h
            pods.append(_served.ready_pod(pod_name, ns, node, owner, labels, spec=template["spec"], created=CREATED))
    # The system DaemonSets: one pod of each on every node.
    for d, ds in enumerate(o for o in objs if o["kind"] == "DaemonSet"):
        meta = ds["metadata"]
        meta["uid"] = f"00000000-0000-4000-9000-{d:012x}"
        owner = {"kind": "DaemonSet", "name": meta["name"], "uid": meta["uid"]}
        labels = dict(ds["spec"]["template"]["metadata"].get("labels") or {})
        spec = ds["spec"]["template"]["spec"]
        for i, n in enumerate(nodes):
            name, node = f"{meta['name']}-{i:05d}", n["metadata"]["name"]
            daemons.append(_served.ready_pod(name, meta["namespace"], node, owner, labels, spec=spec, created=CREATED))
    counts = {"nodes": len(nodes), "pods": len(pods), "daemonset_pods": len(daemons), "workloads": len(workloads)}
    return objs + extra + pods + daemons, counts


def owner_ref(kind: str, name: str, uid: str) -> Obj:
    return {"apiVersion": "apps/v1", "kind": kind, "name": name, "uid": uid, "controller": True}


def lease(rs: Obj) -> Obj:
    """The admission webhook's reservation Lease of a ReplicaSet (spotguard.admission.reservations)."""
    meta = rs["metadata"]
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": f"admission.{meta['namespace']}.{meta['name']}",
            "namespace": "spotguard",
            "labels": {"app.kubernetes.io/managed-by": "spotguard", "app.kubernetes.io/component": "admission"},
            "annotations": {
                "spotguard.io/replicaset-uid": meta["uid"],
                "spotguard.io/replicaset": f"{meta['namespace']}/{meta['name']}",
            },
        },
        "spec": {"holderIdentity": "spotguard-admission"},
    }


def child(args: argparse.Namespace) -> int:
    """One pass against the served cluster."""
    from spotguard.gateway import kube
    from spotguard.nodeadded.reconciler import Reconciler
    from spotguard.policy.config import Config

    logging.basicConfig(level=logging.WARNING)
    k = kube.connect(args.kubeconfig)
    rec = Reconciler(k, Config())
    started = time.perf_counter()
    report = _served.profiled(rec.reconcile, profile=args.profile)
    seconds = time.perf_counter() - started
    usage = resource.getrusage(resource.RUSAGE_SELF)
    stats = k.stats.snapshot()
    by_verb: dict[str, int] = defaultdict(int)
    for verb, n in stats.by_verb.items():
        by_verb[verb] += n
    print(
        json.dumps(
            {
                "seconds": round(seconds, 3),
                "max_rss_mb": round(usage.ru_maxrss / 1024, 1),
                # CPU of the whole child (imports and connection included): what the pass costs
                # on a machine that others share.
                "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 3),
                "read_seconds": round(rec.last_timings.get("read", 0.0), 3),
                "plan_seconds": round(rec.last_timings.get("plan", 0.0), 3),
                "api_requests": stats.requests,
                "api_writes": stats.writes,
                "by_verb": dict(by_verb),
                "optimal": report.optimal,
                "off_optimum": len(report.plan.surplus) + len(report.plan.deficits),
            }
        )
    )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default=str(ROOT / "infra" / "scenarios" / "large.yaml"))
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--kubeconfig", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)

    from spotguard_sim import testing

    logging.basicConfig(level=logging.WARNING)
    t = time.perf_counter()
    objs, counts = build(args.scenario)
    with testing.running_cluster(controllers=False) as sim:
        _served.load_frozen(sim, objs)
        del objs
        sim.store.apply_objects([lease(rs) for rs in sim.store.list("replicasets")[0]])
        load_seconds = time.perf_counter() - t
        result = _served.run_child(__file__, sim.kubeconfig, profile=args.profile)
    if isinstance(result, int):
        return result
    line = {
        "nodes": counts["nodes"],
        "pods": counts["pods"],
        "daemonset_pods": counts["daemonset_pods"],
        "workloads": counts["workloads"],
        **result,
        "load_seconds": round(load_seconds, 1),
        "load_average": round(os.getloadavg()[0], 2),
    }
    print(json.dumps(line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
