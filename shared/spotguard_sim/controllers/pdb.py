"""Disruption controller (pkg/controller/disruption): PodDisruptionBudget status.

currentHealthy (Ready pods not being deleted and not just evicted),
desiredHealthy and expectedPods from minAvailable/maxUnavailable (ints and
percentages; percentages and maxUnavailable scale with the owning controllers'
replicas), disruptionsAllowed, disruptedPods expiry, the DisruptionAllowed
condition. https://kubernetes.io/docs/tasks/run-application/configure-pdb/

A status is written only where it changes (``updatePdbStatus`` returns early for an equal
status) and through the controller's own client's token bucket (``--kube-api-qps`` 20, burst
30; ``ClientOrDie("disruption-controller")``, cmd/kube-controller-manager/app/policy.go); its
reads are its informers'. A failed sync is requeued with the work queue's default limiter.
"""

from __future__ import annotations

import copy
from typing import Any

from spotguard_sim import clock as simclock
from spotguard_sim import disruption, errors, pods, settings
from spotguard_sim.controllers import base


class DisruptionController(base.Controller):
    name = "disruption-controller"
    primary = "poddisruptionbudgets"
    workers = 1
    resync_seconds = 30.0

    def __init__(self, store: Any, informer: base.Informer, *,
                 limits: settings.ControllerManager | None = None) -> None:
        super().__init__(store, informer)
        self.use_client(limits or settings.ControllerManager())

    def handle(self, event_type: str, resource: str, obj: dict[str, Any]) -> None:
        if resource == "poddisruptionbudgets":
            self.queue.add(base.key_of(obj))
            return
        ns = obj["metadata"].get("namespace", "")
        for pdb in self.informer.list("poddisruptionbudgets", ns):
            if resource != "pods" or disruption.pdb_selects(pdb, obj):
                self.queue.add_coalesced(base.key_of(pdb), 0.01)

    def _scale_of(self, ns: str, ref: dict[str, Any]) -> tuple[str, int] | None:
        kind, name = ref.get("kind"), ref.get("name", "")
        if kind == "ReplicaSet":
            rs = self.informer.get("replicasets", (ns, name))
            if rs is None:
                return None
            owner = base.controller_ref(rs)
            if owner and owner.get("kind") == "Deployment":
                d = self.informer.get("deployments", (ns, owner.get("name", "")))
                if d is None:
                    return None
                return d["metadata"]["uid"], int(d["spec"].get("replicas", 1) or 0)
            return rs["metadata"]["uid"], int(rs["spec"].get("replicas", 1) or 0)
        if kind == "StatefulSet":
            sts = self.informer.get("statefulsets", (ns, name))
            if sts is None:
                return None
            return sts["metadata"]["uid"], int(sts["spec"].get("replicas", 1) or 0)
        return None

    def _expected_scale(self, ns: str, selected: list[dict[str, Any]]) -> int | None:
        scales: dict[str, int] = {}
        for pod in selected:
            ref = base.controller_ref(pod)
            found = self._scale_of(ns, ref) if ref else None
            if found is None:
                return None
            scales[found[0]] = found[1]
        return sum(scales.values())

    def sync(self, key: Any) -> None:
        ns, name = key
        try:
            pdb = self.store.get("poddisruptionbudgets", name, ns)
        except errors.NotFound:
            return
        selected = [p for p in self.informer.list("pods", ns) if disruption.pdb_selects(pdb, p)]
        now = self.clock.now()
        status = pdb.get("status") or {}
        disrupted: dict[str, str] = {}
        next_check: float | None = None
        by_name = {p["metadata"]["name"]: p for p in selected}
        for pod_name, when in (status.get("disruptedPods") or {}).items():
            pod = by_name.get(pod_name)
            if pod is None or pods.is_terminating(pod):
                continue
            try:
                expires = simclock.parse_iso(when) + disruption.DELETION_TIMEOUT_SECONDS
            except ValueError:
                continue
            if expires > now:
                disrupted[pod_name] = when
                next_check = expires if next_check is None else min(next_check, expires)
        healthy = sum(
            1 for p in selected
            if not pods.is_terminating(p) and pods.is_ready(p) and p["metadata"]["name"] not in disrupted
        )
        spec = pdb.get("spec") or {}
        try:
            expected, desired = disruption.desired_healthy(
                spec, len(selected), self._expected_scale(ns, selected)
            )
            allowed = max(0, healthy - desired) if expected > 0 else 0
        except ValueError as exc:
            self.log.warning("budget cannot be computed", extra={"pdb": name, "namespace": ns,
                                                                  "error": str(exc)})
            expected, desired, allowed = 0, 0, 0  # failSafe
        if next_check is not None:
            self.queue.add_after(key, next_check - now + 0.1)
        now_iso = self.clock.iso(now)
        cond_status = "True" if allowed > 0 else "False"
        reason = "SufficientPods" if allowed > 0 else "InsufficientPods"
        generation = pdb["metadata"].get("generation", 1)

        def edit(obj: dict[str, Any]) -> None:
            old = obj.get("status") or {}
            prev = next((c for c in old.get("conditions") or [] if c.get("type") == "DisruptionAllowed"), None)
            transition = now_iso
            if prev and prev.get("status") == cond_status:
                transition = prev.get("lastTransitionTime", now_iso)
            new: dict[str, Any] = {
                "observedGeneration": generation,
                "disruptionsAllowed": allowed,
                "currentHealthy": healthy,
                "desiredHealthy": desired,
                "expectedPods": expected,
                "conditions": [{
                    "type": "DisruptionAllowed", "status": cond_status, "reason": reason,
                    "message": "", "observedGeneration": generation,
                    "lastTransitionTime": transition,
                }],
            }
            if disrupted:
                new["disruptedPods"] = disrupted
            obj["status"] = new

        probe = {"status": copy.deepcopy(status)}
        edit(probe)
        if probe["status"] == status:
            return  # updatePdbStatus: nothing changed, no request
        self.request()
        with self.store.lock:
            # do not overwrite an eviction's decrement that raced with this sync
            current = self.store.get("poddisruptionbudgets", name, ns)
            if (current.get("status") or {}).get("disruptedPods", {}) != (status.get("disruptedPods") or {}):
                self.queue.add(key)
                return
            self.store.mutate("poddisruptionbudgets", name, ns, edit)
