"""How often admission repeats one Warning Event: once per key (a workload and what is said
about it) every :data:`EVENT_INTERVAL` seconds, in-process."""

from __future__ import annotations

import threading
import time
from collections.abc import Hashable

EVENT_INTERVAL = 600.0  # seconds between two identical Events about one workload
KEYS = 10_000  # keys remembered at most (then forgotten at once: a few repeats, never a leak)


class Throttle:
    def __init__(self, interval: float = EVENT_INTERVAL) -> None:
        self.interval = interval
        self._sent: dict[Hashable, float] = {}
        self._lock = threading.Lock()

    def due(self, key: Hashable) -> bool:
        """True for the first time ``key`` comes, and again once the interval has passed
        (the caller sends the Event then)."""
        now = time.monotonic()
        with self._lock:
            last = self._sent.get(key)
            if last is not None and now - last < self.interval:
                return False
            if len(self._sent) > KEYS:
                self._sent.clear()
            self._sent[key] = now
            return True
