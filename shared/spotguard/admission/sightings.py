"""The eviction guard's sightings: when this process first saw a node being drained.

The grace of a node without spotguard's notice (and of a drain that starts after a
rebalance recommendation's hold) is counted from the first sighting of the node's
drain signals (:attr:`spotguard.policy.evictions.NodeFacts.drain_signals`: a cordon,
a drainer's or an autoscaler's taint), on this process's clock only. A sighting lasts
while the node is seen going away with those signals; it starts again when

- a signal is added (a drainer's taint after a rebalance recommendation's taint, an
  interruption drainer's cordon after a rebalance's hold): a new drain;
- the node was seen not going away in between (a drain aborted, a consolidation
  cancelled: ``kubectl uncordon``): the next drain is a new one. Every node read the
  guard makes counts (each review's node list shows every node), and while this process
  holds sightings it reads their nodes again every ``refresh`` seconds, so a drain
  aborted between two reviews is seen even when no review comes in between;
- it is older than :data:`MAX_AGE` (a node cordoned for maintenance for hours).

Nothing is shared or written: a second webhook process (a replica, a gunicorn worker, a
restarted one) has sightings of its own and gives a drain it has not seen its own
grace. So with n processes a drain waits at most n graces, and a restart costs one
grace more, never one less: nothing a restart loses can let a pod go early.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from spotguard.policy.evictions import NodeFacts

log = logging.getLogger(__name__)
MAX_AGE = 600.0  # seconds: an older sighting is dropped (the next review sees a new drain)
MAX_NODES = 10_000
REFRESH_SECONDS = 2.0  # real seconds between two reads of the sighted nodes


@dataclass
class Sighting:
    signals: frozenset[str]
    first: float  # the guard's clock


class Sightings:
    """Per node: the drain signals last seen and when they were first seen."""

    def __init__(self, clock: Callable[[], float], refresh: float = REFRESH_SECONDS) -> None:
        self.clock = clock
        self.refresh = refresh
        self._lock = threading.Lock()
        self._seen: dict[str, Sighting] = {}
        self._reader: threading.Thread | None = None

    def observe(
        self, node: NodeFacts, now: float | None = None, read_at: float | None = None, *, start: bool = True
    ) -> float | None:
        """Record what ``node`` shows; the first sighting of its drain signals (None: it
        shows none: any sighting of it ends). ``read_at``: when the read that showed it
        began (default ``now``); a read that began before the sighting is older than it
        and changes nothing. ``start``: a review's read, which may start a sighting (the
        list and the reader only keep or end those there are)."""
        now = self.clock() if now is None else now
        signals = node.drain_signals if node.going_away else frozenset()
        with self._lock:
            seen = self._seen.get(node.name)
            if seen is not None and read_at is not None and read_at < seen.first:
                return seen.first
            if not signals:
                self._seen.pop(node.name, None)
                return None
            if seen is None or not signals <= seen.signals or now - seen.first > MAX_AGE:
                if not start:
                    self._seen.pop(node.name, None)
                    return None
                if seen is None and len(self._seen) >= MAX_NODES:
                    self._seen.clear()
                seen = self._seen[node.name] = Sighting(signals, now)
            else:
                seen.signals = signals  # one gone: adding it again is a new drain
            return seen.first

    def observe_all(self, nodes: Iterable[NodeFacts], read_at: float) -> None:
        """A list of every node, begun at ``read_at``: the sighted nodes it shows, and those
        it does not show (gone), are observed; no sighting starts from it."""
        listed = {n.name: n for n in nodes}
        for name in self.held():
            node = listed.get(name)
            if node is None:
                node = NodeFacts(name, spot=False)  # gone: going away no more
            self.observe(node, read_at=read_at, start=False)

    def forget(self, names: Iterable[str]) -> None:
        with self._lock:
            for name in names:
                self._seen.pop(name, None)

    def held(self) -> list[str]:
        with self._lock:
            return list(self._seen)

    # -- the reader: the sighted nodes read again while any are held

    def watch(self, read: Callable[[str], Any], facts: Callable[[Any], NodeFacts]) -> None:
        """Start the reader if it is not running: every ``refresh`` seconds, ``read`` each
        sighted node (None: gone) and observe ``facts`` of it, until no sighting is left."""
        with self._lock:
            if self._reader is not None and self._reader.is_alive():
                return
            self._reader = threading.Thread(
                target=self._run, args=(read, facts), name="spotguard-eviction-sightings", daemon=True
            )
            self._reader.start()

    def _run(self, read: Callable[[str], Any], facts: Callable[[Any], NodeFacts]) -> None:
        while True:
            time.sleep(self.refresh)
            names = self.held()
            if not names:
                with self._lock:
                    if not self._seen:
                        self._reader = None
                        return
                continue
            for name in names:
                read_at = self.clock()
                try:
                    raw = read(name)
                except Exception as exc:  # unknown: keep the sighting (never a shorter grace)
                    log.debug("reading a sighted node failed", extra={"node": name, "error": str(exc)[:200]})
                    continue
                node = facts(raw) if raw is not None else NodeFacts(name, spot=False)  # None: gone
                self.observe(node, read_at=read_at, start=False)
