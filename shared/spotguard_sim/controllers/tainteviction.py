"""Taint-based eviction (pkg/controller/tainteviction/taint_eviction.go).

For every pod on a node with ``NoExecute`` taints: a pod that does not tolerate
one of them is deleted at once; one that tolerates them all is deleted after the
shortest ``tolerationSeconds`` of its matching tolerations (counted from when
the taint was added), never when one of them has no ``tolerationSeconds``. The
deletion adds the ``DisruptionTarget`` condition (reason
``DeletionByTaintManager``) and is graceful: on a node whose kubelet is gone the
pod then stays Terminating until pod garbage collection removes it.

Each deletion is three requests through the controller's own client's token bucket
(``--kube-api-qps`` 20, burst 30; its own ``ClientOrDie("node-controller")`` in
cmd/kube-controller-manager/app/core.go ``startTaintEvictionController``): the pod's GET, the
PATCH of its status and the DELETE (``addConditionAndDeletePod``).
https://kubernetes.io/docs/concepts/scheduling-eviction/taint-and-toleration/#taint-based-evictions
"""

from __future__ import annotations

import contextlib
from typing import Any

from spotguard_sim import clock as simclock
from spotguard_sim import errors, pods, settings
from spotguard_sim.controllers import base


def tolerates(toleration: dict[str, Any], taint: dict[str, Any]) -> bool:
    """v1.Toleration.ToleratesTaint."""
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key") or ""
    operator = toleration.get("operator") or "Equal"
    if key and key != taint.get("key"):
        return False
    if operator == "Exists":
        return True
    if operator == "Equal":
        return bool((toleration.get("value") or "") == (taint.get("value") or "")) and bool(key)
    return False


def eviction_delay(pod: dict[str, Any], taints: list[dict[str, Any]]) -> float | None:
    """Seconds after the taints until the pod must go: 0 at once, None never (getMinTolerationTime)."""
    tolerations = (pod.get("spec") or {}).get("tolerations") or []
    used: list[dict[str, Any]] = []
    for taint in taints:
        matching = [t for t in tolerations if tolerates(t, taint)]
        if not matching:
            return 0.0
        used.extend(matching)
    seconds = [int(t["tolerationSeconds"]) for t in used if t.get("tolerationSeconds") is not None]
    if not seconds:
        return None
    return float(max(0, min(seconds)))


class TaintEvictionController(base.Controller):
    name = "taint-eviction-controller"
    primary = "nodes"
    workers = 2

    def __init__(self, store: Any, informer: base.Informer, *,
                 limits: settings.ControllerManager | None = None) -> None:
        super().__init__(store, informer)
        self.use_client(limits or settings.ControllerManager())

    def handle(self, event_type: str, resource: str, obj: dict[str, Any]) -> None:
        if resource == "nodes" and event_type != "DELETED":
            if any(t.get("effect") == "NoExecute" for t in (obj.get("spec") or {}).get("taints") or []):
                self.queue.add(base.key_of(obj))
        elif resource == "pods" and event_type != "DELETED":
            node = (obj.get("spec") or {}).get("nodeName")
            if node and not pods.is_terminating(obj):
                self.queue.add_coalesced(("", node))

    def sync(self, key: Any) -> None:
        _, name = key
        node = self.informer.get("nodes", key)
        if node is None:
            return
        taints = [t for t in (node.get("spec") or {}).get("taints") or [] if t.get("effect") == "NoExecute"]
        if not taints:
            return
        now = self.clock.now()
        added = max((_time_added(t, now) for t in taints), default=now)
        retry: float | None = None
        for pod in self.informer.pods_on_node(name):
            if pods.is_terminating(pod):
                continue
            delay = eviction_delay(pod, taints)
            if delay is None:
                continue
            due = added + delay
            if now < due:
                retry = due - now if retry is None else min(retry, due - now)
                continue
            self._evict(pod)
        if retry is not None:
            self.queue.add_after(key, retry)

    def _evict(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        now = self.clock.iso()
        self.log.info("deleting pod", extra={"pod": meta["name"], "namespace": meta["namespace"],
                                             "node": pod["spec"].get("nodeName")})

        def mark(p: dict[str, Any]) -> None:
            pods.set_condition(p, "DisruptionTarget", "True", now, reason="DeletionByTaintManager",
                               message="Taint manager: deleting due to NoExecute taint")

        with contextlib.suppress(errors.NotFound):
            self.write("pods", meta["name"], meta["namespace"], mark, read_first=True)  # GET, PATCH status
            self.request()
            self.store.delete("pods", meta["name"], meta["namespace"], preconditions={"uid": meta["uid"]})


def _time_added(taint: dict[str, Any], now: float) -> float:
    try:
        return simclock.parse_iso(str(taint["timeAdded"]))
    except (KeyError, ValueError):
        return now
