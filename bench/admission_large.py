"""Place a whole scenario's workloads through the served admission webhook.

The simulated cluster (in this process) loads the scenario's nodes (default
``infra/scenarios/large.yaml``: 1,000 nodes, 360 Deployments of 50 and 200
StatefulSets of 10, 20,000 pods, plus 4,000 DaemonSet pods the webhook skips);
``spotguard serve admission`` (gunicorn, TLS, ``--workers`` 2) is registered
through the shipped configurations (``registration.register``: timeout 3 s,
failurePolicy Ignore); then every workload is created at once. The cluster's
controllers create the pods in slow-start batches (kube-controller-manager's
client limits from the scenario's Settings, on the cluster's clock), and its
API server calls the webhook for each pod, as kube-apiserver does.

Reports, in one JSON line: pods admitted, the API server's webhook calls and
how many failed (refused, reset, timed out: the pod is created unpatched),
pods without a placement (unpatched or shed), workloads whose on-demand pods
(by the placement label) differ from their floor, and the time from creation
until every pod was placed. ``--api-latency`` slows every API request the webhook
makes (a busy control plane: slow, never failing).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "shared"))

from spotguard.ops import cycle, functions  # noqa: E402
from spotguard.policy import config, floors  # noqa: E402
from spotguard.policy.workloads import Workload  # noqa: E402
from spotguard_sim import admission as sim_admission  # noqa: E402
from spotguard_sim import scenario, testing  # noqa: E402

PLACEMENT = "spotguard.io/placement"
WORKLOADS = ("deployments", "statefulsets")


def owners(store: Any) -> dict[str, tuple[str, str]]:
    """Pod owner uid -> (kind, namespace/name) of the workload (a ReplicaSet's Deployment)."""
    out: dict[str, tuple[str, str]] = {}
    for plural, kind in (("deployments", "Deployment"), ("statefulsets", "StatefulSet")):
        for obj in store.list(plural)[0]:
            meta = obj["metadata"]
            out[meta["uid"]] = (kind, f"{meta['namespace']}/{meta['name']}")
    by_uid = dict(out)
    for rs in store.list("replicasets")[0]:
        for ref in rs["metadata"].get("ownerReferences") or []:
            if ref.get("controller") and ref.get("uid") in by_uid:
                out[rs["metadata"]["uid"]] = by_uid[ref["uid"]]
    return out


def tally(store: Any) -> tuple[dict[str, dict[str, int]], int]:
    """Per workload: pods by placement label; and the workload pods without a placement.

    Reads the store's entries in place (no copies: a copy of 24,000 pods holds the
    process's one interpreter lock for about a second, during which the simulated API
    server answers nobody, and the webhook's reads time out)."""
    who = owners(store)
    counts: dict[str, dict[str, int]] = {}
    unplaced = 0
    for entry in store.list_entries("pods")[0]:
        meta = entry.obj["metadata"]
        if meta.get("deletionTimestamp"):
            continue
        ref = next((o for o in meta.get("ownerReferences") or [] if o.get("controller")), None)
        if ref is None or ref.get("uid") not in who:
            continue  # DaemonSet pods and the like: the webhook skips them
        label = (meta.get("labels") or {}).get(PLACEMENT, "none")
        unplaced += label == "none"
        per = counts.setdefault(who[ref["uid"]][1], {})
        per[label] = per.get(label, 0) + 1
    return counts, unplaced


def log_problems(path: Path, examples: int = 3) -> tuple[dict[str, int], list[str]]:
    """The webhook's log (JSON lines at WARNING and above): count by message (and by the
    error of a failed review), and the first line of each of the first ``examples`` kinds."""
    counted: dict[str, int] = {}
    kept: list[str] = []
    if not path.exists():
        return counted, kept
    for line in path.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
            msg = str(record.get("msg", ""))
            if record.get("error"):
                msg += f" ({str(record['error'])[:80]})"
        except (ValueError, AttributeError):
            msg = line[:120]
        counted[msg] = counted.get(msg, 0) + 1
        if counted[msg] == 1 and len(kept) < examples:
            kept.append(line[:600])
    return counted, kept


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", default=str(ROOT / "infra" / "scenarios" / "large.yaml"))
    parser.add_argument("--time-scale", type=float, default=20.0, help="simulated seconds per real second (20)")
    parser.add_argument("--workers", type=int, default=2, help="webhook worker processes (2)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="give up after this many seconds")
    parser.add_argument(
        "--api-latency",
        type=float,
        default=0.0,
        help="seconds the simulated API server adds to every request of the webhook's (a busy control plane)",
    )
    args = parser.parse_args()

    infra, apps = cycle.split(scenario.load(args.scenario))
    cfg = config.Config()
    result: dict[str, Any] = {
        "scenario": Path(args.scenario).name,
        "workers": args.workers,
        "api_latency": args.api_latency,
    }
    with (
        tempfile.TemporaryDirectory(prefix="spotguard-bench-") as workdir,
        testing.running_cluster(infra, time_scale=args.time_scale) as sim,
    ):
        sim.store.apply_objects([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "spotguard"}}])
        with functions.admission_server(sim, Path(workdir), args.workers, time_scale=args.time_scale):
            sim_admission.CALLS.reset()
            if args.api_latency:
                sim.faults.set(latency_seconds=args.api_latency)
            started = time.monotonic()
            sim.store.apply_objects(apps)
            wanted = {
                f"{o['metadata']['namespace']}/{o['metadata']['name']}": Workload.from_json(o)
                for plural in WORKLOADS
                for o in sim.store.list(plural)[0]
            }
            total = sum(w.replicas for w in wanted.values())
            placed_at = None
            shown = started
            while time.monotonic() - started < args.timeout:
                counts, unplaced = tally(sim.store)
                pods = sum(sum(c.values()) for c in counts.values())
                if pods >= total:
                    placed_at = time.monotonic() - started
                    break
                if time.monotonic() - shown > 25:
                    shown = time.monotonic()
                    made, failed = sim_admission.CALLS.total()
                    sts = sum(sum(c.values()) for key, c in counts.items() if wanted[key].kind.value == "StatefulSet")
                    note = f"{shown - started:.0f}s: {pods}/{total} pods ({sts} of StatefulSets), {unplaced} unplaced, "
                    note += f"{made} calls, {failed} failed"
                    print(note, file=sys.stderr)
                time.sleep(10.0)  # a tally reads every pod: rarely, so the API server keeps its CPU
            counts, unplaced = tally(sim.store)
            made, failed = sim_admission.CALLS.total()
            causes = dict(sim_admission.CALLS.causes)
        webhook_log = log_problems(Path(workdir) / "admission.log")
    wrong = []
    for key, w in wanted.items():
        floor = min(w.replicas, floors.floor_for(w, cfg).on_demand)
        got = counts.get(key, {}).get("on-demand", 0)
        if got != floor:
            wrong.append(f"{key}: {got} on-demand, floor {floor}")
    result.update(
        {
            "workloads": len(wanted),
            "pods_wanted": total,
            "pods_admitted": sum(sum(c.values()) for c in counts.values()),
            "webhook_calls": made,
            "webhook_call_failures": failed,
            "webhook_call_failure_causes": causes,
            "pods_without_placement": unplaced,
            "workloads_off_floor": len(wrong),
            "off_floor_examples": wrong[:5],
            "seconds_to_place_all": None if placed_at is None else round(placed_at, 1),
            # what the webhook itself logged at WARNING and above (why a pod was let through
            # unchanged): message -> count, and a few whole lines
            "webhook_log_problems": webhook_log[0],
            "webhook_log_examples": webhook_log[1],
            "load_average": round(os.getloadavg()[0], 2),
        }
    )
    print(json.dumps(result), flush=True)
    return 0 if failed == 0 and unplaced == 0 and not wrong and placed_at is not None else 1


if __name__ == "__main__":
    sys.exit(main())
