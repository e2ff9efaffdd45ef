"""Serving replicas per workload on the simulated cluster: the truth, not the API's Ready condition.

A pod serves while it is Ready, not terminating, and its node still runs. A
node stops running at its reclaim time (the instance is gone, whatever the API
still says for tens of seconds), when it is deleted, or when it goes NotReady.
:class:`Serving` subscribes to the simulated store, so a dip between two polls
is still seen, and a ticker calls :meth:`Serving.tick` so that a reclaim with no
API change still counts at once.

Once armed (at the notice) it keeps, per workload: the serving count just
before, the lowest since, the simulated seconds below the desired count, and
the pod-seconds placed on spot and on on-demand (for the cost); and, for the
plot, every change of serving replicas on spot and on on-demand.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from spotguard_sim import pods as pod_objects
from spotguard_sim import readiness

Obj = dict[str, Any]
SPOT = "spot"
ON_DEMAND = "on-demand"


@dataclass
class Pod:
    key: str
    node: str
    ready: bool  # the API's Ready condition, and not terminating
    evicted: bool = False  # DisruptionTarget by the Eviction API (a drain, an autoscaler's consolidation)


@dataclass
class Counts:
    """One workload's numbers now and since the notice."""

    serving: dict[str, int] = field(default_factory=lambda: {SPOT: 0, ON_DEMAND: 0})
    placed: dict[str, int] = field(default_factory=lambda: {SPOT: 0, ON_DEMAND: 0})  # bound to a live node
    before: int = 0  # serving just before the notice
    lowest: int = 0
    below_seconds: float = 0.0  # simulated seconds serving < desired
    pod_seconds: dict[str, float] = field(default_factory=lambda: {SPOT: 0.0, ON_DEMAND: 0.0})
    since: float = 0.0  # when the integrals were last brought up to date
    safe: int = 0  # serving on nodes with no reclaim ahead
    covered: float | None = None  # since the notice: when ``safe`` first reached ``before``
    # since the notice: serving pods on nodes that stay taken by the Eviction API (an
    # autoscaler's consolidation, a drain): what dips the count after the replacements served
    evicted: int = 0

    @property
    def total(self) -> int:
        return self.serving[SPOT] + self.serving[ON_DEMAND]


class Serving:
    """Serving replicas per workload after every change of pods and nodes (see the module docstring)."""

    def __init__(self, clock: Callable[[], float], capacity_of: Callable[[Mapping[str, str]], str]) -> None:
        self.clock = clock
        self.capacity_of = capacity_of  # node labels -> "spot" | "on-demand"
        self.lock = threading.Lock()
        self.pods: dict[str, Pod] = {}
        self.nodes: dict[str, str] = {}  # live node -> capacity
        self.dead: set[str] = set()
        self.deaths: dict[str, float] = {}  # node -> simulated time its instance goes
        self.counts: dict[str, Counts] = defaultdict(Counts)
        self.desired: dict[str, int] = {}
        self.armed_at: float | None = None
        self.series: list[tuple[float, str, int, int]] = []  # (time, key, serving on spot, on on-demand)
        self.created: list[float] = []  # simulated times workload pods were created since the notice
        # Since the notice: simulated seconds from a workload pod's creation to its binding, where
        # the scheduler never found it unschedulable (so the wait was the scheduler's own lag).
        self.bind_waits: list[float] = []
        self._unbound: dict[str, float | None] = {}  # uid -> first seen unbound (None: found unschedulable)

    # -- feeding ---------------------------------------------------------------------------

    def start(self, store: Any) -> None:
        """Read the store's nodes and pods, then follow every change."""
        nodes, _ = store.list("nodes")
        pods, _ = store.list("pods")
        with self.lock:
            for n in nodes:
                self._node("ADDED", n)
            for p in pods:
                self._pod("ADDED", p)
        store.subscribe(self.on_change)

    def stop(self, store: Any) -> None:
        store.unsubscribe(self.on_change)

    def on_change(self, event_type: str, resource: str, obj: Obj) -> None:
        with self.lock:
            if resource == "pods":
                self._pod(event_type, obj)
            elif resource == "nodes":
                self._node(event_type, obj)

    def will_die(self, nodes: Iterable[str], when: float) -> None:
        """The instances behind ``nodes`` go at simulated time ``when`` (their pods stop serving then):
        from now on a workload is covered (:attr:`Counts.covered`) once as many pods serve on
        nodes that stay as served before the notice."""
        now = self.clock()
        with self.lock:
            new = {n for n in nodes if n not in self.deaths}
            for p in self.pods.values():  # one pass over the pods, however many nodes go
                if p.node in new and self._weight(p)[1]:
                    self.counts[p.key].safe -= 1
            self.deaths.update(dict.fromkeys(new, when))
            for c in self.counts.values():
                self._cover(c, now)

    def tick(self) -> None:
        """Kill the nodes whose reclaim time has come."""
        now = self.clock()
        with self.lock:
            for name, when in list(self.deaths.items()):
                if when <= now and name not in self.dead:
                    self._kill(name)

    def arm(self, desired: Mapping[str, int]) -> None:
        """The notice: remember each workload's serving count now; record lows and time from here."""
        now = self.clock()
        with self.lock:
            self.desired = dict(desired)
            self.armed_at = now
            for key in set(desired) | set(self.counts):
                c = self.counts[key]
                c.before = c.lowest = c.total
                c.since = now
                self.series.append((now, key, c.serving[SPOT], c.serving[ON_DEMAND]))

    def settle(self) -> None:
        """Bring the integrals up to now (before reading them)."""
        now = self.clock()
        with self.lock:
            for key in self.counts:
                self._advance(key, now)

    # -- reading ---------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Counts]:
        with self.lock:
            return {
                k: replace(c, serving=dict(c.serving), placed=dict(c.placed), pod_seconds=dict(c.pod_seconds))
                for k, c in self.counts.items()
            }

    def serving_on(self, nodes: Iterable[str]) -> dict[str, int]:
        """Serving pods per workload on ``nodes`` (what their loss takes away)."""
        names = set(nodes)
        out: dict[str, int] = defaultdict(int)
        with self.lock:
            for p in self.pods.values():
                if p.node in names and self._weight(p)[1]:
                    out[p.key] += 1
        return dict(out)

    def bind_lag(self, start: int = 0) -> tuple[int, float, float]:
        """(pods bound since the notice, the 99th percentile and the longest of their waits for
        the scheduler, in simulated seconds), pods found unschedulable left out; from the
        ``start``-th binding on (an earlier count: what was bound since)."""
        with self.lock:
            waits = sorted(self.bind_waits[start:])
        if not waits:
            return 0, 0.0, 0.0
        return len(waits), waits[min(len(waits) - 1, int(0.99 * len(waits)))], waits[-1]

    def unbound(self) -> int:
        """Workload pods created since it was armed (or found unschedulable) and not yet bound."""
        with self.lock:
            return len(self._unbound)

    def creations(self, start: float, end: float) -> tuple[int, float | None]:
        """(workload pods created between ``start`` and ``end``, when the first was; None: none was)."""
        with self.lock:
            times = [t for t in self.created if start <= t <= end]
        return len(times), min(times, default=None)

    def live_nodes(self, capacity: str | None = None) -> list[str]:
        with self.lock:
            return sorted(
                n for n, cap in self.nodes.items() if n not in self.dead and (capacity is None or cap == capacity)
            )

    # -- internals (under the lock) -------------------------------------------------------

    def _pod(self, event_type: str, obj: Obj) -> None:
        key = readiness.workload_key(obj)
        if key is None:
            return
        uid = obj["metadata"]["uid"]
        old = self.pods.pop(uid, None)
        if old is None and event_type == "ADDED" and self.armed_at is not None:
            self.created.append(self.clock())
        new = None
        if event_type != "DELETED":
            node = (obj.get("spec") or {}).get("nodeName") or ""
            new = Pod(key, node, readiness.is_ready(obj), _evicted(obj))
            self.pods[uid] = new
            if new.evicted and old is not None and not old.evicted and self.armed_at is not None:
                _, serving = self._weight(old)
                if serving and old.node not in self.deaths:
                    self.counts[key].evicted += 1
            self._bind_wait(uid, obj, node, old is None)
        else:
            self._unbound.pop(uid, None)
        if old != new:
            self._change(key, old, new)

    def _bind_wait(self, uid: str, obj: Obj, node: str, first: bool) -> None:
        if node:
            since = self._unbound.pop(uid, None)
            if since is not None:
                self.bind_waits.append(self.clock() - since)
        elif _unschedulable(obj):
            self._unbound[uid] = None
        elif first and self.armed_at is not None:
            self._unbound[uid] = self.clock()

    def _node(self, event_type: str, obj: Obj) -> None:
        meta = obj.get("metadata") or {}
        name = str(meta.get("name"))
        gone = event_type == "DELETED" or (_has_ready_condition(obj) and not readiness.is_ready(obj))
        if gone:
            if name in self.nodes and name not in self.dead:
                self._kill(name)
            return
        if name not in self.nodes and name not in self.dead:
            self.nodes[name] = self.capacity_of(meta.get("labels") or {})
            for p in self.pods.values():
                if p.node == name:
                    self._change(p.key, None, p)  # counted now that its node is known

    def _kill(self, name: str) -> None:
        on_it = [p for p in self.pods.values() if p.node == name]
        for p in on_it:
            self._change(p.key, p, None)
        self.dead.add(name)

    def _weight(self, pod: Pod | None) -> tuple[str | None, bool]:
        """(capacity it counts on, serving) for a pod, or (None, False) where it counts nowhere."""
        if pod is None or not pod.node or pod.node in self.dead or pod.node not in self.nodes:
            return None, False
        return self.nodes[pod.node], pod.ready

    def _change(self, key: str, old: Pod | None, new: Pod | None) -> None:
        now = self.clock()
        self._advance(key, now)
        c = self.counts[key]
        before = (c.serving[SPOT], c.serving[ON_DEMAND])
        for pod, sign in ((old, -1), (new, 1)):
            cap, serving = self._weight(pod)
            if cap is None:
                continue
            c.placed[cap] = c.placed.get(cap, 0) + sign
            if serving:
                c.serving[cap] = c.serving.get(cap, 0) + sign
                if pod is not None and pod.node not in self.deaths:
                    c.safe += sign
        if self.armed_at is not None:
            c.lowest = min(c.lowest, c.total)
            self._cover(c, now)
        if (c.serving[SPOT], c.serving[ON_DEMAND]) != before:
            self.series.append((now, key, c.serving[SPOT], c.serving[ON_DEMAND]))

    def _cover(self, c: Counts, now: float) -> None:
        if self.deaths and c.covered is None and c.safe >= c.before:
            c.covered = now

    def _advance(self, key: str, now: float) -> None:
        if self.armed_at is None:
            return
        c = self.counts[key]
        span = max(0.0, now - max(c.since, self.armed_at))
        if span:
            if c.total < self.desired.get(key, 0):
                c.below_seconds += span
            for cap in (SPOT, ON_DEMAND):
                c.pod_seconds[cap] += span * c.placed.get(cap, 0)
        c.since = max(c.since, now)


def _evicted(obj: Obj) -> bool:
    cond = pod_objects.condition(obj, "DisruptionTarget") or {}
    return cond.get("status") == "True" and cond.get("reason") == "EvictionByEvictionAPI"


def _unschedulable(obj: Obj) -> bool:
    return any(
        c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable"
        for c in (obj.get("status") or {}).get("conditions") or []
    )


def _has_ready_condition(obj: Obj) -> bool:
    return any(c.get("type") == "Ready" for c in (obj.get("status") or {}).get("conditions") or [])


def totals_over_time(series: Iterable[tuple[float, str, int, int]], t0: float) -> list[tuple[float, int]]:
    """All workloads' serving replicas from ``t0`` on, at each change: (seconds since ``t0``, total),
    starting with the total at ``t0``."""
    latest: dict[str, int] = {}
    out: list[tuple[float, int]] = []
    for t, key, spot, od in sorted(series, key=lambda e: e[0]):
        if t >= t0 and not out:
            out.append((0.0, sum(latest.values())))
        latest[key] = spot + od
        if t < t0:
            continue
        total, at = sum(latest.values()), round(t - t0, 1)
        if out[-1][0] == at:
            out[-1] = (at, total)
        elif out[-1][1] != total:
            out.append((at, total))
    return out or [(0.0, sum(latest.values()))]
