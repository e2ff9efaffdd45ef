"""HorizontalPodAutoscaler (autoscaling/v2) without metrics: it keeps the
target's replicas within [minReplicas, maxReplicas], as an HPA with steady
metrics would, and writes status.
https://kubernetes.io/docs/tasks/run-application/horizontal-pod-autoscale/
"""

from __future__ import annotations

from typing import Any

from spotguard.sim import errors
from spotguard.sim.controllers import base

TARGETS = {"Deployment": "deployments", "StatefulSet": "statefulsets", "ReplicaSet": "replicasets"}


class HPAController(base.Controller):
    name = "horizontal-pod-autoscaler"
    primary = "horizontalpodautoscalers"
    resync_seconds = 15.0  # --horizontal-pod-autoscaler-sync-period

    def handle(self, event_type: str, resource: str, obj: dict[str, Any]) -> None:
        if resource == self.primary:
            self.queue.add(base.key_of(obj))
            return
        ns, name = base.key_of(obj)
        for hpa in self.informer.list(self.primary, ns):
            ref = (hpa.get("spec") or {}).get("scaleTargetRef") or {}
            if TARGETS.get(ref.get("kind", "")) == resource and ref.get("name") == name:
                self.queue.add(base.key_of(hpa))

    def sync(self, key: Any) -> None:
        ns, name = key
        try:
            hpa = self.store.get(self.primary, name, ns)
        except errors.NotFound:
            return
        spec = hpa.get("spec") or {}
        ref = spec.get("scaleTargetRef") or {}
        resource = TARGETS.get(ref.get("kind", ""))
        lo = int(spec.get("minReplicas") or 1)
        hi = int(spec.get("maxReplicas") or lo)
        now = self.clock.iso()
        conditions: list[tuple[str, str, str, str]] = []
        status: dict[str, Any] = {"observedGeneration": hpa["metadata"].get("generation", 1)}
        target = None
        if resource:
            try:
                target = self.store.get(resource, ref.get("name", ""), ns)
            except errors.NotFound:
                target = None
        if target is None:
            conditions.append(("AbleToScale", "False", "FailedGetScale",
                               f"the HPA controller was unable to get the target's current scale: "
                               f"{ref.get('kind')} {ref.get('name')} not found"))
            status.update(currentReplicas=0, desiredReplicas=0)
        else:
            current = int((target.get("spec") or {}).get("replicas", 1) or 0)
            if current == 0 and lo != 0:
                desired = 0
                conditions.append(("ScalingActive", "False", "ScalingDisabled",
                                   "scaling is disabled since the replica count of the target is zero"))
            else:
                desired = min(max(current, lo), hi)
                conditions.append(("AbleToScale", "True", "ReadyForNewScale",
                                   "recommended size matches current size"))
                conditions.append(("ScalingActive", "True", "ValidMetricFound",
                                   "the HPA was able to successfully calculate a replica count "
                                   "(simulated steady metrics)"))
                if desired != current:
                    limit = ("TooManyReplicas", "the desired replica count is more than the maximum "
                             "replica count") if current > hi else (
                        "TooFewReplicas", "the desired replica count is less than the minimum "
                        "replica count")
                    conditions.append(("ScalingLimited", "True", *limit))
                else:
                    conditions.append(("ScalingLimited", "False", "DesiredWithinRange",
                                       "the desired count is within the acceptable range"))
            if desired != current:
                def scale(obj: dict[str, Any]) -> None:
                    obj["spec"]["replicas"] = desired

                self.log.info("rescaling target", extra={
                    "hpa": name, "namespace": ns, "target": ref.get("name"), "from": current,
                    "to": desired})
                self.store.mutate(resource, ref.get("name", ""), ns, scale)
                status["lastScaleTime"] = now
            status.update(
                currentReplicas=int((target.get("status") or {}).get("replicas") or current),
                desiredReplicas=desired,
            )

        def edit(obj: dict[str, Any]) -> None:
            old = obj.get("status") or {}
            prev = {c.get("type"): c for c in old.get("conditions") or []}
            out = []
            for kind, st, reason, message in conditions:
                p = prev.get(kind)
                transition = p["lastTransitionTime"] if p and p.get("status") == st and p.get(
                    "lastTransitionTime") else now
                out.append({"type": kind, "status": st, "reason": reason, "message": message,
                            "lastTransitionTime": transition})
            new = dict(status)
            if "lastScaleTime" not in new and old.get("lastScaleTime"):
                new["lastScaleTime"] = old["lastScaleTime"]
            new["currentMetrics"] = old.get("currentMetrics") or []
            new["conditions"] = out
            obj["status"] = new

        self.store.mutate(self.primary, name, ns, edit)
