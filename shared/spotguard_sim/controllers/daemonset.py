"""DaemonSet controller (pkg/controller/daemon): one pod per eligible node.

A node is eligible when the template's nodeSelector and required node affinity
match it and its NoSchedule/NoExecute taints are tolerated, counting the
tolerations the controller adds to every daemon pod
(pkg/controller/daemon/util AddOrUpdateDaemonPodTolerations). A pod already on
a node that gained an untolerated NoSchedule taint stays (NodeShouldRunDaemonPod's
``shouldContinueRunning``: only an untolerated NoExecute taint removes it); it is
not replaced if it fails, and the status counts it as misscheduled. Each pod is
pinned to its node by a required node affinity term on ``metadata.name``
(ReplaceDaemonSetPodNodeNameNodeAffinity) and bound by the scheduler, so it
takes that node's CPU, memory and a pod slot like any pod. Failed pods are
deleted and replaced; a changed template replaces the pods ``maxUnavailable``
at a time (RollingUpdate) or when they are deleted (OnDelete). The status
carries every field the API always serialises.
https://kubernetes.io/docs/concepts/workloads/controllers/daemonset/
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import threading
from concurrent import futures
from typing import Any

from spotguard.policy import tolerations

from spotguard_sim import errors, intstr, pods, scheduler
from spotguard_sim.controllers import base
from spotguard_sim.controllers.replicaset import pod_from_template, slow_start_batch

USER = base.service_account_user("daemon-set-controller")
GENERATION_LABEL = "pod-template-generation"
HASH_LABEL = "controller-revision-hash"
# AddOrUpdateDaemonPodTolerations: what every daemon pod tolerates
DAEMON_TOLERATIONS = (
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/disk-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/pid-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
)
HOST_NETWORK_TOLERATION = {"key": "node.kubernetes.io/network-unavailable",
                           "operator": "Exists", "effect": "NoSchedule"}


def template_hash(template: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]


def with_daemon_tolerations(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The pod's tolerations plus the daemon ones it lacks (same key and effect)."""
    out = [dict(t) for t in spec.get("tolerations") or [] if isinstance(t, dict)]
    extra = list(DAEMON_TOLERATIONS)
    if spec.get("hostNetwork"):
        extra.append(HOST_NETWORK_TOLERATION)
    for tol in extra:
        if not any(t.get("key") == tol["key"] and t.get("effect") == tol["effect"] for t in out):
            out.append(dict(tol))
    return out


def pin_to_node(spec: dict[str, Any], node: str) -> None:
    """ReplaceDaemonSetPodNodeNameNodeAffinity: one required term, matchFields name In [node]."""
    affinity = spec.setdefault("affinity", {})
    node_aff = affinity.setdefault("nodeAffinity", {})
    node_aff["requiredDuringSchedulingIgnoredDuringExecution"] = {"nodeSelectorTerms": [{
        "matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}


def daemon_pod(template_spec: dict[str, Any]) -> scheduler.PodInfo:
    """The template as the scheduler sees a daemon pod (with the daemon tolerations)."""
    return scheduler.PodInfo.from_pod({"metadata": {}, "spec": {
        **template_spec, "tolerations": with_daemon_tolerations(template_spec)}})


def should_run(template_spec: dict[str, Any], node: dict[str, Any],
               pod: scheduler.PodInfo | None = None, info: scheduler.NodeInfo | None = None) -> bool:
    """Whether a daemon pod belongs on ``node`` (NodeShouldRunDaemonPod); ``pod`` is
    ``daemon_pod(template_spec)``, given when many nodes are judged for one template."""
    meta = node.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return False
    if info is None:
        info = scheduler.NodeInfo.from_node(node)
    if pod is None:
        pod = daemon_pod(template_spec)
    if not scheduler.matches_node_affinity(pod, info):
        return False
    return all(
        tolerations.tolerated(t, pod.tolerations)
        for t in info.taints if t.effect in ("NoSchedule", "NoExecute")
    )


def should_continue(node: dict[str, Any], pod: scheduler.PodInfo, info: scheduler.NodeInfo) -> bool:
    """Whether a daemon pod already on ``node`` stays there (``shouldContinueRunning``): the
    node still matches, and it has no NoExecute taint the pod does not tolerate."""
    if (node.get("metadata") or {}).get("deletionTimestamp") or not scheduler.matches_node_affinity(pod, info):
        return False
    return all(tolerations.tolerated(t, pod.tolerations) for t in info.taints if t.effect == "NoExecute")


def _pod_node(pod: dict[str, Any]) -> str | None:
    """The node a daemon pod is for: where it runs, else its pinned name."""
    spec = pod.get("spec") or {}
    if spec.get("nodeName"):
        return str(spec["nodeName"])
    terms = ((((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or [])
    for term in terms:
        for field in term.get("matchFields") or []:
            if field.get("key") == "metadata.name" and field.get("values"):
                return str(field["values"][0])
    return None


class DaemonSetController(base.Controller):
    name = "daemon-set-controller"
    primary = "daemonsets"
    workers = 2

    def __init__(self, store: Any, informer: base.Informer) -> None:
        super().__init__(store, informer)
        self.pool = futures.ThreadPoolExecutor(4, thread_name_prefix="sim-ds-create")
        self._nodes_lock = threading.Lock()
        self._nodes_seen: dict[str, str] = {}  # node -> what should_run reads of it
        self._node_info: dict[str, tuple[Any, scheduler.NodeInfo]] = {}

    def stop(self) -> None:
        super().stop()
        self.pool.shutdown(wait=False, cancel_futures=True)

    def handle(self, event_type: str, resource: str, obj: dict[str, Any]) -> None:
        if resource == "daemonsets":
            self.queue.add(base.key_of(obj))
        elif resource == "nodes":
            # upstream's updateNode (shouldIgnoreNodeUpdate): a heartbeat or a status change
            # cannot change where daemon pods belong; only what should_run reads can
            meta = obj.get("metadata") or {}
            seen = None if event_type == "DELETED" else json.dumps(
                [meta.get("labels"), (obj.get("spec") or {}).get("taints"),
                 meta.get("deletionTimestamp")], sort_keys=True)
            with self._nodes_lock:
                if self._nodes_seen.get(meta.get("name", "")) == seen:
                    return
                if seen is None:
                    self._nodes_seen.pop(meta.get("name", ""), None)
                    self._node_info.pop(meta.get("name", ""), None)
                else:
                    self._nodes_seen[meta.get("name", "")] = seen
            for ds in self.informer.list("daemonsets"):
                self.queue.add_coalesced(base.key_of(ds))
        elif resource == "pods":
            ref = base.controller_ref(obj)
            if ref and ref.get("kind") == "DaemonSet":
                self.queue.add_coalesced((obj["metadata"].get("namespace", ""), ref.get("name", "")))

    def _info(self, node: dict[str, Any]) -> scheduler.NodeInfo:
        """The node as the scheduler sees it, parsed once per resourceVersion."""
        meta = node["metadata"]
        key = (meta["name"], meta.get("resourceVersion"))
        with self._nodes_lock:
            cached = self._node_info.get(meta["name"])
        if cached is not None and cached[0] == key:
            return cached[1]
        info = scheduler.NodeInfo.from_node(node)
        with self._nodes_lock:
            self._node_info[meta["name"]] = (key, info)
        return info

    def sync(self, key: Any) -> None:
        ns, name = key
        try:
            ds = self.store.get("daemonsets", name, ns)
        except errors.NotFound:
            return
        spec = ds.get("spec") or {}
        template = spec.get("template") or {}
        template_spec = template.get("spec") or {}
        generation = str(ds["metadata"].get("generation", 1))
        nodes = {n["metadata"]["name"]: n for n in self.informer.list("nodes")}
        daemon = daemon_pod(template_spec)
        wanted = {n for n, node in nodes.items() if should_run(template_spec, node, daemon, self._info(node))}
        staying = {n for n, node in nodes.items()
                   if n not in wanted and should_continue(node, daemon, self._info(node))}
        by_node: dict[str, list[dict[str, Any]]] = {}
        for p in self.informer.pods_owned_by(ds["metadata"]["uid"]):
            node = _pod_node(p)
            if node is not None:
                by_node.setdefault(node, []).append(p)
        if not ds["metadata"].get("deletionTimestamp"):
            self._reconcile(ds, wanted, by_node, generation, staying)
        self._update_status(ds, wanted, generation)

    def _reconcile(self, ds: dict[str, Any], wanted: set[str],
                   by_node: dict[str, list[dict[str, Any]]], generation: str, staying: set[str]) -> None:
        spec = ds.get("spec") or {}
        to_create: list[str] = []
        to_delete: list[dict[str, Any]] = []
        for node in sorted(wanted):
            live = [p for p in by_node.get(node, []) if not pods.is_terminating(p)]
            failed = [p for p in live if (p.get("status") or {}).get("phase") == "Failed"]
            to_delete.extend(failed)
            live = [p for p in live if p not in failed]
            if not live and not any(pods.is_terminating(p) for p in by_node.get(node, [])):
                to_create.append(node)
            elif len(live) > 1:  # keep the oldest
                live.sort(key=lambda p: p["metadata"].get("creationTimestamp", ""))
                to_delete.extend(live[1:])
        for node, owned in by_node.items():
            if node in wanted:
                continue
            live = [p for p in owned if not pods.is_terminating(p)]
            if node in staying:  # kept, not replaced: failed ones and all but the oldest go
                gone = [p for p in live if (p.get("status") or {}).get("phase") in ("Failed", "Succeeded")]
                rest = sorted((p for p in live if p not in gone),
                              key=lambda p: p["metadata"].get("creationTimestamp", ""))
                to_delete.extend(gone + rest[1:])
            else:
                to_delete.extend(live)
        strategy = spec.get("updateStrategy") or {}
        if strategy.get("type", "RollingUpdate") == "RollingUpdate":
            to_delete.extend(self._rolling_victims(ds, wanted, by_node, generation, to_delete))
        for pod in to_delete:
            self._delete(pod)
        if to_create:
            self._create(ds, to_create, generation)

    def _rolling_victims(self, ds: dict[str, Any], wanted: set[str],
                         by_node: dict[str, list[dict[str, Any]]], generation: str,
                         already: list[dict[str, Any]]) -> list[dict[str, Any]]:
        rolling = ((ds.get("spec") or {}).get("updateStrategy") or {}).get("rollingUpdate") or {}
        budget = intstr.scaled(rolling.get("maxUnavailable", 1), len(wanted), round_up=True)
        budget = max(budget, 1) if wanted else 0
        now = self.clock.now()
        min_ready = float((ds.get("spec") or {}).get("minReadySeconds") or 0)
        old: list[dict[str, Any]] = []
        unavailable = 0
        for node in wanted:
            live = [p for p in by_node.get(node, []) if not pods.is_terminating(p)]
            if not live or not any(pods.is_available(p, min_ready, now) for p in live):
                unavailable += 1
            old.extend(p for p in live if p not in already and
                       (p["metadata"].get("labels") or {}).get(GENERATION_LABEL) != generation)
        # unavailable old pods first, then the rest while the budget lasts
        old.sort(key=lambda p: pods.is_available(p, min_ready, now))
        victims = []
        for p in old:
            if not pods.is_available(p, min_ready, now):
                victims.append(p)
            elif unavailable < budget:
                victims.append(p)
                unavailable += 1
        return victims

    def _create(self, ds: dict[str, Any], nodes: list[str], generation: str) -> None:
        template = copy.deepcopy((ds.get("spec") or {}).get("template") or {})
        ns = ds["metadata"]["namespace"]
        labels = template.setdefault("metadata", {}).setdefault("labels", {})
        labels[GENERATION_LABEL] = generation
        labels[HASH_LABEL] = template_hash((ds.get("spec") or {}).get("template") or {})
        base_pod = pod_from_template(ds, "DaemonSet", template)
        base_pod["spec"]["tolerations"] = with_daemon_tolerations(base_pod["spec"])
        queue = list(nodes)

        def create_one() -> None:
            node = queue.pop()
            pod = copy.deepcopy(base_pod)
            pin_to_node(pod["spec"], node)
            created = self.store.create("pods", pod, namespace=ns, user=USER)
            self.event(ds, "Normal", "SuccessfulCreate", f"Created pod: {created['metadata']['name']}")

        self.log.info("creating daemon pods", extra={"daemonset": ds["metadata"]["name"],
                                                     "namespace": ns, "count": len(nodes)})
        _, failed = slow_start_batch(len(nodes), 1, create_one, self.pool)
        if failed:
            raise failed[0]

    def _delete(self, pod: dict[str, Any]) -> None:
        with contextlib.suppress(errors.NotFound, errors.Conflict):
            self.store.delete("pods", pod["metadata"]["name"], pod["metadata"]["namespace"],
                              preconditions={"uid": pod["metadata"]["uid"]})

    def _update_status(self, ds: dict[str, Any], wanted: set[str], generation: str) -> None:
        now = self.clock.now()
        min_ready = float((ds.get("spec") or {}).get("minReadySeconds") or 0)
        scheduled = misscheduled = ready = available = updated = 0
        for p in self.informer.pods_owned_by(ds["metadata"]["uid"]):
            node = (p.get("spec") or {}).get("nodeName")
            if not node or pods.is_terminating(p):
                continue
            if node not in wanted:
                misscheduled += 1
                continue
            scheduled += 1
            if pods.is_ready(p):
                ready += 1
            if pods.is_available(p, min_ready, now):
                available += 1
            if (p["metadata"].get("labels") or {}).get(GENERATION_LABEL) == generation:
                updated += 1
        if min_ready and available < ready:
            self.queue.add_after(base.key_of(ds), min_ready)
        status: dict[str, Any] = {
            "currentNumberScheduled": scheduled,
            "desiredNumberScheduled": len(wanted),
            "numberMisscheduled": misscheduled,
            "numberReady": ready,
            "observedGeneration": ds["metadata"].get("generation", 1),
            "updatedNumberScheduled": updated,
            "numberAvailable": available,
            "numberUnavailable": len(wanted) - available,
        }

        def edit(obj: dict[str, Any]) -> None:
            out = {k: v for k, v in status.items()
                   if v or k in ("currentNumberScheduled", "desiredNumberScheduled",
                                 "numberMisscheduled", "numberReady", "observedGeneration")}
            old = obj.get("status") or {}
            for keep in ("conditions", "collisionCount"):
                if keep in old:
                    out[keep] = old[keep]
            obj["status"] = out

        with contextlib.suppress(errors.NotFound):
            self.store.mutate("daemonsets", ds["metadata"]["name"], ds["metadata"]["namespace"], edit)
