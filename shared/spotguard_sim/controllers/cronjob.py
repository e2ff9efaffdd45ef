"""CronJob controller (pkg/controller/cronjob, the v2 controller): a Job per
scheduled time.

At each time of ``spec.schedule`` (in ``spec.timeZone``, UTC by default) it
creates the Job ``<name>-<minutes since the epoch>`` from ``jobTemplate``,
owned by the CronJob, annotated ``batch.kubernetes.io/cronjob-scheduled-timestamp``;
a time missed by more than ``startingDeadlineSeconds`` is skipped;
``concurrencyPolicy`` Forbid skips while a Job runs, Replace deletes the running
ones first; ``suspend`` creates nothing; finished Jobs beyond
``successfulJobsHistoryLimit`` / ``failedJobsHistoryLimit`` are deleted, oldest
first. Status: ``active`` references, ``lastScheduleTime``, ``lastSuccessfulTime``.
https://kubernetes.io/docs/concepts/workloads/controllers/cron-jobs/
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any

from spotguard_sim import clock as simclock
from spotguard_sim import cron, errors
from spotguard_sim.controllers import base, job

USER = base.service_account_user("cronjob-controller")
SCHEDULED_AT = "batch.kubernetes.io/cronjob-scheduled-timestamp"


class CronJobController(base.Controller):
    name = "cronjob-controller"
    primary = "cronjobs"
    workers = 1
    resync_seconds = 10.0  # the controller requeues at the next schedule; this is a safety net

    def handle(self, event_type: str, resource: str, obj: dict[str, Any]) -> None:
        if resource == "cronjobs":
            self.queue.add(base.key_of(obj))
        elif resource == "jobs":
            ref = base.controller_ref(obj)
            if ref and ref.get("kind") == "CronJob":
                self.queue.add_coalesced((obj["metadata"].get("namespace", ""), ref.get("name", "")))

    def sync(self, key: Any) -> None:
        ns, name = key
        try:
            cj = self.store.get("cronjobs", name, ns)
        except errors.NotFound:
            return
        if cj["metadata"].get("deletionTimestamp"):
            return
        spec = cj.get("spec") or {}
        status = cj.get("status") or {}
        uid = cj["metadata"]["uid"]
        jobs, _ = self.store.list("jobs", ns)
        children = [j for j in jobs if base.controller_uid(j) == uid]
        running = [j for j in children if job.finished(j) is None]
        self._clean_history(cj, children)
        try:
            schedule = cron.parse(str(spec.get("schedule", "")), spec.get("timeZone"))
        except cron.ScheduleError as exc:
            self.log.warning("unparseable schedule", extra={"cronjob": name, "namespace": ns,
                                                            "error": str(exc)})
            self._write_status(cj, running, None)
            return
        now = self.clock.now()
        last = status.get("lastScheduleTime") or cj["metadata"].get("creationTimestamp")
        since = simclock.parse_iso(last) if last else now
        due = None
        t = schedule.next_after(since)
        while t <= now:  # the most recent missed time
            due = t
            t = schedule.next_after(t)
        self.queue.add_after(key, max(t - now, 0.5))
        scheduled = None
        if due is not None and not spec.get("suspend"):
            deadline = spec.get("startingDeadlineSeconds")
            policy = spec.get("concurrencyPolicy", "Allow")
            if deadline is not None and now - due > float(deadline):
                self.log.info("missed schedule", extra={"cronjob": name, "namespace": ns})
            elif policy == "Forbid" and running:
                self.log.info("skipping: a job is still running", extra={"cronjob": name})
                due = None  # retried at the next sync while it stays within the deadline
            else:
                if policy == "Replace":
                    for j in running:
                        with contextlib.suppress(errors.NotFound):
                            self.store.delete("jobs", j["metadata"]["name"], ns,
                                              propagation_policy="Background")
                    running = []
                created = self._create_job(cj, due)
                if created is not None:
                    running.append(created)
                scheduled = due
            if due is not None and scheduled is None:
                scheduled = due  # missed: still recorded as the last schedule time
        self._write_status(cj, running, scheduled, children)

    def _create_job(self, cj: dict[str, Any], when: float) -> dict[str, Any] | None:
        template = copy.deepcopy((cj.get("spec") or {}).get("jobTemplate") or {})
        tmeta = template.get("metadata") or {}
        name = f"{cj['metadata']['name']}-{int(when // 60)}"
        body = {
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {
                "name": name,
                "namespace": cj["metadata"]["namespace"],
                "labels": dict(tmeta.get("labels") or {}),
                "annotations": {**(tmeta.get("annotations") or {}),
                                SCHEDULED_AT: self.clock.iso(when)},
                "ownerReferences": [base.owner_reference(cj, "CronJob", "batch/v1")],
            },
            "spec": template.get("spec") or {},
        }
        try:
            created: dict[str, Any] = self.store.create("jobs", body, namespace=cj["metadata"]["namespace"],
                                                        user=USER)
        except errors.AlreadyExists:
            return None
        self.event(cj, "Normal", "SuccessfulCreate", f"Created job {name}")
        return created

    def _clean_history(self, cj: dict[str, Any], children: list[dict[str, Any]]) -> None:
        spec = cj.get("spec") or {}
        for outcome, field in (("Complete", "successfulJobsHistoryLimit"),
                               ("Failed", "failedJobsHistoryLimit")):
            limit = spec.get(field)
            if limit is None:
                continue
            done = sorted((j for j in children if job.finished(j) == outcome),
                          key=lambda j: j["metadata"].get("creationTimestamp", ""))
            for j in done[:max(0, len(done) - int(limit))]:
                with contextlib.suppress(errors.NotFound):
                    self.store.delete("jobs", j["metadata"]["name"], j["metadata"]["namespace"],
                                      propagation_policy="Background")

    def _write_status(self, cj: dict[str, Any], running: list[dict[str, Any]],
                      scheduled: float | None, children: list[dict[str, Any]] | None = None) -> None:
        active = [{"kind": "Job", "namespace": j["metadata"]["namespace"],
                   "name": j["metadata"]["name"], "uid": j["metadata"]["uid"],
                   "apiVersion": "batch/v1", "resourceVersion": j["metadata"]["resourceVersion"]}
                  for j in running]
        succeeded = [c for c in children or [] if job.finished(c) == "Complete"]
        last_ok = max(((c.get("status") or {}).get("completionTime") or "" for c in succeeded),
                      default="")

        def edit(obj: dict[str, Any]) -> None:
            status = obj.setdefault("status", {})
            if active:
                status["active"] = active
            else:
                status.pop("active", None)
            if scheduled is not None:
                status["lastScheduleTime"] = self.clock.iso(scheduled)
            if last_ok and last_ok > (status.get("lastSuccessfulTime") or ""):
                status["lastSuccessfulTime"] = last_ok

        with contextlib.suppress(errors.NotFound):
            self.store.mutate("cronjobs", cj["metadata"]["name"], cj["metadata"]["namespace"], edit)
