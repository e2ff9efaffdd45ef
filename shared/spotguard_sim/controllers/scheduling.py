"""The scheduling loop (kube-scheduler): binds Pending pods without a node to the
best node (``spotguard_sim.scheduler``), one pod at a time in queue order (the
PrioritySort plugin's: higher ``spec.priority`` first, then the earlier queued, so a
new node's DaemonSet pods bind before the Pending pods of lower priority); an
unschedulable pod gets ``PodScheduled=False`` (reason Unschedulable) and waits
until the cluster changes (a node added or changed, a bound pod gone) or a
periodic flush, as the scheduling queue's unschedulable pods do. Moved back, a
pod still in its backoff (1 s after its first failed attempt, doubling to 10 s)
waits in backoffQ, which is flushed each whole second and popped from when
activeQ is empty (SchedulerPopFromBackoffQ, on by default since 1.33).
https://kubernetes.io/docs/concepts/scheduling-eviction/kube-scheduler/

A pod with ``schedulingGates`` waits (``PodScheduled=False``, reason
SchedulingGated) until they are removed. A pod without topology spread
constraints of its own gets the system default ones over its controller's
selector. An unschedulable pod that may preempt evicts lower-priority pods from
the best node (``scheduler.preempt``): they get ``DisruptionTarget`` (reason
PreemptionByScheduler) and are deleted gracefully; the pod is nominated to the
node (``status.nominatedNodeName``) and does not preempt again while its
victims terminate.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import random
import threading
import time
from collections import Counter
from typing import Any

from spotguard_sim import errors, pods, scheduler
from spotguard_sim.controllers import base

SCHEDULER_NAME = "default-scheduler"
_SELECTING_OWNERS = {"ReplicaSet": "replicasets", "StatefulSet": "statefulsets",
                     "ReplicationController": "replicationcontrollers"}
FLUSH_UNSCHEDULABLE_SECONDS = 30.0
# kube-scheduler's defaults (podInitialBackoffSeconds, podMaxBackoffSeconds) and backoffQ's
# ordering window (backoffQOrderingWindowDuration), all in simulated seconds
POD_INITIAL_BACKOFF_SECONDS = 1.0
POD_MAX_BACKOFF_SECONDS = 10.0
BACKOFF_WINDOW_SECONDS = 1.0
log = logging.getLogger("spotguard.sim.scheduler")


class SchedulerLoop:
    name = "scheduler"

    def __init__(self, store: Any, *, seed: int | None = 0, percentage: int = 0) -> None:
        self.store = store
        self.clock = store.clock
        self.cache = scheduler.Cache()
        self.rng = random.Random(seed) if seed is not None else random.Random()
        self.percentage = percentage
        self._lock = threading.Lock()  # guards the cache
        self._cond = threading.Condition()
        # activeQ: a heap in the PrioritySort plugin's order (higher spec.priority first, then
        # the earlier (re)queued; pkg/scheduler/framework/plugins/queuesort/priority_sort.go)
        self._active: list[tuple[int, int, base.Key]] = []
        self._order = itertools.count()
        self._priority: dict[base.Key, int] = {}
        self._queued: set[base.Key] = set()
        # unschedulableQ: each pod with when it was put there (its queue timestamp, refreshed
        # on each failed attempt: "Refresh the timestamp since the pod is re-added",
        # AddUnschedulableIfNotPresent); moved back to activeQ it keeps it, so among equal
        # priorities the pods that failed first are tried first on a new node
        self._unschedulable: dict[base.Key, int] = {}
        # backoffQ (pkg/scheduler/backend/queue/backoff_queue.go): pods moved out of
        # unschedulableQ before their backoff ended, a heap by the window their backoff ends
        # in, then in activeQ's order
        self._backoff: list[tuple[float, int, int, base.Key]] = []
        self._backing: dict[base.Key, int] = {}  # in backoffQ, with its queue order
        self._attempts: dict[base.Key, int] = {}  # scheduling attempts (QueuedPodInfo.Attempts)
        self._failed_at: dict[base.Key, float] = {}  # simulated time of the last failed attempt
        # a move request while a pod is being scheduled sends it, if it fails, to backoffQ
        # rather than unschedulableQ (moveRequestCycle), so the event is not missed
        self._cycle = 0
        self._move_cycle = -1
        # pods nominated to a node by their preemption (the nominator): node, priority, requests
        self._nominated: dict[base.Key, tuple[str, int, dict[str, int]]] = {}
        self._seen: dict[base.Key, int] = {}  # last resourceVersion seen per pod
        self._start = 0
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.bound = 0
        self._selectors: dict[str, dict[str, Any] | None] = {}  # controller uid -> selector
        self.recorder: Any = None  # an events.Recorder

    # ---- notifications -------------------------------------------------------

    def handle(self, event_type: str, resource: str, obj: dict[str, Any]) -> None:
        if resource == "namespaces":
            with self._lock:
                self.cache.ns_labels[obj["metadata"]["name"]] = dict(obj["metadata"].get("labels") or {})
            return
        if resource == "nodes":
            changed = False
            with self._lock:
                if event_type == "DELETED":
                    self.cache.remove_node(obj["metadata"]["name"])
                else:
                    changed = self.cache.set_node(obj)
            if changed:  # a status write that changes nothing scheduling reads requeues nothing
                self._flush_unschedulable()
            return
        if resource != "pods":
            return
        key = base.key_of(obj)
        rv = base.rv_of(obj)
        with self._cond:
            # notifications of concurrent writers may arrive out of order
            if rv < self._seen.get(key, 0):
                return
            self._seen[key] = rv
        if event_type == "DELETED":
            with self._lock:
                was_bound = self.cache.bound(*key) is not None
                self.cache.remove_pod(*key)
            with self._cond:
                self._queued.discard(key)
                self._unschedulable.pop(key, None)
                self._backing.pop(key, None)
                self._priority.pop(key, None)
                self._attempts.pop(key, None)
                self._failed_at.pop(key, None)
                self._nominated.pop(key, None)
            if was_bound:
                self._flush_unschedulable()
            return
        spec = obj.get("spec") or {}
        if spec.get("nodeName"):
            with self._lock:
                self.cache.set_pod(obj)
            with self._cond:
                self._nominated.pop(key, None)
            return
        if pods.is_terminating(obj) or spec.get("schedulerName", SCHEDULER_NAME) != SCHEDULER_NAME:
            return
        if (obj.get("status") or {}).get("phase") not in (None, "Pending"):
            return
        with self._cond:
            self._priority[key] = int(spec.get("priority") or 0)
            if key in self._queued or key in self._unschedulable or key in self._backing:
                return
            self._enqueue(key)
            self._cond.notify()

    def _flush_unschedulable(self) -> None:
        """A cluster change (or the periodic flush): every unschedulable pod to activeQ, or to
        backoffQ while its backoff lasts (movePodsToActiveOrBackoffQueue)."""
        with self._cond:
            self._move_cycle = self._cycle
            if not self._unschedulable:
                return
            now = self.clock.now()
            for key, order in self._unschedulable.items():
                if key in self._queued or key in self._backing:
                    continue
                if self._backing_off(key, now):
                    self._to_backoff(key, order)
                else:
                    self._enqueue(key, order)
            self._unschedulable.clear()
            self._cond.notify()

    def _backoff_ends(self, key: base.Key) -> float:
        """The start of the window the pod's backoff ends in (0: none, never tried):
        its last failed attempt plus 1 s doubled per attempt after the first, 10 s at most."""
        attempts = self._attempts.get(key, 0)
        if attempts == 0:
            return 0.0
        duration = POD_INITIAL_BACKOFF_SECONDS
        for _ in range(1, attempts):
            if duration > POD_MAX_BACKOFF_SECONDS - duration:
                duration = POD_MAX_BACKOFF_SECONDS
                break
            duration += duration
        return _window(self._failed_at.get(key, 0.0) + duration)

    def _backing_off(self, key: base.Key, now: float) -> bool:
        """isPodBackingoff: a backoff ending in the current window still runs."""
        ends = self._backoff_ends(key)
        return ends > 0 and ends >= _window(now)

    def _to_backoff(self, key: base.Key, order: int) -> None:
        """Into backoffQ (the caller holds ``_cond``)."""
        self._backing[key] = order
        heapq.heappush(self._backoff, (self._backoff_ends(key), -self._priority.get(key, 0), order, key))

    def _flush_backoff(self) -> None:
        """flushBackoffQCompleted: the pods whose backoff has ended, to activeQ."""
        with self._cond:
            window = _window(self.clock.now())
            moved = False
            while self._backoff_waiting() and self._backoff[0][0] < window:
                _, _, order, key = heapq.heappop(self._backoff)
                del self._backing[key]
                self._enqueue(key, order)
                moved = True
            if moved:
                self._cond.notify()

    def _enqueue(self, key: base.Key, order: int | None = None) -> None:
        """Into activeQ (the caller holds ``_cond``), queued now or at ``order``."""
        self._queued.add(key)
        stamp = next(self._order) if order is None else order
        heapq.heappush(self._active, (-self._priority.get(key, 0), stamp, key))

    def prime(self) -> None:
        for ns in self.store.list("namespaces")[0]:
            self.handle("ADDED", "namespaces", ns)
        nodes, _ = self.store.list("nodes")
        for n in nodes:
            self.handle("ADDED", "nodes", n)
        items, _ = self.store.list("pods")
        for p in items:
            self.handle("ADDED", "pods", p)

    # ---- the loop ------------------------------------------------------------

    def start(self) -> None:
        for target, name in ((self._run, "sim-scheduler"), (self._periodic, "sim-scheduler-flush"),
                             (self._backoff_ticker, "sim-scheduler-backoff")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify_all()

    def join(self, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))

    def _periodic(self) -> None:
        while not self._stop.wait(max(self.clock.real(FLUSH_UNSCHEDULABLE_SECONDS), base.MIN_RESYNC_REAL_SECONDS)):
            self._flush_unschedulable()

    def _backoff_ticker(self) -> None:
        """Flushes backoffQ at each whole simulated second (waitUntilAlignedWithOrderingWindow)."""
        while True:
            wait = BACKOFF_WINDOW_SECONDS - (self.clock.now() % BACKOFF_WINDOW_SECONDS)
            if self._stop.wait(max(self.clock.real(wait), 0.01)):
                return
            self._flush_backoff()

    def _next(self) -> base.Key | None:
        with self._cond:
            while not self._active and not self._backoff_waiting():
                if self._stop.is_set():
                    return None
                self._cond.wait(0.5)
            if self._stop.is_set():
                return None
            if self._active:
                _, _, key = heapq.heappop(self._active)
                self._queued.discard(key)
            else:
                # activeQ is empty: the head of backoffQ is tried at once (SchedulerPopFromBackoffQ)
                _, _, _, key = heapq.heappop(self._backoff)
                del self._backing[key]
            self._attempts[key] = self._attempts.get(key, 0) + 1
            self._cycle += 1  # the cycle of the pod in flight: one scheduling thread pops
            return key

    def _backoff_waiting(self) -> bool:
        """Whether backoffQ holds a pod, its head then one still in it: entries of pods that
        left since (deleted, or popped when activeQ was empty) are dropped (the caller holds
        ``_cond``)."""
        while self._backoff:
            _, _, order, key = self._backoff[0]
            if self._backing.get(key) == order:
                return True
            heapq.heappop(self._backoff)
        return False

    def _run(self) -> None:
        while True:
            key = self._next()
            if key is None:
                return
            try:
                self.schedule_one(key)
            except Exception:
                if not self._stop.is_set():
                    log.exception("scheduling failed", extra={"pod": "/".join(key)})
                    with self._cond:
                        self._failed_at[key] = self.clock.now()
                        self._to_backoff(key, next(self._order))  # podErrorBackoffQ
                        self._cond.notify()

    def schedule_one(self, key: base.Key) -> str | None:
        ns, name = key
        try:
            pod = self.store.get("pods", name, ns)
        except errors.NotFound:
            return None
        if (pod.get("spec") or {}).get("nodeName") or pods.is_terminating(pod):
            return None
        if (pod.get("spec") or {}).get("schedulingGates"):
            self._gated(key, pod)
            return None
        info = scheduler.PodInfo.from_pod(pod, self._default_spread_selector(pod))
        # Read from the store before the cache lock is taken: a store write holds the store's
        # lock while it tells this loop (handle() takes the cache lock), so reading the store
        # under the cache lock deadlocks the two.
        budgets = self._budgets() if info.preempts else []
        nominated = self._held_for(key, info.priority)
        cleared = False
        with self._lock:
            result = scheduler.schedule(info, self.cache, start=self._start, rng=self.rng,
                                        percentage=self.percentage, nominated=nominated)
            self._start = result.next_start
            total = len(self.cache.nodes)
            preemption = None
            if result.node is not None:
                # assume, as kube-scheduler does, before binding (in the same hold of the lock)
                self.cache.add_assumed(info, result.node)
            elif self._may_preempt(pod, info):
                preemption = scheduler.preempt(info, self.cache, budgets, nominated)
                if preemption is None:  # nowhere to preempt: the nomination is cleared
                    cleared = True
        if cleared:
            with self._cond:
                self._nominated.pop(key, None)
        if result.node is None:
            self._unschedulable_pod(key, result.message(total))
            self._event(pod, "Warning", "FailedScheduling", result.message(total), "Scheduling")
            if preemption is not None:
                self._preempt(key, preemption)
                with self._cond:
                    self._nominated[key] = (preemption.node, info.priority, dict(info.requests))
            return None
        node = result.node
        now = self.clock.iso()

        def bind(obj: dict[str, Any]) -> None:
            if obj["spec"].get("nodeName"):
                raise errors.conflict("pods/binding", name,
                                      err=f'pod {name} is already assigned to node "{obj["spec"]["nodeName"]}"')
            obj["spec"]["nodeName"] = node
            pods.set_condition(obj, "PodScheduled", "True", now)

        try:
            self.store.mutate("pods", name, ns, bind)
        except (errors.NotFound, errors.Conflict):
            with self._lock:
                if self.cache.bound(ns, name) == node:
                    self.cache.remove_pod(ns, name)
            return None
        self.bound += 1
        log.debug("bound", extra={"pod": "/".join(key), "node": node})
        self._event(pod, "Normal", "Scheduled", f"Successfully assigned {ns}/{name} to {node}",
                    "Binding")
        return node

    def _held_for(self, key: base.Key, priority: int) -> dict[str, Counter[str]]:
        """Per node, what the pods nominated there with at least ``priority`` request (the
        pod being scheduled excepted): the room a preemption freed for them."""
        held: dict[str, Counter[str]] = {}
        with self._cond:
            for other, (node, nominee_priority, requests) in self._nominated.items():
                if other == key or nominee_priority < priority:
                    continue
                c = held.setdefault(node, Counter())
                c.update(requests)
                c["pods"] += 1
        return held

    def _event(self, obj: dict[str, Any], type_: str, reason: str, message: str,
               action: str) -> None:
        """kube-scheduler records through the events.k8s.io/v1 API (actions as upstream's:
        Scheduling, Binding, Preempting)."""
        if self.recorder is not None:
            self.recorder.record(obj, type_, reason, message, component=SCHEDULER_NAME,
                                 action=action)

    def _default_spread_selector(self, pod: dict[str, Any]) -> dict[str, Any] | None:
        """The selector of the pod's ReplicaSet, StatefulSet or ReplicationController, for the
        system default spreading (helper.DefaultSelector; Services are not consulted)."""
        ref = base.controller_ref(pod)
        if not ref or ref.get("kind") not in _SELECTING_OWNERS:
            return None
        uid = str(ref.get("uid"))
        if uid not in self._selectors:
            try:
                owner = self.store.get(_SELECTING_OWNERS[ref["kind"]], ref.get("name", ""),
                                       pod["metadata"].get("namespace"))
            except errors.NotFound:
                return None
            selector = (owner.get("spec") or {}).get("selector")
            if ref["kind"] == "ReplicationController" and isinstance(selector, dict):
                selector = {"matchLabels": selector}
            if len(self._selectors) > 10_000:
                self._selectors.clear()
            self._selectors[uid] = selector if isinstance(selector, dict) and selector else None
        return self._selectors[uid]

    def _budgets(self) -> scheduler.Budgets:
        items, _ = self.store.list("poddisruptionbudgets")
        return [(b["metadata"].get("namespace", ""), (b.get("spec") or {}).get("selector") or {},
                 int((b.get("status") or {}).get("disruptionsAllowed") or 0)) for b in items]

    def _gated(self, key: base.Key, pod: dict[str, Any]) -> None:
        cond = pods.condition(pod, "PodScheduled")
        if cond and cond.get("reason") == "SchedulingGated":
            return
        now = self.clock.iso()

        def edit(obj: dict[str, Any]) -> None:
            if obj["spec"].get("schedulingGates") and not obj["spec"].get("nodeName"):
                pods.set_condition(obj, "PodScheduled", "False", now, reason="SchedulingGated",
                                   message="Scheduling is blocked due to non-empty scheduling gates")

        with contextlib.suppress(errors.NotFound):
            self.store.mutate("pods", key[1], key[0], edit)

    def _may_preempt(self, pod: dict[str, Any], info: scheduler.PodInfo) -> bool:
        """PodEligibleToPreemptOthers: not while lower-priority pods on its nominated node
        are still terminating."""
        if not info.preempts:
            return False
        nominated = (pod.get("status") or {}).get("nominatedNodeName")
        if not nominated:
            return True
        return not any(e.terminating and e.priority < info.priority
                       for _, e in self.cache.pods_on(nominated))

    def _preempt(self, key: base.Key, preemption: scheduler.Preemption) -> None:
        now = self.clock.iso()
        ns, name = key
        message = f"{self.name}: preempting to accommodate a higher priority pod"
        log.info("preempting", extra={"pod": "/".join(key), "node": preemption.node,
                                      "victims": ["/".join(v) for v in preemption.victims]})

        def nominate(obj: dict[str, Any]) -> None:
            obj.setdefault("status", {})["nominatedNodeName"] = preemption.node

        def mark(obj: dict[str, Any]) -> None:
            pods.set_condition(obj, "DisruptionTarget", "True", now, reason="PreemptionByScheduler",
                               message=f"Kubernetes default scheduler: {message}")

        with contextlib.suppress(errors.NotFound):
            self.store.mutate("pods", name, ns, nominate)
        for v_ns, v_name in preemption.victims:
            with contextlib.suppress(errors.NotFound, errors.Conflict):
                victim = self.store.mutate("pods", v_name, v_ns, mark)
                self.store.delete("pods", v_name, v_ns)
                self._event(victim, "Normal", "Preempted",
                            f"Preempted by pod {ns}/{name} on node {preemption.node}", "Preempting")

    def _unschedulable_pod(self, key: base.Key, message: str) -> None:
        now = self.clock.iso()
        with self._cond:
            # AddUnschedulableIfNotPresent: the attempt's time refreshed; a cluster change
            # seen while the pod was being scheduled sends it to backoffQ, not unschedulableQ
            self._failed_at[key] = self.clock.now()
            if self._move_cycle >= self._cycle:
                self._to_backoff(key, next(self._order))
                self._cond.notify()
            else:
                self._unschedulable[key] = next(self._order)

        def edit(obj: dict[str, Any]) -> None:
            if not obj["spec"].get("nodeName"):
                pods.set_condition(obj, "PodScheduled", "False", now, reason="Unschedulable",
                                   message=message)

        try:
            self.store.mutate("pods", key[1], key[0], edit)
        except errors.NotFound:
            with self._cond:
                self._unschedulable.pop(key, None)
                self._backing.pop(key, None)
        log.debug("pod unschedulable", extra={"pod": "/".join(key), "reason": message})


def _window(t: float) -> float:
    """The start of the backoff ordering window ``t`` falls in (alignToWindow)."""
    return t - (t % BACKOFF_WINDOW_SECONDS)
