"""Jobs, CronJobs and ReplicationControllers against the simulated cluster,
through the official client.
https://kubernetes.io/docs/concepts/workloads/controllers/job/
https://kubernetes.io/docs/concepts/workloads/controllers/cron-jobs/
https://kubernetes.io/docs/concepts/workloads/controllers/replicationcontroller/
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from typing import Any

import kubernetes
import pytest
from spotguard_sim import clock as simclock
from spotguard_sim import cron, testing
from spotguard_sim.controllers import completion
from spotguard_sim.controllers import job as job_ctl

from tests.sim import controller_helpers as h

SCALE = 60.0  # a simulated minute per real second


@pytest.fixture
def sim() -> Iterator[Any]:
    with testing.running_cluster(time_scale=SCALE, ready_delay_seconds=1.0) as cluster:
        for i in range(3):
            cluster.store.create("nodes", h.node(f"n{i}", zone="abc"[i]))
        yield cluster


def batch(sim: Any) -> kubernetes.client.BatchV1Api:
    return kubernetes.client.BatchV1Api(sim.api_client())


def job(name: str, *, run_seconds: float = 5.0, exit_code: int = 0, **spec: Any) -> dict[str, Any]:
    template = h.template(name, restartPolicy="Never")
    template["metadata"]["annotations"] = {completion.RUN_SECONDS: str(run_seconds),
                                           completion.EXIT_CODE: str(exit_code)}
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"template": template, **spec}}


def conditions(obj: Any) -> set[str]:
    return {c.type for c in obj.status.conditions or [] if c.status == "True"}


def test_job_runs_parallelism_pods_until_completions_succeed(sim: Any) -> None:
    created = batch(sim).create_namespaced_job("default", job("work", completions=5, parallelism=2))
    # defaults and the generated selector, as the API server sets them
    uid = created.metadata.uid
    assert created.spec.selector.match_labels == {"batch.kubernetes.io/controller-uid": uid}
    labels = created.spec.template.metadata.labels
    assert labels["batch.kubernetes.io/job-name"] == "work" and labels["job-name"] == "work"
    assert (created.spec.backoff_limit, created.spec.completion_mode, created.spec.suspend) == (
        6, "NonIndexed", False)
    peak = [0]

    def done() -> bool:
        active = [p for p in h.pods_of(sim.store, "work") if p["status"].get("phase") in ("Pending", "Running")]
        peak[0] = max(peak[0], len(active))
        return "Complete" in conditions(batch(sim).read_namespaced_job("work", "default"))

    h.wait_for(done, timeout=30, what="the Job to complete")
    final = batch(sim).read_namespaced_job("work", "default")
    assert final.status.succeeded == 5 and not final.status.failed and not final.status.active
    assert final.status.completion_time and final.status.start_time
    assert peak[0] <= 2
    pods = h.pods_of(sim.store, "work")
    assert len(pods) == 5 and all(p["status"]["phase"] == "Succeeded" for p in pods)
    assert all(job_ctl.TRACKING_FINALIZER not in (p["metadata"].get("finalizers") or []) for p in pods)
    ref = pods[0]["metadata"]["ownerReferences"][0]
    assert (ref["apiVersion"], ref["kind"], ref["name"]) == ("batch/v1", "Job", "work")


def test_job_fails_past_its_backoff_limit(sim: Any) -> None:
    batch(sim).create_namespaced_job("default", job("flaky", exit_code=1, backoffLimit=2))
    h.wait_for(lambda: "Failed" in conditions(batch(sim).read_namespaced_job("flaky", "default")),
               timeout=30, what="the Job to fail")
    final = batch(sim).read_namespaced_job("flaky", "default")
    assert final.status.failed == 3  # backoffLimit 2: the third failure ends it
    reason = next(c.reason for c in final.status.conditions if c.type == "Failed")
    assert reason == "BackoffLimitExceeded"
    # each replacement waits 10 s, then 20 s, after the last failure (simulated time)
    pods = sorted(h.pods_of(sim.store, "flaky"), key=lambda p: p["metadata"]["creationTimestamp"])
    created = [simclock.parse_iso(p["metadata"]["creationTimestamp"]) for p in pods]
    finished = [simclock.parse_iso(p["status"]["containerStatuses"][0]["state"]["terminated"]["finishedAt"])
                for p in pods]
    assert len(pods) == 3
    assert created[1] >= finished[0] + 10 - 1 and created[2] >= finished[1] + 20 - 1


def test_indexed_job_completes_every_index(sim: Any) -> None:
    batch(sim).create_namespaced_job("default", job("idx", completions=3, parallelism=3,
                                                    completionMode="Indexed"))
    h.wait_for(lambda: "Complete" in conditions(batch(sim).read_namespaced_job("idx", "default")),
               timeout=30, what="the indexed Job")
    assert batch(sim).read_namespaced_job("idx", "default").status.completed_indexes == "0-2"
    indexes = sorted(p["metadata"]["annotations"][job_ctl.INDEX_ANNOTATION] for p in h.pods_of(sim.store, "idx"))
    assert indexes == ["0", "1", "2"]


def test_suspended_job_runs_nothing_and_ttl_deletes_a_finished_one(sim: Any) -> None:
    api = batch(sim)
    api.create_namespaced_job("default", job("later", suspend=True, ttlSecondsAfterFinished=30))
    h.wait_for(lambda: "Suspended" in conditions(api.read_namespaced_job("later", "default")),
               what="Suspended condition")
    assert not h.pods_of(sim.store, "later")
    api.patch_namespaced_job("later", "default", {"spec": {"suspend": False}})
    h.wait_for(lambda: "Complete" in conditions(api.read_namespaced_job("later", "default")),
               timeout=30, what="the resumed Job")

    def gone() -> bool:
        try:
            api.read_namespaced_job("later", "default")
        except kubernetes.client.ApiException as exc:
            return exc.status == 404
        return False

    h.wait_for(gone, timeout=30, what="the TTL-after-finished deletion")


def test_deleting_a_job_without_propagation_orphans_its_pods(sim: Any) -> None:
    """batch/v1 keeps the legacy OrphanDependents default (pkg/registry/batch/job/strategy.go)."""
    api = batch(sim)
    api.create_namespaced_job("default", job("orphan", run_seconds=3600))
    h.wait_for(lambda: h.pods_of(sim.store, "orphan"), what="the pod")
    api.delete_namespaced_job("orphan", "default")
    pod = h.wait_for(lambda: next((p for p in h.pods_of(sim.store, "orphan")
                                   if not p["metadata"].get("ownerReferences")), None), what="orphaned pod")
    assert not pod["metadata"].get("deletionTimestamp")


def test_cronjob_creates_a_job_each_scheduled_minute(sim: Any) -> None:
    api = batch(sim)
    body = {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "tick"},
            "spec": {"schedule": "*/1 * * * *", "successfulJobsHistoryLimit": 2,
                     "jobTemplate": {"spec": job("tick", run_seconds=5)["spec"]}}}
    created = api.create_namespaced_cron_job("default", body)
    assert (created.spec.concurrency_policy, created.spec.failed_jobs_history_limit) == ("Allow", 1)

    def finished_jobs() -> list[Any]:
        jobs = api.list_namespaced_job("default").items
        return [j for j in jobs if j.metadata.owner_references and "Complete" in conditions(j)]

    h.wait_for(lambda: len(finished_jobs()) >= 2, timeout=30, what="two scheduled runs")
    jobs = api.list_namespaced_job("default").items
    assert len([j for j in jobs if "Complete" in conditions(j)]) <= 2 + 1  # history limit (one being cleaned)
    first = finished_jobs()[0]
    stamp = first.metadata.annotations["batch.kubernetes.io/cronjob-scheduled-timestamp"]
    assert stamp.endswith(":00Z") and first.metadata.name == f"tick-{int(first.metadata.name.rsplit('-', 1)[1])}"
    status = api.read_namespaced_cron_job("tick", "default").status
    assert status.last_schedule_time and status.last_successful_time


def test_cron_schedules() -> None:
    start = datetime.datetime(2026, 1, 1, 0, 0, tzinfo=datetime.UTC).timestamp()  # a Thursday

    def nxt(expr: str, t: float = start) -> str:
        return datetime.datetime.fromtimestamp(cron.parse(expr).next_after(t), datetime.UTC).strftime("%a %d %H:%M")

    assert nxt("*/15 * * * *") == "Thu 01 00:15"
    assert nxt("@daily") == "Fri 02 00:00"
    assert nxt("30 2 * * mon-fri") == "Thu 01 02:30"
    assert nxt("0 0 * * sun") == "Sun 04 00:00"
    assert nxt("0 0 13 * fri") == "Fri 02 00:00"  # both day fields restricted: either matches
    with pytest.raises(cron.ScheduleError):
        cron.parse("61 * * * *")
    with pytest.raises(cron.ScheduleError):
        cron.parse("TZ=UTC * * * * *")


def test_replication_controller_keeps_its_replicas_and_orphans_by_default(sim: Any) -> None:
    core = kubernetes.client.CoreV1Api(sim.api_client())
    body = {"apiVersion": "v1", "kind": "ReplicationController", "metadata": {"name": "rc"},
            "spec": {"replicas": 2, "template": h.template("rc")}}
    created = core.create_namespaced_replication_controller("default", body)
    assert created.spec.selector == {"app": "rc"}  # defaulted from the template labels
    h.wait_for(lambda: core.read_namespaced_replication_controller("rc", "default").status.ready_replicas == 2,
               what="two ready replicas")
    victim = h.pods_of(sim.store, "rc")[0]["metadata"]["name"]
    core.delete_namespaced_pod(victim, "default")
    h.wait_for(lambda: len([p for p in h.pods_of(sim.store, "rc") if not p["metadata"].get("deletionTimestamp")
                            and p["metadata"]["name"] != victim]) == 2, what="a replacement")
    core.delete_namespaced_replication_controller("rc", "default")
    h.wait_for(lambda: all(not p["metadata"].get("ownerReferences") for p in h.pods_of(sim.store, "rc")),
               what="pods orphaned")
