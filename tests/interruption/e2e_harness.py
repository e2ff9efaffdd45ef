"""Drive the interruption handler against the simulated cluster and watch what the workloads go through.

:class:`Watcher` subscribes to the simulated store and keeps, for every workload,
the number of Ready pods after every change (so a dip between two polls is
seen), the lowest it fell to, and the Ready count away from the doomed nodes at
the moment each doomed node goes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from spotguard.gateway import kube
from spotguard.interruption.handler import Handler, Outcome
from spotguard.policy import config, floors
from spotguard.policy.notices import Notice, NoticeKind
from spotguard.policy.workloads import Workload

from tests.interruption import sim_scenario

Obj = dict[str, Any]


def workload_key(pod: Obj) -> str | None:
    meta = pod.get("metadata") or {}
    ns = meta.get("namespace")
    for ref in meta.get("ownerReferences") or []:
        if not ref.get("controller"):
            continue
        if ref.get("kind") == "StatefulSet":
            return f"StatefulSet/{ns}/{ref['name']}"
        if ref.get("kind") == "ReplicaSet":
            h = (meta.get("labels") or {}).get("pod-template-hash", "")
            name = ref["name"][: -len(h) - 1] if h and ref["name"].endswith("-" + h) else ref["name"]
            return f"Deployment/{ns}/{name}"
    return None


def is_ready(pod: Obj) -> bool:
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


@dataclass
class Watcher:
    """Ready pods per workload after every store change."""

    ready: dict[str, dict[str, str]] = field(default_factory=lambda: defaultdict(dict))  # key -> uid -> node
    lowest: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    doomed: set[str] = field(default_factory=set)
    at_node_loss: dict[str, dict[str, int]] = field(default_factory=dict)  # node -> key -> ready elsewhere
    armed: bool = False
    created: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))  # key -> placement labels

    def start(self, store: Any) -> None:
        pods, _ = store.list("pods")
        with self.lock:
            for p in pods:
                self._pod("ADDED", p)
        store.subscribe(self.on_change)

    def arm(self, doomed: Sequence[str]) -> None:
        with self.lock:
            self.doomed = set(doomed)
            self.lowest = {k: len(v) for k, v in self.ready.items()}
            self.armed = True

    def on_change(self, event_type: str, resource: str, obj: Obj) -> None:
        with self.lock:
            if resource == "pods":
                self._pod(event_type, obj)
            elif resource == "nodes" and self.armed:
                name = (obj.get("metadata") or {}).get("name")
                going = event_type == "DELETED" or not is_ready(_as_pod(obj))
                if name in self.doomed and going and name not in self.at_node_loss:
                    self.at_node_loss[name] = {
                        k: sum(1 for n in v.values() if n not in self.doomed) for k, v in self.ready.items()
                    }

    def _pod(self, event_type: str, pod: Obj) -> None:
        key = workload_key(pod)
        if key is None:
            return
        uid = pod["metadata"]["uid"]
        if self.armed and event_type == "ADDED":
            self.created[key].append((pod["metadata"].get("labels") or {}).get("spotguard.io/placement", ""))
        if event_type != "DELETED" and is_ready(pod):
            self.ready[key][uid] = (pod.get("spec") or {}).get("nodeName", "")
        else:
            self.ready[key].pop(uid, None)
        if self.armed:
            self.lowest[key] = min(self.lowest.get(key, 10**9), len(self.ready[key]))

    def count(self, key: str) -> int:
        with self.lock:
            return len(self.ready[key])


def _as_pod(node: Obj) -> Obj:
    # A node's Ready condition, read the way is_ready reads a pod's.
    return {"metadata": {}, "status": node.get("status") or {}}


def wait_until(what: Callable[[], bool], timeout: float, message: str, step: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if what():
            return
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {message}")


def notices_for(
    sim: Any, nodes: Sequence[str], kind: NoticeKind = NoticeKind.INTERRUPTION, state: str = ""
) -> list[Notice]:
    t = datetime.fromtimestamp(sim.clock.now(), UTC)
    prefix = {NoticeKind.INTERRUPTION: "itn", NoticeKind.REBALANCE: "rbl", NoticeKind.STATE_CHANGE: "stc"}[kind]
    return [
        Notice(
            event_id=f"{prefix}-{n}",
            kind=kind,
            instance_id=sim_scenario.instance_id(n),
            time=t,
            state=state,
            action="terminate" if kind is NoticeKind.INTERRUPTION else "",
            region="us-east-1",
            account="123456789012",
        )
        for n in nodes
    ]


def deliver(handler: Handler, notices: Sequence[Notice], max_rounds: int = 40, pause: float = 0.05) -> int:
    """Deliver like SQS: redeliver what came back RETRY until all are acknowledged; return the rounds."""
    pending = list(notices)
    for rounds in range(1, max_rounds + 1):
        outcomes = handler.handle(pending)
        assert len(outcomes) == len(pending)
        pending = [n for n, o in zip(pending, outcomes, strict=True) if o is Outcome.RETRY]
        if not pending:
            return rounds
        time.sleep(pause)
    raise AssertionError(f"{len(pending)} notices still not handled after {max_rounds} deliveries")


def handler_for(sim: Any, **kw: Any) -> Handler:
    k = kube.Kube(sim.api_client())
    return Handler(k, kw.pop("config", config.Config()), clock=sim.clock.now, **kw)


def floors_of(store: Any) -> dict[str, tuple[int, int]]:
    """key -> (replicas, on-demand floor) of every workload now."""
    out = {}
    cfg = config.Config()
    for res in ("deployments", "statefulsets"):
        for obj in store.list(res)[0]:
            obj.setdefault("kind", "Deployment" if res == "deployments" else "StatefulSet")
            w = Workload.from_json(obj)
            out[w.key] = (w.replicas, floors.floor_for(w, cfg).on_demand)
    return out


@contextlib.contextmanager
def admission_webhook(sim: Any, workdir: str | os.PathLike[str]) -> Iterator[str]:
    """Serve the admission function over HTTPS on loopback and register it with the cluster.

    Yields the webhook's URL. Pods created after this are placed by spotguard's admission.
    """
    from spotguard import certs
    from spotguard.admission import app as admission_app
    from spotguard.admission import core
    from werkzeug.serving import make_server

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    paths = certs.make(workdir, ["localhost"], ["127.0.0.1"])
    sim.store.apply_objects([sim_scenario.namespace("spotguard")])
    ctx = core.Context(config.Config(), kube.Kube(sim.api_client()))
    # The admission caches the workload for 2 s of real time; the simulated cluster runs
    # time_scale times faster, so scale its caches the same way (else 2 s spans 40 s here).
    scale = max(1.0, float(sim.clock.time_scale))
    ctx.resolver.workload_ttl /= scale
    ctx.resolver.node_ttl /= scale
    server = make_server(
        "127.0.0.1", 0, admission_app.create_app(ctx), threaded=True, ssl_context=(str(paths.cert), str(paths.key))
    )
    thread = threading.Thread(target=server.serve_forever, name="admission-webhook", daemon=True)
    thread.start()
    url = f"https://127.0.0.1:{server.server_port}/mutate"
    sim.store.create(
        "mutatingwebhookconfigurations",
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": "spotguard"},
            "webhooks": [
                {
                    "name": "pods.spotguard.io",
                    "admissionReviewVersions": ["v1"],
                    "sideEffects": "NoneOnDryRun",
                    "failurePolicy": "Ignore",
                    "timeoutSeconds": 5,
                    "reinvocationPolicy": "IfNeeded",
                    "clientConfig": {"url": url, "caBundle": paths.ca_bundle},
                    "rules": [
                        {"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}
                    ],
                }
            ],
        },
    )
    try:
        yield url
    finally:
        server.shutdown()
        thread.join(5)
