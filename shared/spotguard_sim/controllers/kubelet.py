"""The kubelets of every node, as far as the API shows them: a bound pod becomes
Running and Ready ``ready_delay_seconds`` after it is bound; a terminating pod
is removed after min(deletionGracePeriodSeconds, termination_seconds). The
kubelet of a node whose instance is gone (:mod:`spotguard_sim.cloud`) does
nothing at all: its pods neither start nor finish terminating.
https://kubernetes.io/docs/concepts/workloads/pods/pod-lifecycle/

Readiness that flaps (issue 26), driven by the scenario: a pod annotated
``sim.spotguard.io/readiness-flaps: "every=120,down=30[,restart=true][,offset=S]"`` (set it on a
workload's pod template) goes not Ready for ``down`` seconds every ``every`` seconds of its life
(its failing readiness probe: ``Ready`` and ``ContainersReady`` False, reason
``ContainersNotReady``, each container ``ready: false``), then Ready again; with
``restart=true`` each flap is a container restart too (``restartCount`` up by one,
``lastState.terminated``, a new ``startedAt``), as a liveness probe's failure does. The first
flap comes ``offset`` seconds after the pod started (default: a share of ``every`` taken from
the pod's uid, so a workload's pods do not flap in step). The pod stays Running on its node; the
ReplicaSet controller ranks it first for deletion while it is not Ready
(``controller.ActivePods``: not Ready before Ready, before ``pod-deletion-cost``), and the
endpoints, the eviction API's budgets and spotguard's counts see it not serving.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import itertools
from typing import Any

from spotguard_sim import clock as simclock
from spotguard_sim import cloud as cloud_mod
from spotguard_sim import errors, pods, scheduler
from spotguard_sim.controllers import base

FLAPS = "sim.spotguard.io/readiness-flaps"


@dataclasses.dataclass(frozen=True)
class Flaps:
    every: float
    down: float
    restart: bool = False
    offset: float | None = None

    @classmethod
    def of(cls, pod: dict[str, Any]) -> Flaps | None:
        """The pod's flaps, or None (no annotation, or one that does not parse: ignored, as a
        kubelet ignores annotations it does not know)."""
        text = ((pod.get("metadata") or {}).get("annotations") or {}).get(FLAPS)
        if not text:
            return None
        fields: dict[str, str] = {}
        for part in str(text).split(","):
            key, _, value = part.strip().partition("=")
            fields[key.strip()] = value.strip()
        try:
            every, down = float(fields["every"]), float(fields["down"])
            offset = float(fields["offset"]) if "offset" in fields else None
        except (KeyError, ValueError):
            return None
        if every <= 0 or down <= 0 or down >= every:
            return None
        return cls(every, down, fields.get("restart", "false").lower() == "true", offset)

    def phase(self, pod: dict[str, Any], now: float) -> tuple[bool, int, float]:
        """(down now, how many flaps have begun, when the state next changes)."""
        started = simclock.parse_iso(str((pod.get("status") or {}).get("startTime") or "")) if (
            (pod.get("status") or {}).get("startTime")) else now
        offset = self.offset
        if offset is None:
            uid = str((pod.get("metadata") or {}).get("uid") or (pod.get("metadata") or {}).get("name"))
            offset = (int(hashlib.sha256(uid.encode()).hexdigest()[:8], 16) % 1000) / 1000 * self.every
        first = started + offset
        if now < first:
            return False, 0, first
        k, into = divmod(now - first, self.every)
        begun = int(k) + 1
        if into < self.down:
            return True, begun, first + k * self.every + self.down
        return False, begun, first + (k + 1) * self.every


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
        elif (obj.get("status") or {}).get("phase") == "Running" and FLAPS in (
            (obj.get("metadata") or {}).get("annotations") or {}
        ):
            self.queue.add(key)  # its flaps, from now (annotated while it ran)

    def resync(self) -> None:
        for p in self.informer.list("pods"):
            if (p.get("spec") or {}).get("nodeName") and (
                pods.is_terminating(p) or (p.get("status") or {}).get("phase") == "Pending"
                or FLAPS in ((p.get("metadata") or {}).get("annotations") or {})
            ):
                self.queue.add(base.key_of(p))

    def _flap(self, key: base.Key, pod: dict[str, Any]) -> None:
        """Bring a flapping pod's readiness to where its schedule is now, and wake at the next
        change (:class:`Flaps`)."""
        flaps = Flaps.of(pod)
        if flaps is None:
            return
        now = self.clock.now()
        down, begun, change = flaps.phase(pod, now)
        self.queue.add_after(key, max(0.01, change - now))
        ready = "False" if down else "True"
        conds = {c.get("type"): c.get("status") for c in (pod.get("status") or {}).get("conditions") or []}
        restarts = max((int(c.get("restartCount") or 0) for c in (pod.get("status") or {}).get(
            "containerStatuses") or []), default=0)
        if conds.get("Ready") == ready and (not flaps.restart or restarts >= begun):
            return
        at = self.clock.iso()

        def edit(p: dict[str, Any]) -> None:
            if pods.is_terminating(p) or (p.get("status") or {}).get("phase") != "Running":
                return
            reason = "ContainersNotReady" if down else ""
            names = [c.get("name", "") for c in (p.get("spec") or {}).get("containers") or []]
            message = f"containers with unready status: [{' '.join(names)}]" if down else ""
            for kind in ("Ready", "ContainersReady"):
                pods.set_condition(p, kind, ready, at, reason=reason, message=message)
            for cs in (p.get("status") or {}).get("containerStatuses") or []:
                cs["ready"] = not down
                if flaps.restart and int(cs.get("restartCount") or 0) < begun:
                    started = (cs.get("state") or {}).get("running", {}).get("startedAt", at)
                    cs["restartCount"] = begun
                    cs["lastState"] = {"terminated": {"exitCode": 137, "reason": "Error", "startedAt": started,
                                                      "finishedAt": at}}
                    cs["state"] = {"running": {"startedAt": at}}

        with contextlib.suppress(errors.NotFound):
            self.store.mutate("pods", key[1], key[0], edit)

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
            if (pod.get("status") or {}).get("phase") == "Running":
                self._flap(key, pod)
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
            started = self.store.mutate("pods", name, ns, edit)
            if Flaps.of(started) is not None:
                self._flap((ns, name), started)
