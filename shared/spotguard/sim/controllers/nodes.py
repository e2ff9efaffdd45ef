"""Node lifecycle: nodes report Ready (as a kubelet posting status would); a node
annotated ``sim.spotguard.io/terminate-at: <RFC3339>`` is reclaimed at that
simulated time: it goes NotReady, its pods become not Ready (as the node
lifecycle controller's MarkPodsNotReady does), then the node is removed with
its pods (pod garbage collection of pods on a vanished node).
https://kubernetes.io/docs/concepts/architecture/nodes/#node-controller
"""

from __future__ import annotations

import contextlib
from typing import Any

from spotguard.sim import clock as simclock
from spotguard.sim import errors, scheduler
from spotguard.sim.controllers import base, pods

TERMINATE_AT = "sim.spotguard.io/terminate-at"


def terminate_at(node: dict[str, Any]) -> float | None:
    raw = ((node.get("metadata") or {}).get("annotations") or {}).get(TERMINATE_AT)
    if not raw:
        return None
    try:
        return simclock.parse_iso(str(raw))
    except ValueError:
        return None


def _set_ready(node: dict[str, Any], ready: bool, now: str) -> None:
    conds = node.setdefault("status", {}).setdefault("conditions", [])
    status = "True" if ready else "Unknown"
    reason, message = (("KubeletReady", "kubelet is posting ready status") if ready else
                       ("NodeStatusUnknown", "Kubelet stopped posting node status."))
    for cond in conds:
        if cond.get("type") == "Ready":
            if cond.get("status") != status:
                cond["lastTransitionTime"] = now
            cond.update(status=status, reason=reason, message=message, lastHeartbeatTime=now)
            return
    conds.append({"type": "Ready", "status": status, "reason": reason, "message": message,
                  "lastHeartbeatTime": now, "lastTransitionTime": now})


class NodeLifecycleController(base.Controller):
    name = "node-lifecycle-controller"
    primary = "nodes"
    resync_seconds = 10.0

    def __init__(self, store: Any, informer: base.Informer, *, removal_seconds: float = 1.0) -> None:
        super().__init__(store, informer)
        self.removal_seconds = removal_seconds

    def handle(self, event_type: str, resource: str, obj: dict[str, Any]) -> None:
        if resource == "nodes":
            self.queue.add(base.key_of(obj))

    def sync(self, key: Any) -> None:
        _, name = key
        try:
            node = self.store.get("nodes", name)
        except errors.NotFound:
            self._remove_pods(name)
            return
        now = self.clock.now()
        has_ready = any(c.get("type") == "Ready" for c in (node.get("status") or {}).get("conditions") or [])
        when = terminate_at(node)
        if when is not None and now >= when:
            self._reclaim(node, when, now)
            return
        if when is not None:
            self.queue.add_after(key, when - now)
        if not has_ready:
            self.store.mutate("nodes", name, None, lambda n: _set_ready(n, True, self.clock.iso()))
        elif not scheduler.node_ready(node):
            self._mark_pods_not_ready(name)

    def _reclaim(self, node: dict[str, Any], when: float, now: float) -> None:
        name = node["metadata"]["name"]
        if scheduler.node_ready(node):
            self.log.info("node reclaimed: NotReady", extra={"node": name})
            self.store.mutate("nodes", name, None, lambda n: _set_ready(n, False, self.clock.iso()))
            self._mark_pods_not_ready(name)
        remove_at = when + self.removal_seconds
        if now < remove_at:
            self.queue.add_after(("", name), remove_at - now)
            return
        self.log.info("node reclaimed: removed with its pods", extra={"node": name})
        self._remove_pods(name)
        with contextlib.suppress(errors.NotFound):
            self.store.remove("nodes", name)
        self._remove_pods(name)

    def _mark_pods_not_ready(self, node_name: str) -> None:
        now = self.clock.iso()
        for p in self.informer.pods_on_node(node_name):
            if not pods.is_ready(p):
                continue

            def edit(pod: dict[str, Any]) -> None:
                pods.set_condition(pod, "Ready", "False", now, reason="NodeNotReady")
                for cs in (pod.get("status") or {}).get("containerStatuses") or []:
                    cs["ready"] = False

            with contextlib.suppress(errors.NotFound):
                self.store.mutate("pods", p["metadata"]["name"], p["metadata"]["namespace"], edit)

    def _remove_pods(self, node_name: str) -> None:
        for p in self.informer.pods_on_node(node_name):
            with contextlib.suppress(errors.NotFound):
                self.store.remove("pods", p["metadata"]["name"], p["metadata"]["namespace"])
