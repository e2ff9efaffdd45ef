"""Job controller (pkg/controller/job): pods until ``completions`` succeed.

Runs ``parallelism`` pods at a time (never more than the completions still
missing); counts finished pods exactly once through the
``batch.kubernetes.io/job-tracking`` finalizer it puts on every pod and removes
once the pod is counted, as upstream does; a Job whose failures exceed
``backoffLimit`` fails (BackoffLimitExceeded), one past ``activeDeadlineSeconds``
fails (DeadlineExceeded); ``suspend`` deletes the active pods; Indexed Jobs
give each pod its completion index. A finished Job is deleted
``ttlSecondsAfterFinished`` later (the TTL-after-finished controller).
Pods finish when their containers exit: see ``controllers.completion``.
https://kubernetes.io/docs/concepts/workloads/controllers/job/
"""

from __future__ import annotations

import contextlib
from typing import Any

from spotguard_sim import clock as simclock
from spotguard_sim import errors, pods
from spotguard_sim.controllers import base
from spotguard_sim.controllers.replicaset import pod_from_template

USER = base.service_account_user("job-controller")
TRACKING_FINALIZER = "batch.kubernetes.io/job-tracking"
# pod failure back-off: 10 s doubling per failure, at most 6 minutes (DefaultJobPodFailureBackOff,
# MaxJobPodFailureBackOff in pkg/controller/job/job_controller.go)
BACKOFF_SECONDS = 10.0
MAX_BACKOFF_SECONDS = 360.0
INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
INDEX_LABEL = "batch.kubernetes.io/job-completion-index"


def finished(job: dict[str, Any]) -> str | None:
    """"Complete" or "Failed" when the Job has finished, else None."""
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("type") in ("Complete", "Failed") and cond.get("status") == "True":
            return str(cond["type"])
    return None


def _index(pod: dict[str, Any]) -> int | None:
    raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(INDEX_ANNOTATION)
    return int(raw) if raw is not None and str(raw).isdigit() else None


class JobController(base.Controller):
    name = "job-controller"
    primary = "jobs"
    workers = 2

    def handle(self, event_type: str, resource: str, obj: dict[str, Any]) -> None:
        if resource == "jobs":
            self.queue.add(base.key_of(obj))
        elif resource == "pods":
            ref = base.controller_ref(obj)
            if ref and ref.get("kind") == "Job":
                self.queue.add_coalesced((obj["metadata"].get("namespace", ""), ref.get("name", "")))

    def sync(self, key: Any) -> None:
        ns, name = key
        try:
            job = self.store.get("jobs", name, ns)
        except errors.NotFound:
            return
        owned = self.informer.pods_owned_by(job["metadata"]["uid"])
        succeeded, failed, done_indexes = self._count_finished(job, owned)
        if succeeded or failed:
            job = self.store.get("jobs", name, ns)
        spec = job.get("spec") or {}
        status = job.get("status") or {}
        total_ok = int(status.get("succeeded") or 0) + succeeded
        total_failed = int(status.get("failed") or 0) + failed
        completed = set(_parse_indexes(status.get("completedIndexes"))) | done_indexes
        active = [p for p in self.informer.pods_owned_by(job["metadata"]["uid"])
                  if pods.is_active(p) and (p.get("status") or {}).get("phase")
                  not in ("Succeeded", "Failed")]
        now = self.clock.now()
        outcome = finished(job)
        new_conditions: list[tuple[str, str, str]] = []
        completions = spec.get("completions")
        indexed = spec.get("completionMode") == "Indexed"
        if outcome is None and not job["metadata"].get("deletionTimestamp"):
            deadline = spec.get("activeDeadlineSeconds")
            started = status.get("startTime")
            if total_failed > int(spec.get("backoffLimit", 6)):
                new_conditions.append(("Failed", "BackoffLimitExceeded",
                                       "Job has reached the specified backoff limit"))
            elif deadline is not None and started and (
                    now - simclock.parse_iso(started) >= float(deadline)):
                new_conditions.append(("Failed", "DeadlineExceeded",
                                       "Job was active longer than specified deadline"))
            elif (indexed and completions is not None and len(completed) >= int(completions)) or (
                    not indexed and completions is not None and total_ok >= int(completions)) or (
                    completions is None and total_ok > 0 and not active):
                new_conditions.append(("Complete", "CompletionsReached",
                                       "Reached expected number of succeeded pods"))
            if new_conditions or spec.get("suspend"):
                for p in active:
                    self._delete(p)
                active = []
            elif (wait := self._backoff(job, total_failed, now)) > 0:
                self.queue.add_after(key, wait)  # no replacement before the back-off ends
            else:
                active = self._scale(job, active, total_ok, completed)
                if deadline is not None and started:
                    self.queue.add_after(key, simclock.parse_iso(started) + float(deadline) - now)
        self._write_status(job, active, succeeded, failed, done_indexes,
                           conditions=new_conditions)
        for kind, reason, message in new_conditions:
            if kind == "Complete":
                self.event(job, "Normal", "Completed", "Job completed")
            else:
                self.event(job, "Warning", reason, message)
        ttl = spec.get("ttlSecondsAfterFinished")
        if ttl is not None and (outcome or new_conditions):
            self._expire(job, float(ttl))

    def _backoff(self, job: dict[str, Any], failures: int, now: float) -> float:
        """Seconds until a pod may replace a failed one (0 when it may now)."""
        if failures <= 0:
            return 0.0
        last = 0.0
        for p in self.informer.pods_owned_by(job["metadata"]["uid"]):
            if (p.get("status") or {}).get("phase") != "Failed":
                continue
            for cs in (p.get("status") or {}).get("containerStatuses") or []:
                finished = ((cs.get("state") or {}).get("terminated") or {}).get("finishedAt")
                if finished:
                    last = max(last, simclock.parse_iso(finished))
        delay = min(BACKOFF_SECONDS * 2 ** (failures - 1), MAX_BACKOFF_SECONDS)
        return max(0.0, last + delay - now) if last else 0.0

    def _count_finished(self, job: dict[str, Any], owned: list[dict[str, Any]]
                        ) -> tuple[int, int, set[int]]:
        """Remove the tracking finalizer of finished pods; count each pod once."""
        succeeded = failed = 0
        indexes: set[int] = set()
        for p in owned:
            phase = (p.get("status") or {}).get("phase")
            finalizers = p["metadata"].get("finalizers") or []
            if TRACKING_FINALIZER not in finalizers:
                continue
            if phase not in ("Succeeded", "Failed") and not pods.is_terminating(p):
                continue
            removed = [False]

            def release(pod: dict[str, Any], flag: list[bool] = removed) -> None:
                fins = pod["metadata"].get("finalizers") or []
                if TRACKING_FINALIZER in fins:
                    fins.remove(TRACKING_FINALIZER)
                    pod["metadata"]["finalizers"] = fins
                    flag[0] = True

            with contextlib.suppress(errors.NotFound):
                fresh = self.store.mutate("pods", p["metadata"]["name"], p["metadata"]["namespace"],
                                          release)
                phase = (fresh.get("status") or {}).get("phase")
            if not removed[0] or phase not in ("Succeeded", "Failed"):
                continue  # a pod deleted before it finished is not counted
            if phase == "Succeeded":
                succeeded += 1
                index = _index(p)
                if index is not None:
                    indexes.add(index)
            else:
                failed += 1
        return succeeded, failed, indexes

    def _scale(self, job: dict[str, Any], active: list[dict[str, Any]], total_ok: int,
               completed: set[int]) -> list[dict[str, Any]]:
        spec = job.get("spec") or {}
        parallelism = int(spec.get("parallelism", 1) or 0)
        completions = spec.get("completions")
        if spec.get("completionMode") == "Indexed" and completions is not None:
            running = {_index(p) for p in active}
            missing = [i for i in range(int(completions)) if i not in completed and i not in running]
            for i in missing[:max(0, parallelism - len(active))]:
                self._create(job, i)
            return active
        wanted = parallelism
        if completions is not None:
            wanted = min(parallelism, max(0, int(completions) - total_ok))
        elif total_ok > 0:
            wanted = 0  # work queue Jobs: no new pods once one succeeded
        for _ in range(wanted - len(active)):
            self._create(job, None)
        if len(active) > wanted:
            for p in sorted(active, key=lambda x: x["metadata"].get("creationTimestamp", ""),
                            reverse=True)[:len(active) - wanted]:
                self._delete(p)
        return active

    def _create(self, job: dict[str, Any], index: int | None) -> None:
        spec = job.get("spec") or {}
        pod = pod_from_template(job, "Job", spec.get("template") or {})
        meta = pod["metadata"]
        meta["ownerReferences"][0]["apiVersion"] = "batch/v1"
        meta["finalizers"] = [*meta.get("finalizers", []), TRACKING_FINALIZER]
        if index is not None:
            meta["generateName"] = f"{job['metadata']['name']}-{index}-"
            meta.setdefault("annotations", {})[INDEX_ANNOTATION] = str(index)
            meta["labels"][INDEX_LABEL] = str(index)
            pod["spec"].setdefault("hostname", f"{job['metadata']['name']}-{index}")
        created = self.store.create("pods", pod, namespace=meta["namespace"], user=USER)
        self.event(job, "Normal", "SuccessfulCreate", f"Created pod: {created['metadata']['name']}")

    def _delete(self, pod: dict[str, Any]) -> None:
        with contextlib.suppress(errors.NotFound, errors.Conflict):
            self.store.delete("pods", pod["metadata"]["name"], pod["metadata"]["namespace"],
                              preconditions={"uid": pod["metadata"]["uid"]})

    def _write_status(self, job: dict[str, Any], active: list[dict[str, Any]], succeeded: int,
                      failed: int, indexes: set[int], *,
                      conditions: list[tuple[str, str, str]]) -> None:
        now = self.clock.iso()
        suspended = bool((job.get("spec") or {}).get("suspend"))
        ready = sum(1 for p in active if pods.is_ready(p))
        terminating = sum(1 for p in self.informer.pods_owned_by(job["metadata"]["uid"])
                          if pods.is_terminating(p))

        def edit(obj: dict[str, Any]) -> None:
            status = obj.setdefault("status", {})
            if not suspended and not status.get("startTime"):
                status["startTime"] = now
            for field, add in (("succeeded", succeeded), ("failed", failed)):
                total = int(status.get(field) or 0) + add
                if total:
                    status[field] = total
            if indexes:
                done = set(_parse_indexes(status.get("completedIndexes"))) | indexes
                status["completedIndexes"] = _format_indexes(done)
            if active:
                status["active"] = len(active)
            else:
                status.pop("active", None)
            status["ready"] = ready
            status["terminating"] = terminating
            status["uncountedTerminatedPods"] = {}
            conds = [c for c in status.get("conditions") or [] if c.get("type") != "Suspended"]
            if suspended:
                conds.append({"type": "Suspended", "status": "True", "reason": "JobSuspended",
                              "message": "Job suspended", "lastProbeTime": now,
                              "lastTransitionTime": now})
            for kind, reason, message in conditions:
                target = "SuccessCriteriaMet" if kind == "Complete" else "FailureTarget"
                for t in (target, kind):
                    conds.append({"type": t, "status": "True", "reason": reason,
                                  "message": message, "lastProbeTime": now,
                                  "lastTransitionTime": now})
                if kind == "Complete":
                    status["completionTime"] = now
            if conds:
                status["conditions"] = conds

        with contextlib.suppress(errors.NotFound):
            self.store.mutate("jobs", job["metadata"]["name"], job["metadata"]["namespace"], edit)

    def _expire(self, job: dict[str, Any], ttl: float) -> None:
        """The TTL-after-finished controller: delete the Job (and, in the background, its pods)."""
        cond = next((c for c in (job.get("status") or {}).get("conditions") or []
                     if c.get("type") in ("Complete", "Failed")), None)
        done_at = simclock.parse_iso(cond["lastTransitionTime"]) if cond else self.clock.now()
        wait = done_at + ttl - self.clock.now()
        if wait > 0:
            self.queue.add_after(base.key_of(job), wait)
            return
        with contextlib.suppress(errors.NotFound):
            self.store.delete("jobs", job["metadata"]["name"], job["metadata"]["namespace"],
                              propagation_policy="Background",
                              preconditions={"uid": job["metadata"]["uid"]})


def _parse_indexes(text: Any) -> list[int]:
    out: list[int] = []
    for part in str(text or "").split(","):
        if "-" in part:
            lo, hi = part.split("-", 1)
            out.extend(range(int(lo), int(hi) + 1))
        elif part.strip().isdigit():
            out.append(int(part))
    return out


def _format_indexes(indexes: set[int]) -> str:
    """``1,3-5``: the compressed interval form of status.completedIndexes."""
    parts: list[str] = []
    for i in sorted(indexes):
        if parts and "-" not in parts[-1].split(",")[-1] and int(parts[-1]) == i - 1:
            parts[-1] = f"{i - 1}-{i}"
        elif parts and "-" in parts[-1] and int(parts[-1].split("-")[1]) == i - 1:
            parts[-1] = f"{parts[-1].split('-')[0]}-{i}"
        else:
            parts.append(str(i))
    return ",".join(parts)
