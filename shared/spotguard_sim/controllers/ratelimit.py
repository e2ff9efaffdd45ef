"""A controller's client-side rate limit: client-go's token bucket (``flowcontrol``
``NewTokenBucketRateLimiter(qps, burst)``), in simulated time.

kube-controller-manager builds every controller's client from one rest config
with ``--kube-api-qps`` (20) and ``--kube-api-burst`` (30), and each client has
its own bucket, so each controller is limited on its own.
"""

from __future__ import annotations

import threading
import time
from typing import Any


class Stopped(Exception):
    """The controller stopped while a request waited for its turn."""


class TokenBucket:
    def __init__(self, clock: Any, qps: float, burst: int) -> None:
        self.clock = clock
        self.qps = float(qps)
        self.burst = max(1, int(burst))
        self._tokens = float(self.burst)
        self._last = clock.now()
        self._lock = threading.Lock()

    def reserve(self) -> float:
        """Take a token; the simulated seconds to wait before using it."""
        if self.qps <= 0:
            return 0.0
        with self._lock:
            now = self.clock.now()
            self._tokens = min(float(self.burst), self._tokens + (now - self._last) * self.qps)
            self._last = now
            self._tokens -= 1.0
            if self._tokens >= 0:
                return 0.0
            return -self._tokens / self.qps

    def wait(self, stopped: threading.Event | None = None) -> None:
        """Block until a request may go (client-go's Accept)."""
        delay = self.reserve()
        if delay <= 0:
            return
        real = self.clock.real(delay)
        if stopped is not None:
            if stopped.wait(real):
                raise Stopped("the controller stopped")
        else:
            time.sleep(real)
