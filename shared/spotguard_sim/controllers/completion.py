"""Containers that exit: the kubelet's side of run-to-completion pods.

No container runs in the simulated cluster, so a pod that is meant to finish
says how long it runs: the annotation ``sim.spotguard.io/run-seconds`` (on the
pod or its template; a scenario setting), or, for a pod owned by a Job,
``job_run_seconds`` of the controllers (default ``DEFAULT_JOB_RUN_SECONDS``).
That long after it started, its containers exit with
``sim.spotguard.io/exit-code`` (default 0): with restartPolicy Never or
OnFailure the pod turns Succeeded (exit 0) or Failed, its containers
``terminated`` and its Ready condition False (reason PodCompleted), as the
kubelet reports (https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/#pod-phase).
A pod with restartPolicy Always never completes (its containers restart).
"""

from __future__ import annotations

import contextlib
from typing import Any

from spotguard_sim import clock as simclock
from spotguard_sim import errors, pods
from spotguard_sim.controllers import base

RUN_SECONDS = "sim.spotguard.io/run-seconds"
EXIT_CODE = "sim.spotguard.io/exit-code"
DEFAULT_JOB_RUN_SECONDS = 10.0


def run_seconds(pod: dict[str, Any], job_default: float) -> float | None:
    """How long the pod runs before its containers exit; None when it never exits."""
    spec = pod.get("spec") or {}
    if spec.get("restartPolicy", "Always") == "Always":
        return None
    raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(RUN_SECONDS)
    if raw is not None:
        try:
            return max(0.0, float(raw))
        except ValueError:
            return None
    ref = base.controller_ref(pod)
    if ref and ref.get("kind") == "Job":
        return job_default
    return None


class Completion(base.Controller):
    name = "kubelet-completion"
    primary = "pods"
    workers = 1
    resync_seconds = 30.0

    def __init__(self, store: Any, informer: base.Informer, *,
                 job_run_seconds: float = DEFAULT_JOB_RUN_SECONDS) -> None:
        super().__init__(store, informer)
        self.job_run_seconds = job_run_seconds

    def _due(self, pod: dict[str, Any]) -> float | None:
        status = pod.get("status") or {}
        if status.get("phase") != "Running" or pods.is_terminating(pod):
            return None
        seconds = run_seconds(pod, self.job_run_seconds)
        if seconds is None or not status.get("startTime"):
            return None
        return simclock.parse_iso(status["startTime"]) + seconds

    def handle(self, event_type: str, resource: str, obj: dict[str, Any]) -> None:
        if resource != "pods" or event_type == "DELETED":
            return
        due = self._due(obj)
        if due is not None:
            self.queue.add_after(base.key_of(obj), due - self.clock.now())

    def resync(self) -> None:
        for p in self.informer.list("pods"):
            if self._due(p) is not None:
                self.queue.add(base.key_of(p))

    def sync(self, key: Any) -> None:
        ns, name = key
        try:
            pod = self.store.get("pods", name, ns)
        except errors.NotFound:
            return
        due = self._due(pod)
        if due is None:
            return
        if due > self.clock.now() + 0.01:
            self.queue.add_after(key, due - self.clock.now())
            return
        raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(EXIT_CODE, "0")
        code = int(raw) if str(raw).lstrip("-").isdigit() else 1
        now = self.clock.iso()

        def edit(obj: dict[str, Any]) -> None:
            if self._due(obj) is None:
                return
            status = obj.setdefault("status", {})
            status["phase"] = "Succeeded" if code == 0 else "Failed"
            for kind in ("Ready", "ContainersReady"):
                pods.set_condition(obj, kind, "False", now, reason="PodCompleted")
            for cs in status.get("containerStatuses") or []:
                started = ((cs.get("state") or {}).get("running") or {}).get("startedAt", now)
                cs["ready"] = False
                cs["started"] = False
                cs["state"] = {"terminated": {
                    "exitCode": code, "reason": "Completed" if code == 0 else "Error",
                    "startedAt": started, "finishedAt": now,
                    "containerID": cs.get("containerID", "")}}

        with contextlib.suppress(errors.NotFound):
            self.store.mutate("pods", name, ns, edit)
