"""HorizontalPodAutoscaler (autoscaling/v2) controller (pkg/controller/podautoscaler).

Each HPA is reconciled on its own sync period (``SYNC_SECONDS``, the controller
manager's ``--horizontal-pod-autoscaler-sync-period`` default of 15 s), never
because its target changed: a target scaled out of range by someone else stays
so until the next sync, as upstream. A created HPA is first reconciled one sync
period later, and a changed one (its minimum raised, say) at its next sync, not at
once: upstream's event handlers add the HPA to the queue rate limited by a
FixedItemIntervalRateLimiter of the sync period, and an HPA already waiting keeps
its earlier time ("Requests are always added to queue with resyncPeriod delay. If
there's already request for the HPA in the queue then a new request is always
dropped", pkg/controller/podautoscaler/horizontal.go ``enqueueHPA``,
``processNextWorkItem``; rate_limiters.go ``NewDefaultHPARateLimiter``).

At a sync, as ``reconcileAutoscaler`` does:
- a target at 0 replicas with minReplicas > 0: scaling is disabled;
- above maxReplicas / below minReplicas: set to the bound at once;
- otherwise the metrics' recommendation goes through the behaviour: the
  stabilization windows (scale up: the lowest recommendation of the last
  ``scaleUp.stabilizationWindowSeconds``, default 0; scale down: the highest of
  the last ``scaleDown.stabilizationWindowSeconds``, default 300 s; the window
  starts filled with the replicas at the first sync) and the rate policies
  (defaults: up max(100 %, 4 pods) per 15 s, down 100 % per 15 s; selectPolicy
  Max / Min / Disabled), then min/max.
Its requests go through two token buckets (``--kube-api-qps`` 20, burst 30 each;
cmd/kube-controller-manager/app/autoscaling.go): the scale client's (made from
``ConfigOrDie("horizontal-pod-autoscaler")``: the target's scale GET and its update) and the
HPA client's (``ClientOrDie``: the status update, sent only where the status changes,
``updateStatusIfNeeded``). A sync that fails is tried again one sync period later, as every
sync (``NewDefaultHPARateLimiter``: a ``FixedItemIntervalRateLimiter``, no exponential
back-off).
No metrics server runs; the load is modelled (``LoadModel``): a workload's total load
is constant, the load of ``N`` pods at the target utilization, shared by the pods
that serve it, so a surge lowers every pod's utilization and the HPA's recommendation
goes back to ``N`` (the restore then meets the scale-down stabilization window). ``N``
is the target's replica count at the HPA's first sync, or the annotation
``sim.spotguard.io/load-replicas: "N"`` (a scenario setting); ``"current"`` keeps
each pod at the target whatever the count (the model before 2026-11-29, which never
challenged a surge). The recommendation is upstream's replica calculator
(pkg/controller/podautoscaler/replica_calculator.go ``calcPlainMetricReplicas``,
``groupPods``): the utilization an integer percentage of the requests
(metrics/utilization.go ``GetResourceUtilizationRatio``), a tolerance of 0.1
(``--horizontal-pod-autoscaler-tolerance``), pods deleting or Failed ignored, Pending or
not-yet-Ready pods counted at 0 % on a scale up and left out otherwise, a pod within
its cpu initialization period (``--horizontal-pod-autoscaler-cpu-initialization-period``,
5 min) counted only once it has been Ready for one metrics window, and one past it left
out only when it has never been Ready (``--horizontal-pod-autoscaler-initial-readiness-delay``,
30 s). A target without a Resource utilization metric gets upstream's default, cpu
at 80 % (pkg/apis/autoscaling/v2/defaults.go).
https://kubernetes.io/docs/tasks/run-application/horizontal-pod-autoscale/#algorithm-details
https://kubernetes.io/docs/tasks/run-application/horizontal-pod-autoscale/#configurable-scaling-behavior
"""

from __future__ import annotations

import copy
import math
import threading
from typing import Any

from spotguard_sim import clock as simclock
from spotguard_sim import errors, selectors, settings
from spotguard_sim import pods as pod_util
from spotguard_sim.controllers import base, ratelimit

TARGETS = {"Deployment": "deployments", "StatefulSet": "statefulsets", "ReplicaSet": "replicasets",
           "ReplicationController": "replicationcontrollers"}
SYNC_SECONDS = 15.0  # --horizontal-pod-autoscaler-sync-period
LOAD_REPLICAS = "sim.spotguard.io/load-replicas"
LOAD_FOLLOWS_COUNT = "current"  # the annotation's value for "each pod stays at the target"
TOLERANCE = 0.1  # --horizontal-pod-autoscaler-tolerance
CPU_INITIALIZATION_SECONDS = 300.0  # --horizontal-pod-autoscaler-cpu-initialization-period
INITIAL_READINESS_DELAY_SECONDS = 30.0  # --horizontal-pod-autoscaler-initial-readiness-delay
METRIC_WINDOW_SECONDS = 15.0  # metrics-server's --metric-resolution: the window of a sample
DEFAULT_UTILIZATION = 80  # pkg/apis/autoscaling/v2/defaults.go: cpu at 80 % when no metric is set
# pkg/apis/autoscaling/v2/defaults.go GenerateHPAScaleUpRules / GenerateHPAScaleDownRules
DEFAULT_SCALE_UP = {"stabilizationWindowSeconds": 0, "selectPolicy": "Max", "policies": [
    {"type": "Percent", "value": 100, "periodSeconds": 15},
    {"type": "Pods", "value": 4, "periodSeconds": 15}]}
DEFAULT_SCALE_DOWN = {"stabilizationWindowSeconds": 300, "selectPolicy": "Max", "policies": [
    {"type": "Percent", "value": 100, "periodSeconds": 15}]}


def _rules(hpa: dict[str, Any], direction: str) -> dict[str, Any]:
    default = DEFAULT_SCALE_UP if direction == "scaleUp" else DEFAULT_SCALE_DOWN
    given = ((hpa.get("spec") or {}).get("behavior") or {}).get(direction) or {}
    return {**default, **{k: v for k, v in given.items() if v is not None}}


def _events_total(events: list[tuple[float, int]], now: float, period: float) -> int:
    return sum(change for at, change in events if at > now - period)


def scale_up_limit(current: int, rules: dict[str, Any], ups: list[tuple[float, int]],
                   downs: list[tuple[float, int]], now: float) -> int:
    """calculateScaleUpLimitWithScalingRules."""
    policy = rules.get("selectPolicy", "Max")
    if policy == "Disabled":
        return current
    limits = []
    for p in rules.get("policies") or []:
        period = float(p.get("periodSeconds") or 15)
        start = current - _events_total(ups, now, period) + _events_total(downs, now, period)
        if p.get("type") == "Pods":
            limits.append(start + int(p.get("value") or 0))
        else:
            limits.append(math.ceil(start * (1 + float(p.get("value") or 0) / 100)))
    if not limits:
        return current
    return max(limits) if policy == "Max" else min(limits)


def scale_down_limit(current: int, rules: dict[str, Any], ups: list[tuple[float, int]],
                     downs: list[tuple[float, int]], now: float) -> int:
    """calculateScaleDownLimitWithBehaviors."""
    policy = rules.get("selectPolicy", "Max")
    if policy == "Disabled":
        return current
    limits = []
    for p in rules.get("policies") or []:
        period = float(p.get("periodSeconds") or 15)
        start = current + _events_total(downs, now, period) - _events_total(ups, now, period)
        if p.get("type") == "Pods":
            limits.append(start - int(p.get("value") or 0))
        else:
            limits.append(math.ceil(start * (1 - float(p.get("value") or 0) / 100)))
    if not limits:
        return current
    return min(limits) if policy == "Max" else max(limits)


def target_utilization(hpa: dict[str, Any]) -> int:
    """The first Resource metric's averageUtilization; upstream's default (cpu at 80 %)
    when the HPA names none. Other metric types are modelled as a utilization too."""
    for metric in (hpa.get("spec") or {}).get("metrics") or []:
        target = ((metric or {}).get("resource") or {}).get("target") or {}
        if metric.get("type") == "Resource" and target.get("averageUtilization"):
            return int(target["averageUtilization"])
    return DEFAULT_UTILIZATION


def group_pods(pods: list[dict[str, Any]], now: float) -> tuple[int, int]:
    """replica_calculator.go ``groupPods`` for cpu, every running pod having a sample taken
    now: (ready, unready). Deleting and Failed pods are ignored; a Pending pod, or one with no
    Ready condition or start time, is unready; within the cpu initialization period a pod is
    unready while not Ready or Ready for less than one metrics window; past it, only when not
    Ready and never Ready (its last transition within the initial readiness delay of its
    start)."""
    ready = unready = 0
    for pod in pods:
        status = pod.get("status") or {}
        if (pod.get("metadata") or {}).get("deletionTimestamp") or status.get("phase") == "Failed":
            continue
        condition = pod_util.condition(pod, "Ready")
        start = status.get("startTime")
        if status.get("phase") == "Pending" or condition is None or not start:
            unready += 1
            continue
        started = simclock.parse_iso(str(start))
        since = simclock.parse_iso(str(condition.get("lastTransitionTime") or start))
        if started + CPU_INITIALIZATION_SECONDS > now:
            not_counted = condition.get("status") == "False" or now < since + METRIC_WINDOW_SECONDS
        else:
            not_counted = condition.get("status") == "False" and started + INITIAL_READINESS_DELAY_SECONDS > since
        if not_counted:
            unready += 1
        else:
            ready += 1
    return ready, unready


def recommend(load: int, target: int, ready: int, unready: int, current: int) -> tuple[int | None, int]:
    """replica_calculator.go ``calcPlainMetricReplicas`` for a total load of ``load`` pods at
    the target utilization shared by the ready pods: (recommended replicas, utilization %);
    None when no ready pod gives a sample (upstream: no metrics, no scaling)."""
    if ready == 0:
        return None, 0
    utilization = load * target // ready  # GetResourceUtilizationRatio: an integer percentage
    ratio = utilization / target
    if not (unready > 0 and ratio > 1.0):
        if abs(1.0 - ratio) <= TOLERANCE:
            return current, utilization
        return math.ceil(ratio * ready), utilization
    # a scale up with unready pods: they count at 0 % of their requests
    new_ratio = (load * target // (ready + unready)) / target
    if abs(1.0 - new_ratio) <= TOLERANCE or new_ratio < 1.0:
        return current, utilization
    return max(current, math.ceil(new_ratio * (ready + unready))), utilization


class HPAController(base.Controller):
    name = "horizontal-pod-autoscaler"
    primary = "horizontalpodautoscalers"
    resync_seconds = SYNC_SECONDS

    def __init__(self, store: Any, informer: base.Informer, *,
                 limits: settings.ControllerManager | None = None) -> None:
        super().__init__(store, informer)
        limits = limits or settings.ControllerManager()
        self.use_client(limits)  # hpaClient: the HPAs' status
        self.scale_client = ratelimit.TokenBucket(self.clock, limits.kube_api_qps, limits.kube_api_burst)
        self.retries = ratelimit.FixedIntervalRateLimiter(SYNC_SECONDS)
        self._state_lock = threading.Lock()
        self._recommendations: dict[str, list[tuple[float, int]]] = {}
        self._ups: dict[str, list[tuple[float, int]]] = {}
        self._downs: dict[str, list[tuple[float, int]]] = {}
        self._due: dict[base.Key, float] = {}
        self._loads: dict[str, int] = {}  # uid: the target's count at the first sync

    def handle(self, event_type: str, resource: str, obj: dict[str, Any]) -> None:
        """A created HPA syncs one sync period later; a changed one at its next sync (module
        docstring); changes of its target wait for it too (upstream does not watch targets)."""
        if resource != self.primary or event_type == "DELETED":
            return
        key = base.key_of(obj)
        if key in self._due:
            return
        self._due[key] = self.clock.now() + SYNC_SECONDS
        self.queue.add_after(key, SYNC_SECONDS)

    def resync(self) -> None:
        now = self.clock.now()
        for obj in self.informer.list(self.primary):
            key = base.key_of(obj)
            if self._due.get(key, 0.0) <= now:
                self.queue.add(key)

    def sync(self, key: Any) -> None:
        ns, name = key
        try:
            hpa = self.store.get(self.primary, name, ns)
        except errors.NotFound:
            self._due.pop(key, None)
            return
        now = self.clock.now()
        due = self._due.get(key)
        if due is not None and due > now + 0.01:
            self.queue.add_after(key, due - now)
            return
        self._due[key] = now + SYNC_SECONDS
        self.queue.add_after(key, SYNC_SECONDS)
        self._reconcile(hpa, now)

    def _reconcile(self, hpa: dict[str, Any], now: float) -> None:
        ns, name = hpa["metadata"]["namespace"], hpa["metadata"]["name"]
        uid = str(hpa["metadata"]["uid"])
        spec = hpa.get("spec") or {}
        ref = spec.get("scaleTargetRef") or {}
        resource = TARGETS.get(ref.get("kind", ""))
        lo = int(spec.get("minReplicas") or 1)
        hi = int(spec.get("maxReplicas") or lo)
        iso = self.clock.iso()
        conditions: list[tuple[str, str, str, str]] = []
        status: dict[str, Any] = {"observedGeneration": hpa["metadata"].get("generation", 1)}
        target = None
        if resource:
            try:
                self.scale_client.wait(self._stop)  # scaleNamespacer.Get
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
            desired = self._desired(hpa, uid, current, target, lo=lo, hi=hi, now=now, conditions=conditions,
                                    status=status)
            if desired != current:
                def scale(obj: dict[str, Any]) -> None:
                    obj["spec"]["replicas"] = desired

                self.log.info("rescaling target", extra={
                    "hpa": name, "namespace": ns, "target": ref.get("name"), "from": current,
                    "to": desired})
                self.scale_client.wait(self._stop)  # scaleNamespacer.Update
                self.store.mutate(resource, ref.get("name", ""), ns, scale)
                self.event(hpa, "Normal", "SuccessfulRescale", f"New size: {desired}; reason: "
                           + next((c[3] for c in conditions if c[0] == "ScalingLimited" and c[1] == "True"),
                                  "the load changed"))
                with self._state_lock:
                    events = self._ups if desired > current else self._downs
                    events.setdefault(uid, []).append((now, abs(desired - current)))
                status["lastScaleTime"] = iso
            status.update(
                currentReplicas=int((target.get("status") or {}).get("replicas") or current),
                desiredReplicas=desired,
            )
        self._write_status(hpa, status, conditions, iso)

    def _desired(self, hpa: dict[str, Any], uid: str, current: int, target: dict[str, Any], *, lo: int,
                 hi: int, now: float, conditions: list[tuple[str, str, str, str]],
                 status: dict[str, Any]) -> int:
        if current == 0 and lo != 0:
            conditions.append(("ScalingActive", "False", "ScalingDisabled",
                               "scaling is disabled since the replica count of the target is zero"))
            return 0
        conditions.append(("AbleToScale", "True", "ReadyForNewScale",
                           "recommended size matches current size"))
        with self._state_lock:
            history = self._recommendations.setdefault(uid, [(now, current)])
            first_count = self._loads.setdefault(uid, current)
        if current > hi:
            conditions.append(("ScalingLimited", "True", "TooManyReplicas",
                               "the desired replica count is more than the maximum replica count"))
            return hi
        if current < lo:
            conditions.append(("ScalingLimited", "True", "TooFewReplicas",
                               "the desired replica count is less than the minimum replica count"))
            return lo
        raw = self._recommendation(hpa, current, target, first_count=first_count, now=now,
                                   conditions=conditions, status=status)
        if raw is None:
            return current  # no metrics: upstream's reconcile stops before it scales
        up_rules, down_rules = _rules(hpa, "scaleUp"), _rules(hpa, "scaleDown")
        up_window = float(up_rules.get("stabilizationWindowSeconds") or 0)
        down_window = float(down_rules.get("stabilizationWindowSeconds") or 0)
        with self._state_lock:
            up_rec = down_rec = raw
            for at, rec in history:
                if at > now - up_window:
                    up_rec = min(up_rec, rec)
                if at > now - down_window:
                    down_rec = max(down_rec, rec)
            keep = max(up_window, down_window)
            history[:] = [(at, r) for at, r in history if at > now - keep] + [(now, raw)]
            ups = list(self._ups.get(uid, []))
            downs = list(self._downs.get(uid, []))
        stabilized = min(max(current, up_rec), down_rec)
        desired = stabilized
        reason = ("ScalingLimited", "False", "DesiredWithinRange",
                  "the desired count is within the acceptable range")
        if stabilized > current:
            limit = max(scale_up_limit(current, up_rules, ups, downs, now), current)
            allowed = min(hi, limit)
            if stabilized > allowed:
                desired = allowed
                reason = ("ScalingLimited", "True", "ScaleUpLimit" if limit < hi else "TooManyReplicas",
                          "the desired replica count is increasing faster than the maximum scale rate"
                          if limit < hi else "the desired replica count is more than the maximum "
                          "replica count")
        elif stabilized < current:
            limit = min(scale_down_limit(current, down_rules, ups, downs, now), current)
            allowed = max(lo, limit)
            if stabilized < allowed:
                desired = allowed
                reason = ("ScalingLimited", "True", "ScaleDownLimit" if limit > lo else "TooFewReplicas",
                          "the desired replica count is decreasing faster than the maximum scale rate"
                          if limit > lo else "the desired replica count is less than the minimum "
                          "replica count")
        conditions.append(reason)
        return desired

    def _recommendation(self, hpa: dict[str, Any], current: int, target: dict[str, Any], *, first_count: int,
                        now: float, conditions: list[tuple[str, str, str, str]],
                        status: dict[str, Any]) -> int | None:
        """The metrics' recommendation under the load model (module docstring)."""
        given = str(((hpa.get("metadata") or {}).get("annotations") or {}).get(LOAD_REPLICAS) or "")
        if given == LOAD_FOLLOWS_COUNT:
            conditions.append(("ScalingActive", "True", "ValidMetricFound",
                               "the HPA was able to successfully calculate a replica count "
                               "(simulated load that follows the count)"))
            return current
        load = int(given) if given.isdigit() else first_count
        selector = (target.get("spec") or {}).get("selector") or {}
        if selector and "matchLabels" not in selector and "matchExpressions" not in selector:
            selector = {"matchLabels": selector}  # a ReplicationController's map
        ns = hpa["metadata"]["namespace"]
        selected = [p for p in self.informer.list("pods", ns)
                if selector and selectors.matches(selector, (p.get("metadata") or {}).get("labels"))]
        ready, unready = group_pods(selected, now)
        utilization_target = target_utilization(hpa)
        raw, utilization = recommend(load, utilization_target, ready, unready, current)
        if raw is None:
            conditions.append(("ScalingActive", "False", "FailedGetResourceMetric",
                               "the HPA was unable to compute the replica count: did not receive "
                               "metrics for targeted pods (pods might be unready)"))
            return None
        conditions.append(("ScalingActive", "True", "ValidMetricFound",
                           "the HPA was able to successfully calculate a replica count from cpu "
                           "resource utilization (percentage of request)"))
        status["currentMetrics"] = [{"type": "Resource", "resource": {
            "name": "cpu", "current": {"averageUtilization": utilization}}}]
        return raw

    def _write_status(self, hpa: dict[str, Any], status: dict[str, Any],
                      conditions: list[tuple[str, str, str, str]], now: str) -> None:
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
            new["currentMetrics"] = status.get("currentMetrics", old.get("currentMetrics") or [])
            new["conditions"] = out
            obj["status"] = new

        probe = {"status": copy.deepcopy(hpa.get("status") or {})}
        edit(probe)
        if probe["status"] == (hpa.get("status") or {}):
            return  # updateStatusIfNeeded: an equal status is not written
        self.request()
        self.store.mutate(self.primary, hpa["metadata"]["name"], hpa["metadata"]["namespace"], edit)
