"""Pod garbage collection (pkg/controller/podgc/gc_controller.go).

The collector runs every ``gcCheckPeriod`` (20 s). A pod bound to a node that
does not exist is an orphan: its node is quarantined for ``quarantineTime``
(40 s) in case it shows up, then the pod is marked Failed with the
``DisruptionTarget`` condition (reason ``DeletionByPodGC``) and deleted with no
grace period. Terminating pods on a not Ready node tainted
``node.kubernetes.io/out-of-service`` and terminating pods never scheduled are
force-deleted as well. Terminated-pod thresholds are not modelled.

Its requests go through its own client's token bucket (``--kube-api-qps`` 20, burst 30;
``ClientOrDie("pod-garbage-collector")``): a GET of each quarantined node missing from its
informer (``checkIfNodeExists``), then for each pod the PATCH of its status (unless it has
terminated already) and the DELETE (``markFailedAndDeletePodWithCondition``).
"""

from __future__ import annotations

import contextlib
from typing import Any

from spotguard_sim import errors, pods, scheduler, settings
from spotguard_sim.controllers import base, instances

OUT_OF_SERVICE = "node.kubernetes.io/out-of-service"


class PodGCController(base.Controller):
    name = "pod-garbage-collector"
    primary = ""

    def __init__(self, store: Any, informer: base.Informer, *, node_loss: settings.NodeLoss | None = None,
                 limits: settings.ControllerManager | None = None) -> None:
        super().__init__(store, informer)
        self.use_client(limits or settings.ControllerManager())
        loss = node_loss or settings.NodeLoss()
        self.period = loss.pod_gc_period
        self.quarantine = loss.pod_gc_quarantine
        self._missing_since: dict[str, float] = {}  # node -> the gc pass that first missed it

    def handle(self, event_type: str, resource: str, obj: dict[str, Any]) -> None:
        if resource == "nodes":
            taints = (obj.get("spec") or {}).get("taints") or []
            if event_type == "DELETED" or any(t.get("key") == OUT_OF_SERVICE for t in taints):
                self._after_next_pass(("node", obj["metadata"]["name"]))
        elif resource == "pods" and event_type != "DELETED":
            node = (obj.get("spec") or {}).get("nodeName")
            if node and self.informer.get("nodes", ("", node)) is None:
                self._after_next_pass(("node", node))
            elif not node and pods.is_terminating(obj):
                self._after_next_pass(("pod", base.key_of(obj)))

    def resync(self) -> None:
        nodes = {key[1] for key in (base.key_of(n) for n in self.informer.list("nodes"))}
        for p in self.informer.list("pods"):
            node = (p.get("spec") or {}).get("nodeName")
            if node and node not in nodes:
                self._after_next_pass(("node", node))

    def _after_next_pass(self, item: Any) -> None:
        now = self.clock.now()
        self.queue.add_after(item, instances.next_tick(now, self.period) - now)

    def sync(self, key: Any) -> None:
        kind, what = key
        if kind == "pod":
            pod = self.informer.get("pods", what)
            if pod is not None and pods.is_terminating(pod) and not (pod.get("spec") or {}).get("nodeName"):
                self._force_delete(pod, None)
            return
        node_name = str(what)
        now = self.clock.now()
        node = self.informer.get("nodes", ("", node_name))
        if node is None:
            self.request()  # checkIfNodeExists: a GET, not the lister
            try:
                node = self.store.get("nodes", node_name)
            except errors.NotFound:
                node = None
        if node is not None:
            self._missing_since.pop(node_name, None)
            out_of_service = any(t.get("key") == OUT_OF_SERVICE for t in (node.get("spec") or {}).get("taints") or [])
            if out_of_service and not scheduler.node_ready(node):
                for p in self.informer.pods_on_node(node_name):
                    if pods.is_terminating(p):
                        self._force_delete(p, None)
            return
        first = self._missing_since.setdefault(node_name, now)
        if now + 1e-6 < first + self.quarantine:
            self.queue.add_after(key, instances.next_tick(first + self.quarantine, self.period) - now)
            return
        self._missing_since.pop(node_name, None)
        for p in self.informer.pods_on_node(node_name):
            self._force_delete(p, ("DeletionByPodGC", "PodGC: node no longer exists"))

    def _force_delete(self, pod: dict[str, Any], condition: tuple[str, str] | None) -> None:
        """markFailedAndDeletePodWithCondition: phase Failed (and the condition), then delete with grace 0."""
        meta = pod["metadata"]
        now = self.clock.iso()
        self.log.info("force deleting pod", extra={"pod": meta["name"], "namespace": meta["namespace"],
                                                   "node": (pod.get("spec") or {}).get("nodeName")})

        def fail(p: dict[str, Any]) -> None:
            status = p.setdefault("status", {})
            if status.get("phase") in ("Succeeded", "Failed"):
                return
            status["phase"] = "Failed"
            if condition is not None:
                pods.set_condition(p, "DisruptionTarget", "True", now, reason=condition[0], message=condition[1])

        with contextlib.suppress(errors.NotFound):
            self.write("pods", meta["name"], meta["namespace"], fail)  # PatchPodStatus
            self.request()
            self.store.delete("pods", meta["name"], meta["namespace"], grace_period_seconds=0,
                              preconditions={"uid": meta["uid"]})
