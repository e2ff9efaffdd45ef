"""StatefulSet controller (pkg/controller/statefulset): pods ``<name>-<ordinal>``
with stable names; OrderedReady (one at a time, each waiting for its
predecessors to be Running and Ready; scale down from the highest ordinal, one
at a time) and Parallel pod management (``runForAll``: the missing ordinals in
slow-start batches of 1, 2, 4, ..., each batch at once). A pod's replacement,
under the same name, is created only once the old pod object is gone. The
controller's client is rate limited as every kube-controller-manager client
(``--kube-api-qps``/``--kube-api-burst``). Templates are kept as
ControllerRevisions (``controllers.revisions``); a RollingUpdate replaces the
pods at or above ``partition`` from the highest ordinal down, one at a time,
each only once every pod is Running and Ready; OnDelete waits for deletions.
Status carries ``currentRevision``/``updateRevision`` and the counts at each, so
``kubectl rollout status`` waits for the rollout.
https://kubernetes.io/docs/concepts/workloads/controllers/statefulset/
"""

from __future__ import annotations

import contextlib
import copy
import functools
import threading
from collections.abc import Callable
from concurrent import futures
from typing import Any

from spotguard_sim import errors, pods, settings
from spotguard_sim.controllers import base, replicaset, revisions
from spotguard_sim.controllers.replicaset import pod_from_template

POD_NAME_LABEL = "statefulset.kubernetes.io/pod-name"
POD_INDEX_LABEL = "apps.kubernetes.io/pod-index"
USER = base.service_account_user("statefulset-controller")


def ordinal(set_name: str, pod_name: str) -> int | None:
    prefix = f"{set_name}-"
    if not pod_name.startswith(prefix):
        return None
    rest = pod_name[len(prefix):]
    return int(rest) if rest.isdigit() else None


def running_and_ready(pod: dict[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") == "Running" and pods.is_ready(pod)


class StatefulSetController(base.Controller):
    name = "statefulset-controller"
    primary = "statefulsets"
    workers = 2
    _tls = threading.local()  # the revisions of the set a worker is syncing

    def __init__(self, store: Any, informer: base.Informer, *,
                 limits: settings.ControllerManager | None = None) -> None:
        super().__init__(store, informer)
        self.limits = limits or settings.ControllerManager()
        self.pool = futures.ThreadPoolExecutor(max(1, self.limits.burst_replicas),
                                               thread_name_prefix=f"sim-{self.name}")
        self.use_client(self.limits)

    def stop(self) -> None:
        super().stop()
        self.pool.shutdown(wait=False, cancel_futures=True)

    def handle(self, event_type: str, resource: str, obj: dict[str, Any]) -> None:
        if resource == "statefulsets":
            self.queue.add(base.key_of(obj))
        elif resource == "pods":
            ref = base.controller_ref(obj)
            if ref and ref.get("kind") == "StatefulSet":
                self.queue.add_coalesced((obj["metadata"].get("namespace", ""), ref.get("name", "")))

    def sync(self, key: Any) -> None:
        ns, name = key
        try:
            sts = self.store.get("statefulsets", name, ns)
        except errors.NotFound:
            return
        update_rev, current_rev = None, None
        if not sts["metadata"].get("deletionTimestamp"):
            update_rev, history = revisions.ensure(self.store, sts, "StatefulSet")
            current_name = (sts.get("status") or {}).get("currentRevision")
            current_rev = next((r for r in history if r["metadata"]["name"] == current_name), update_rev)
            self._tls.revisions = (update_rev, current_rev)
            self._reconcile(sts)
            self._roll(sts, update_rev)
            in_use = {(p["metadata"].get("labels") or {}).get(revisions.HASH_LABEL, "")
                      for p in self._pods(sts).values()}
            revisions.prune(self.store, sts, history, in_use | {update_rev["metadata"]["name"],
                                                                current_rev["metadata"]["name"]})
        self._update_status(sts, update_rev, current_rev)

    def _pods(self, sts: dict[str, Any]) -> dict[int, dict[str, Any]]:
        out = {}
        for p in self.informer.pods_owned_by(sts["metadata"]["uid"]):
            i = ordinal(sts["metadata"]["name"], p["metadata"]["name"])
            if i is not None:
                out[i] = p
        return out

    def _reconcile(self, sts: dict[str, Any]) -> None:
        spec = sts.get("spec") or {}
        replicas = int(spec.get("replicas", 1) or 0)
        start = int((spec.get("ordinals") or {}).get("start") or 0)
        wanted = range(start, start + replicas)
        parallel = spec.get("podManagementPolicy") == "Parallel"
        by_ordinal = self._pods(sts)
        # pods that failed are deleted and recreated
        for _, p in sorted(by_ordinal.items()):
            if (p.get("status") or {}).get("phase") in ("Failed", "Succeeded") and not pods.is_terminating(p):
                self._delete(sts, p)
                if not parallel:
                    return
        if parallel:
            missing: list[Callable[[], None]] = [
                functools.partial(self._create, sts, i, getattr(self._tls, "revisions", None))
                for i in wanted if i not in by_ordinal]
            _, failed = replicaset.slow_start(missing, replicaset.SLOW_START_INITIAL_BATCH, self.pool)
            if failed:
                raise failed[0]
        for i in wanted:
            found = by_ordinal.get(i)
            if found is None:
                if parallel:
                    continue  # created above
                self._create(sts, i)
                return
            if not parallel and (pods.is_terminating(found) or not running_and_ready(found)):
                return  # OrderedReady: wait for this pod before the next one
        condemned = sorted((i for i in by_ordinal if i not in wanted), reverse=True)
        if not condemned:
            return
        if not parallel:
            if any(not running_and_ready(by_ordinal[i]) or pods.is_terminating(by_ordinal[i])
                   for i in wanted if i in by_ordinal):
                return
            top = by_ordinal[condemned[0]]
            if not pods.is_terminating(top):
                self._delete(sts, top)
            return
        for i in condemned:
            if not pods.is_terminating(by_ordinal[i]):
                self._delete(sts, by_ordinal[i])

    def _partition(self, sts: dict[str, Any]) -> int | None:
        """The RollingUpdate partition; None for OnDelete."""
        strategy = (sts.get("spec") or {}).get("updateStrategy") or {}
        if strategy.get("type", "RollingUpdate") != "RollingUpdate":
            return None
        return int((strategy.get("rollingUpdate") or {}).get("partition") or 0)

    def _roll(self, sts: dict[str, Any], update_rev: dict[str, Any]) -> None:
        """One step of a RollingUpdate: delete the highest-ordinal outdated pod once every pod
        is Running and Ready (the controller recreates it from the update revision)."""
        partition = self._partition(sts)
        if partition is None:
            return
        mine = self._pods(sts)  # the informer's pods, as upstream's pod lister: no list call per sync
        replicas = int((sts.get("spec") or {}).get("replicas", 1) or 0)
        if len(mine) != replicas or any(pods.is_terminating(p) or not running_and_ready(p)
                                        for p in mine.values()):
            return
        name = update_rev["metadata"]["name"]
        outdated = sorted((i for i, p in mine.items() if i >= partition
                           and (p["metadata"].get("labels") or {}).get(revisions.HASH_LABEL) != name),
                          reverse=True)
        if outdated:
            self._delete(sts, mine[outdated[0]])

    def _create(self, sts: dict[str, Any], index: int, revs: tuple[Any, Any] | None = None) -> None:
        spec = sts.get("spec") or {}
        # The pool's threads (Parallel) do not see the syncing worker's thread-local revisions.
        if revs is None:
            revs = getattr(self._tls, "revisions", (None, None))
        update_rev, current_rev = revs if revs is not None else (None, None)
        revision = update_rev
        partition = self._partition(sts)
        if partition is not None and index < partition and current_rev is not None:
            revision = current_rev
        template = revisions.template_of(revision) if revision is not None else spec.get("template") or {}
        pod = pod_from_template(sts, "StatefulSet", template)
        if revision is not None:
            pod["metadata"]["labels"][revisions.HASH_LABEL] = revision["metadata"]["name"]
        name = f"{sts['metadata']['name']}-{index}"
        meta = pod["metadata"]
        del meta["generateName"]
        meta["name"] = name
        meta["labels"][POD_NAME_LABEL] = name
        meta["labels"][POD_INDEX_LABEL] = str(index)
        pod["spec"]["hostname"] = name
        if spec.get("serviceName"):
            pod["spec"]["subdomain"] = spec["serviceName"]
        self.log.info("creating pod", extra={"statefulset": sts["metadata"]["name"],
                                             "namespace": meta["namespace"], "pod": name})
        self.request()
        self.store.create("pods", pod, namespace=meta["namespace"], user=USER)

    def _delete(self, sts: dict[str, Any], pod: dict[str, Any]) -> None:
        self.log.info("deleting pod", extra={"statefulset": sts["metadata"]["name"],
                                             "namespace": pod["metadata"]["namespace"],
                                             "pod": pod["metadata"]["name"]})
        self.request()
        with contextlib.suppress(errors.NotFound):
            self.store.delete("pods", pod["metadata"]["name"], pod["metadata"]["namespace"],
                              preconditions={"uid": pod["metadata"]["uid"]})

    def _update_status(self, sts: dict[str, Any], update_rev: dict[str, Any] | None = None,
                       current_rev: dict[str, Any] | None = None) -> None:
        existing = list(self._pods(sts).values())
        now = self.clock.now()
        min_ready = float((sts.get("spec") or {}).get("minReadySeconds") or 0)
        status = {
            "observedGeneration": sts["metadata"].get("generation", 1),
            "replicas": len(existing),
            "readyReplicas": sum(1 for p in existing if pods.is_ready(p)),
            "currentReplicas": len(existing),
            "updatedReplicas": len(existing),
            "availableReplicas": sum(1 for p in existing if pods.is_available(p, min_ready, now)),
        }
        revision_status: dict[str, Any] = {}
        if update_rev is not None and current_rev is not None:
            def at(rev: dict[str, Any]) -> int:
                return sum(1 for p in existing if (p["metadata"].get("labels") or {}).get(
                    revisions.HASH_LABEL) == rev["metadata"]["name"])

            updated = at(update_rev)
            replicas = int((sts.get("spec") or {}).get("replicas", 1) or 0)
            done = updated == replicas == len(existing)
            current_name = update_rev["metadata"]["name"] if done else current_rev["metadata"]["name"]
            status["updatedReplicas"] = updated
            status["currentReplicas"] = updated if done else at(current_rev)
            revision_status = {"currentRevision": current_name,
                               "updateRevision": update_rev["metadata"]["name"]}

        def edit(obj: dict[str, Any]) -> None:
            old = obj.get("status") or {}
            new = {k: v for k, v in status.items() if v or k in ("replicas", "observedGeneration")}
            for keep in ("currentRevision", "updateRevision", "collisionCount"):
                if keep in old:
                    new[keep] = old[keep]
            new.update(revision_status)
            obj["status"] = new

        cached = {"status": copy.deepcopy(sts.get("status"))}  # edit touches the status only
        edit(cached)
        if cached.get("status") == sts.get("status"):
            return  # upstream writes the status only when it changed: no request, no token
        with contextlib.suppress(errors.NotFound):
            self.request()
            self.store.mutate("statefulsets", sts["metadata"]["name"], sts["metadata"]["namespace"], edit)
