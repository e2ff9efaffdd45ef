"""ReplicationController manager (pkg/controller/replication): the ReplicaSet
controller's logic on core/v1 ReplicationControllers (an equality-based
``spec.selector`` map), pods owned with apiVersion v1.
https://kubernetes.io/docs/concepts/workloads/controllers/replicationcontroller/
"""

from __future__ import annotations

import contextlib
from concurrent import futures
from typing import Any

from spotguard_sim import errors, pods
from spotguard_sim.controllers import base
from spotguard_sim.controllers.replicaset import BURST_REPLICAS, pod_from_template, slow_start_batch

USER = base.service_account_user("replication-controller")


class ReplicationManager(base.Controller):
    name = "replication-controller"
    primary = "replicationcontrollers"
    workers = 2

    def __init__(self, store: Any, informer: base.Informer) -> None:
        super().__init__(store, informer)
        self.pool = futures.ThreadPoolExecutor(4, thread_name_prefix="sim-rc-create")

    def stop(self) -> None:
        super().stop()
        self.pool.shutdown(wait=False, cancel_futures=True)

    def handle(self, event_type: str, resource: str, obj: dict[str, Any]) -> None:
        if resource == self.primary:
            self.queue.add(base.key_of(obj))
        elif resource == "pods":
            ref = base.controller_ref(obj)
            if ref and ref.get("kind") == "ReplicationController":
                self.queue.add_coalesced((obj["metadata"].get("namespace", ""), ref.get("name", "")))

    def sync(self, key: Any) -> None:
        ns, name = key
        try:
            rc = self.store.get(self.primary, name, ns)
        except errors.NotFound:
            return
        uid = rc["metadata"]["uid"]
        active = [p for p in self.informer.pods_owned_by(uid) if pods.is_active(p)]
        if not rc["metadata"].get("deletionTimestamp"):
            diff = len(active) - int((rc.get("spec") or {}).get("replicas", 1) or 0)
            if diff < 0:
                self._create(rc, min(-diff, BURST_REPLICAS))
            elif diff > 0:
                ranks = pods.ranks_by_colocation(active, active)
                for p in pods.deletion_order(active, ranks, self.clock.now())[:min(diff, BURST_REPLICAS)]:
                    with contextlib.suppress(errors.NotFound, errors.Conflict):
                        self.store.delete("pods", p["metadata"]["name"], ns,
                                          preconditions={"uid": p["metadata"]["uid"]})
        self._update_status(rc)

    def _create(self, rc: dict[str, Any], count: int) -> None:
        pod = pod_from_template(rc, "ReplicationController", (rc.get("spec") or {}).get("template") or {})
        pod["metadata"]["ownerReferences"][0]["apiVersion"] = "v1"
        ns = rc["metadata"]["namespace"]

        def create_one() -> None:
            created = self.store.create("pods", pod, namespace=ns, user=USER)
            self.event(rc, "Normal", "SuccessfulCreate", f"Created pod: {created['metadata']['name']}")

        _, failed = slow_start_batch(count, 1, create_one, self.pool)
        if failed:
            raise failed[0]

    def _update_status(self, rc: dict[str, Any]) -> None:
        now = self.clock.now()
        min_ready = float((rc.get("spec") or {}).get("minReadySeconds") or 0)
        selector = (rc.get("spec") or {}).get("selector") or {}
        active = [p for p in self.informer.pods_owned_by(rc["metadata"]["uid"]) if pods.is_active(p)]
        status = {
            "replicas": len(active),
            "fullyLabeledReplicas": sum(1 for p in active if all(
                (p["metadata"].get("labels") or {}).get(k) == v for k, v in selector.items())),
            "readyReplicas": sum(1 for p in active if pods.is_ready(p)),
            "availableReplicas": sum(1 for p in active if pods.is_available(p, min_ready, now)),
            "observedGeneration": rc["metadata"].get("generation", 1),
        }

        def edit(obj: dict[str, Any]) -> None:
            obj["status"] = {k: v for k, v in status.items()
                             if v or k in ("replicas", "observedGeneration")}

        with contextlib.suppress(errors.NotFound):
            self.store.mutate(self.primary, rc["metadata"]["name"], rc["metadata"]["namespace"], edit)
