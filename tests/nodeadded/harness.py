"""Drive the node-added reconcile against the simulated cluster, with the served admission webhook.

The admission function (:func:`tests.interruption.e2e_harness.admission_webhook`)
places every pod the simulated controllers create, as in production; the
reconciler runs its passes against the same cluster over HTTPS, with the
simulated clock.
"""

from __future__ import annotations

import contextlib
import http.server
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from spotguard.gateway import kube
from spotguard.gateway import resources as r
from spotguard.nodeadded import reconciler
from spotguard.policy import config as config_mod
from spotguard_sim import testing, tls

from tests.interruption import e2e_harness as ih
from tests.interruption import sim_scenario

Obj = dict[str, Any]
CAPACITY = sim_scenario.CAPACITY
wait_until = ih.wait_until
admission_webhook = ih.admission_webhook
Watcher = ih.Watcher


def reconciler_for(sim: Any, cfg: config_mod.Config | None = None, **kw: Any) -> reconciler.Reconciler:
    k = kube.Kube(sim.api_client())
    kw.setdefault("admission_cache_seconds", admission_cache_seconds(sim))
    return reconciler.Reconciler(k, cfg or config_mod.Config(), clock=sim.clock.now, **kw)


def admission_cache_seconds(sim: Any) -> float:
    """How long a move waits for the admission webhook's cached workloads to expire: the served
    webhook's caches are scaled to the cluster's time (:func:`admission_webhook`), so is this,
    with half a second of real time for a read in flight under load."""
    return 0.5 + reconciler.ADMISSION_CACHE_SECONDS / max(1.0, float(sim.clock.time_scale))


@contextlib.contextmanager
def served_node_added(sim: Any, cfg: config_mod.Config) -> Iterator[Any]:
    """The node-added function's HTTP app (what ``spotguard serve node-added`` serves) on loopback,
    with ``cfg``, on the simulated clock; yields the sender of Knative's CloudEvents to it
    (:class:`spotguard.ops.functions.CloudEventsNodeAdded`: ApiServerSource adds, pings)."""
    from spotguard.ops import functions

    with functions.node_added(sim, Path("."), cfg, admission_cache_seconds(sim)) as sender:
        yield sender


def ping_until(sender: Any, done: Callable[[], bool], timeout: float, what: str, every: float = 0.25) -> None:
    """Ping the served node-added function (a PingSource) until ``done()``; fails after ``timeout``
    seconds of real time."""
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        sender.ping()
        time.sleep(every)


def capacity_of(store: Any) -> dict[str, str]:
    return {n["metadata"]["name"]: n["metadata"]["labels"].get(CAPACITY, "") for n in store.list("nodes")[0]}


def live(pod: Obj) -> bool:
    return not pod["metadata"].get("deletionTimestamp") and (pod.get("status") or {}).get("phase") not in (
        "Succeeded",
        "Failed",
    )


def placement(store: Any) -> dict[str, tuple[int, int, int]]:
    """key -> (on-demand, spot, not scheduled) of the live pods, by the node's capacity label."""
    caps = capacity_of(store)
    out: dict[str, list[int]] = {}
    for p in store.list("pods")[0]:
        key = ih.workload_key(p)
        if key is None or not live(p):
            continue
        row = out.setdefault(key, [0, 0, 0])
        node = (p.get("spec") or {}).get("nodeName")
        if not node:
            row[2] += 1
        elif caps.get(node) == "spot":
            row[1] += 1
        else:
            row[0] += 1
    return {k: (v[0], v[1], v[2]) for k, v in out.items()}


def floors_of(store: Any) -> dict[str, tuple[int, int]]:
    return ih.floors_of(store)


ready_pods = ih.ready_pods


def passes_until(
    rec: reconciler.Reconciler, done: Callable[[reconciler.Report], bool], max_passes: int, pause: float = 0.3
) -> list[reconciler.Report]:
    """Run passes until ``done(report)``; every report, in order. Fails after ``max_passes``."""
    reports = []
    for _ in range(max_passes):
        rep = rec.reconcile()
        reports.append(rep)
        if done(rep):
            return reports
        time.sleep(pause)
    raise AssertionError(f"not done after {max_passes} passes; last: {summary(reports[-1])}")


def summary(rep: reconciler.Report) -> str:
    return (
        f"surplus={[s.workload.key for s in rep.plan.surplus]} deficits={[d.workload.key for d in rep.plan.deficits]} "
        f"skipped={[(s.workload.key, str(s.reason), s.detail) for s in rep.plan.skipped]} "
        f"progress={[(p.workload.key, str(p.action), p.reason) for p in rep.progress]}"
    )


def settled(rep: reconciler.Report) -> bool:
    return rep.optimal


def cordon(k: kube.Kube, names: list[str], on: bool = True) -> None:
    """``kubectl cordon`` / ``uncordon``, through the API."""
    for name in names:
        k.patch(r.NODES, name, {"spec": {"unschedulable": True if on else None}})


def nodes_named(store: Any, capacity: str) -> list[str]:
    return sorted(n for n, c in capacity_of(store).items() if c == capacity)


def at_optimum(store: Any, keys: list[str] | None = None) -> bool:
    """Every (or each given) workload has exactly its floor on on-demand, all of its pods Ready on a node."""
    places, wanted = placement(store), floors_of(store)
    for key in keys or list(wanted):
        replicas, floor = wanted[key]
        on_demand, spot, pending = places.get(key, (0, 0, 0))
        if pending or on_demand + spot != replicas or on_demand != floor:
            return False
    return True


class Refuser:
    """A second mutating webhook, called after spotguard's (configurations run sorted by name), that
    refuses the first pod of an app that spotguard placed on on-demand: a policy engine or quota
    refusing a pod after its on-demand slot was reserved."""

    def __init__(self, app: str) -> None:
        self.app = app
        self.refused: list[str] = []
        self.lock = threading.Lock()

    def serve(self, store: Any) -> Callable[[], None]:
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                review = testing.read_review(self)
                request = review["request"]
                labels = (request.get("object") or {}).get("metadata", {}).get("labels") or {}
                allowed = True
                if labels.get("app") == outer.app and labels.get("spotguard.io/placement") == "on-demand":
                    with outer.lock:
                        if not outer.refused:
                            outer.refused.append(request["uid"])
                            allowed = False
                answer: dict[str, Any] = {"uid": request["uid"], "allowed": allowed}
                if not allowed:
                    answer["status"] = {"code": 403, "message": "refused by a policy"}
                testing.answer_review(self, answer)

        server, url, ca = tls.serve_https(Handler)
        store.create(
            "mutatingwebhookconfigurations",
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "MutatingWebhookConfiguration",
                "metadata": {"name": "zz-policy"},
                "webhooks": [
                    {
                        "name": "policy.example.com",
                        "clientConfig": {"url": url + "/", "caBundle": ca},
                        "rules": [
                            {"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}
                        ],
                        "failurePolicy": "Fail",
                        "sideEffects": "None",
                        "admissionReviewVersions": ["v1"],
                        "timeoutSeconds": 5,
                    }
                ],
            },
        )
        return server.shutdown


@contextlib.contextmanager
def spilled_cluster(
    tmp_path: Path, replicas: int, spot_nodes: int, time_scale: float, ready_delay: float = 10.0
) -> Iterator[Any]:
    """A simulated cluster with the served admission webhook where Deployment ``web`` of
    ``replicas`` spilled to on-demand node od-0 while its ``spot_nodes`` spot nodes were full
    (cordoned), every replica Ready; the spot nodes open again. Pods are Ready ``ready_delay``
    simulated seconds after they start."""
    key = "Deployment/shop/web"
    nodes = [sim_scenario.namespace("shop"), sim_scenario.node("od-0", "on-demand")]
    nodes += [sim_scenario.node(f"spot-{i}", "spot", cpu="8") for i in range(spot_nodes)]
    with (
        testing.running_cluster(nodes, time_scale=time_scale, ready_delay_seconds=ready_delay) as sim,
        admission_webhook(sim, tmp_path),
    ):
        k = kube.Kube(sim.api_client())
        spot = nodes_named(sim.store, "spot")
        cordon(k, spot)
        sim.store.apply_objects([sim_scenario.deployment("web", replicas)])
        wait_until(lambda: placement(sim.store).get(key) == (replicas, 0, 0), 30, f"{replicas} on on-demand")
        wait_until(lambda: ready_pods(sim.store) == replicas, 30 + 2 * ready_delay / time_scale, f"{replicas} Ready")
        cordon(k, spot, on=False)
        yield sim
