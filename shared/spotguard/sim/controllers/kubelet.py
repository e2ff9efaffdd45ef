"""The kubelets of every node, as far as the API shows them: a bound pod becomes
Running and Ready ``ready_delay_seconds`` after it is bound; a terminating pod
is removed after min(deletionGracePeriodSeconds, termination_seconds). The
kubelet of a node whose instance is gone (:mod:`spotguard.sim.cloud`) does
nothing at all: its pods neither start nor finish terminating.
https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/
"""

from __future__ import annotations

import contextlib
import itertools
from typing import Any

from spotguard.sim import clock as simclock
from spotguard.sim import cloud as cloud_mod
from spotguard.sim import errors, scheduler
from spotguard.sim.controllers import base, pods


class Kubelet(base.Controller):
    name = "kubelet"
    primary = "pods"
    workers = 2
    resync_seconds = 30.0

    def __init__(self, store: Any, informer: base.Informer, *, ready_delay_seconds: float,
                 termination_seconds: float) -> None:
        super().__init__(store, informer)
        self.ready_delay = ready_delay_seconds
        self.termination = termination_seconds
        self._ips = itertools.count(1)
        self._waiting: set[base.Key] = set()
        # When each pending pod was first seen bound: it starts ready_delay after that, however
        # often it is synced before (a resync, its node turning Ready) - never sooner.
        self._bound_at: dict[base.Key, float] = {}
        self.cloud = cloud_mod.of(store)

    def handle(self, event_type: str, resource: str, obj: dict[str, Any]) -> None:
        if resource == "nodes" and event_type != "DELETED" and scheduler.node_ready(obj):
            # a node back to Ready: start what waited for it
            for p in self.informer.pods_on_node(obj["metadata"]["name"]):
                self.queue.add(base.key_of(p))
            return
        if resource != "pods" or event_type == "DELETED":
            return
        if not (obj.get("spec") or {}).get("nodeName"):
            return
        key = base.key_of(obj)
        if pods.is_terminating(obj):
            self.queue.add_after(key, self._removal_delay(obj))
        elif (obj.get("status") or {}).get("phase") == "Pending" and key not in self._waiting:
            # bound: start the containers after the delay
            self._waiting.add(key)
            self._bound_at.setdefault(key, self.clock.now())
            self.queue.add_after(key, self.ready_delay)

    def resync(self) -> None:
        for p in self.informer.list("pods"):
            if (p.get("spec") or {}).get("nodeName") and (
                pods.is_terminating(p) or (p.get("status") or {}).get("phase") == "Pending"
            ):
                self.queue.add(base.key_of(p))

    def _removal_delay(self, pod: dict[str, Any]) -> float:
        meta = pod["metadata"]
        grace = float(meta.get("deletionGracePeriodSeconds") or 0)
        try:
            deadline = simclock.parse_iso(meta["deletionTimestamp"])
        except (KeyError, ValueError):
            return 0.0
        due = deadline - grace + min(grace, self.termination)
        return float(due - self.clock.now())

    def sync(self, key: Any) -> None:
        ns, name = key
        self._waiting.discard(key)
        try:
            pod = self.store.get("pods", name, ns)
        except errors.NotFound:
            self._bound_at.pop(key, None)
            return
        node_name = (pod.get("spec") or {}).get("nodeName")
        if not node_name or not self.cloud.running(node_name):
            return
        if pods.is_terminating(pod):
            self._bound_at.pop(key, None)
            delay = self._removal_delay(pod)
            if delay > 0.01:
                self.queue.add_after(key, delay)
                return
            with contextlib.suppress(errors.NotFound):
                self.store.remove("pods", name, ns)
            return
        if (pod.get("status") or {}).get("phase") != "Pending":
            self._bound_at.pop(key, None)
            return
        left = self._bound_at.setdefault(key, self.clock.now()) + self.ready_delay - self.clock.now()
        if left > 0:  # never sooner than the delay (a timer that fired early waits the rest)
            self.queue.add_after(key, left)
            return
        node = self.informer.get("nodes", ("", node_name))
        if node is None or not scheduler.node_ready(node):
            return
        self._bound_at.pop(key, None)
        self._start(ns, name, node)

    def _start(self, ns: str, name: str, node: dict[str, Any]) -> None:
        now = self.clock.iso()
        try:
            pod = self.store.get("pods", name, ns)
        except errors.NotFound:
            return
        if not scheduler.matches_node_affinity(scheduler.PodInfo.from_pod(pod), scheduler.NodeInfo.from_node(node)):
            # A real kubelet admits a pod by the scheduler's GeneralPredicates too
            # (pkg/kubelet/lifecycle/predicate.go): a pod bound by spec.nodeName to a node its
            # nodeSelector or required node affinity does not match fails at once, phase
            # Failed, reason NodeAffinity (its controller then creates another).
            def reject(pod: dict[str, Any]) -> None:
                if pods.is_terminating(pod) or (pod.get("status") or {}).get("phase") != "Pending":
                    return
                pod.setdefault("status", {}).update(
                    phase="Failed",
                    reason="NodeAffinity",
                    message="Pod was rejected: Predicate NodeAffinity failed: "
                    "node(s) didn't match Pod's node affinity/selector",
                )

            with contextlib.suppress(errors.NotFound):
                self.store.mutate("pods", name, ns, reject)
            return
        n = next(self._ips)
        pod_ip = f"10.{(n >> 16) & 255}.{(n >> 8) & 255}.{n & 255}"
        addresses = (node.get("status") or {}).get("addresses") or []
        host_ip = next((a.get("address") for a in addresses if a.get("type") == "InternalIP"),
                       "192.168.0.1")

        def edit(pod: dict[str, Any]) -> None:
            if pods.is_terminating(pod) or (pod.get("status") or {}).get("phase") != "Pending":
                return
            status = pod.setdefault("status", {})
            status.update(phase="Running", hostIP=host_ip, podIP=pod_ip, startTime=now,
                          podIPs=[{"ip": pod_ip}], hostIPs=[{"ip": host_ip}])
            for kind in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady",
                         "PodScheduled"):
                pods.set_condition(pod, kind, "True", now)
            status["containerStatuses"] = [
                {
                    "name": c.get("name", ""),
                    "image": c.get("image", ""),
                    "imageID": f"sim://{c.get('image', '')}",
                    "containerID": f"containerd://{pod['metadata'].get('uid', '')}-{i}",
                    "ready": True,
                    "started": True,
                    "restartCount": 0,
                    "state": {"running": {"startedAt": now}},
                    "lastState": {},
                }
                for i, c in enumerate((pod.get("spec") or {}).get("containers") or [])
            ]

        with contextlib.suppress(errors.NotFound):
            self.store.mutate("pods", name, ns, edit)
