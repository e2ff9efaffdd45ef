"""ReplicaSet controller (pkg/controller/replicaset/replica_set.go).

Creates pods through ``store.create`` (so mutating admission webhooks run) as the
replicaset-controller service account, at most ``BurstReplicas`` (500) per sync,
in slow-start batches of 1, 2, 4, ... (``slowStartBatch``), every pod of a batch
created at once on its own thread, as upstream's goroutines; the controller's
client is rate limited (``--kube-api-qps`` 20, ``--kube-api-burst`` 30, one
bucket per controller), which is all that bounds the webhook calls in flight.
On scale-down deletes the pods that ``ActivePodsWithRanks`` orders first;
writes status. A pod being deleted is not active: it is replaced at once,
before it is gone.
https://kubernetes.io/docs/concepts/workloads/controllers/replicaset/
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable
from concurrent import futures
from typing import Any

from spotguard_sim import errors, pods, settings
from spotguard_sim.controllers import base

BURST_REPLICAS = settings.BURST_REPLICAS  # replicaset.BurstReplicas
SLOW_START_INITIAL_BATCH = 1  # controller.SlowStartInitialBatchSize
USER = base.service_account_user("replicaset-controller")


def slow_start_batch(count: int, initial: int, fn: Callable[[], None],
                     pool: futures.Executor) -> tuple[int, list[BaseException]]:
    """Call ``fn`` ``count`` times in batches of 1, 2, 4, ... run concurrently;
    stop after the first batch with an error. Returns (successes, errors)."""
    return slow_start([fn] * count, initial, pool)


def slow_start(fns: list[Callable[[], None]], initial: int,
               pool: futures.Executor) -> tuple[int, list[BaseException]]:
    """``slowStartBatch`` over distinct calls (a StatefulSet's ordinals)."""
    remaining = len(fns)
    successes = 0
    batch = min(remaining, initial)
    while batch > 0:
        start = len(fns) - remaining
        jobs = [pool.submit(f) for f in fns[start:start + batch]]
        failed: list[BaseException] = []
        for job in jobs:
            exc = job.exception()
            if exc is None:
                successes += 1
            else:
                failed.append(exc)
        if failed:
            return successes, failed
        remaining -= batch
        batch = min(2 * batch, remaining)
    return successes, []


def pod_from_template(owner: dict[str, Any], kind: str, template: dict[str, Any]) -> dict[str, Any]:
    """controller.GetPodFromTemplate."""
    tmeta = template.get("metadata") or {}
    meta: dict[str, Any] = {
        "generateName": f"{owner['metadata']['name']}-",
        "namespace": owner["metadata"].get("namespace", "default"),
        "labels": dict(tmeta.get("labels") or {}),
        "ownerReferences": [base.owner_reference(owner, kind)],
    }
    if tmeta.get("annotations"):
        meta["annotations"] = dict(tmeta["annotations"])
    if tmeta.get("finalizers"):
        meta["finalizers"] = list(tmeta["finalizers"])
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": copy.deepcopy(template.get("spec") or {})}


class ReplicaSetController(base.Controller):
    name = "replicaset-controller"
    primary = "replicasets"
    workers = 4

    def __init__(self, store: Any, informer: base.Informer, pool: futures.Executor | None = None, *,
                 limits: settings.ControllerManager | None = None) -> None:
        super().__init__(store, informer)
        self.limits = limits or settings.ControllerManager()
        self._own_pool = pool is None
        self.pool = pool or futures.ThreadPoolExecutor(
            max(1, self.limits.burst_replicas), thread_name_prefix=f"sim-{self.name}")
        self.use_client(self.limits)

    def stop(self) -> None:
        super().stop()
        if self._own_pool:
            self.pool.shutdown(wait=False, cancel_futures=True)

    def handle(self, event_type: str, resource: str, obj: dict[str, Any]) -> None:
        if resource == "replicasets":
            self.queue.add(base.key_of(obj))
        elif resource == "pods":
            ref = base.controller_ref(obj)
            if ref and ref.get("kind") == "ReplicaSet":
                self.queue.add_coalesced((obj["metadata"].get("namespace", ""), ref.get("name", "")))

    def sync(self, key: Any) -> None:
        ns, name = key
        try:
            rs = self.store.get("replicasets", name, ns)
        except errors.NotFound:
            return
        uid = rs["metadata"]["uid"]
        owned = self.informer.pods_owned_by(uid)
        active = [p for p in owned if pods.is_active(p)]
        if not rs["metadata"].get("deletionTimestamp"):
            diff = len(active) - int(rs["spec"].get("replicas", 1) or 0)
            if diff < 0:
                self._create(rs, min(-diff, self.limits.burst_replicas))
            elif diff > 0:
                self._delete(rs, active, min(diff, self.limits.burst_replicas))
            owned = self.informer.pods_owned_by(uid)
        self._update_status(rs, owned)

    def _create(self, rs: dict[str, Any], count: int) -> None:
        template = rs["spec"].get("template") or {}
        ns = rs["metadata"]["namespace"]
        pod = pod_from_template(rs, "ReplicaSet", template)

        def create_one() -> None:
            self.request()
            try:
                created = self.store.create("pods", pod, namespace=ns, user=USER)
            except errors.StatusError as exc:  # controller.RealPodControl: FailedCreate
                self.event(rs, "Warning", "FailedCreate", f"Error creating: {exc.message}")
                raise
            self.event(rs, "Normal", "SuccessfulCreate", f"Created pod: {created['metadata']['name']}")

        self.log.info("creating pods", extra={"replicaset": rs["metadata"]["name"],
                                              "namespace": ns, "count": count})
        done, failed = slow_start_batch(count, SLOW_START_INITIAL_BATCH, create_one, self.pool)
        if failed:
            self.log.warning("pod creation failed", extra={
                "replicaset": rs["metadata"]["name"], "namespace": ns, "pods_created": done,
                "error": str(failed[0])})
            raise failed[0]

    def _related(self, rs: dict[str, Any]) -> list[dict[str, Any]]:
        """Pods of this ReplicaSet and of its siblings (same controller owner)."""
        owner = base.controller_uid(rs)
        if not owner:
            return self.informer.pods_owned_by(rs["metadata"]["uid"])
        related: list[dict[str, Any]] = []
        for other in self.informer.list("replicasets", rs["metadata"]["namespace"]):
            if base.controller_uid(other) == owner:
                related.extend(self.informer.pods_owned_by(other["metadata"]["uid"]))
        return related

    def _delete(self, rs: dict[str, Any], active: list[dict[str, Any]], count: int) -> None:
        ranks = pods.ranks_by_colocation(active, self._related(rs))
        victims = pods.deletion_order(active, ranks, self.clock.now())[:count]
        ns = rs["metadata"]["namespace"]
        self.log.info("deleting pods", extra={
            "replicaset": rs["metadata"]["name"], "namespace": ns,
            "pods": [p["metadata"]["name"] for p in victims]})

        def delete(pod: dict[str, Any]) -> None:
            self.request()
            with contextlib.suppress(errors.NotFound):
                self.store.delete("pods", pod["metadata"]["name"], ns,
                                  preconditions={"uid": pod["metadata"]["uid"]})

        errs = [e for e in (j.exception() for j in [self.pool.submit(delete, p) for p in victims]) if e]
        if errs:
            raise errs[0]

    def _update_status(self, rs: dict[str, Any], owned: list[dict[str, Any]]) -> None:
        now = self.clock.now()
        min_ready = float(rs["spec"].get("minReadySeconds") or 0)
        active = [p for p in owned if pods.is_active(p)]
        selector = rs["spec"].get("selector") or {}
        from spotguard_sim import scheduler

        labeled = sum(
            1 for p in active
            if scheduler.match_label_selector(selector, p["metadata"].get("labels") or {})
        )
        ready = sum(1 for p in active if pods.is_ready(p))
        available = sum(1 for p in active if pods.is_available(p, min_ready, now))
        if min_ready and available < ready:
            self.queue.add_after(base.key_of(rs), min_ready)
        status = {
            "replicas": len(active),
            "fullyLabeledReplicas": labeled,
            "readyReplicas": ready,
            "availableReplicas": available,
            "observedGeneration": rs["metadata"].get("generation", 1),
        }

        def edit(obj: dict[str, Any]) -> None:
            old = obj.get("status") or {}
            new = {k: v for k, v in status.items() if v or k in ("replicas", "observedGeneration")}
            if old.get("conditions"):
                new["conditions"] = old["conditions"]
            obj["status"] = new

        with contextlib.suppress(errors.NotFound):
            self.request()
            self.store.mutate("replicasets", rs["metadata"]["name"], rs["metadata"]["namespace"], edit)
