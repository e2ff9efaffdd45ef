"""A controller's client-side rate limit: client-go's token bucket (``flowcontrol``
``NewTokenBucketRateLimiter(qps, burst)``), in simulated time; and its work queue's
retry limiter (``workqueue.DefaultControllerRateLimiter``).

kube-controller-manager builds every controller's client from one rest config
with ``--kube-api-qps`` (20) and ``--kube-api-burst`` (30), and each client has
its own bucket, so each controller is limited on its own: ``ClientOrDie(name)``
makes a new clientset, with a new rate limiter, at every call
(staging/src/k8s.io/controller-manager/pkg/clientbuilder/client_builder.go).
cloud-controller-manager has the same defaults. A bucket counts every request of
its client, reads included; reads from an informer's cache are not requests.
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


# client-go util/workqueue/default_rate_limiters.go DefaultControllerRateLimiter
FAILURE_BASE_DELAY = 0.005  # NewItemExponentialFailureRateLimiter(5*time.Millisecond, ...)
FAILURE_MAX_DELAY = 1000.0  # ... 1000*time.Second)
RETRY_QPS = 10.0  # BucketRateLimiter{rate.NewLimiter(rate.Limit(10), 100)}: overall, not per item
RETRY_BURST = 100


class FailureRateLimiter:
    """A work queue's ``DefaultControllerRateLimiter``, in simulated time: a failed item waits
    the longer of its own exponential back-off (5 ms, doubling with each failure since it was
    last forgotten, at most 1000 s) and the queue's overall bucket of 10 retries a second after a
    burst of 100 (``MaxOfRateLimiter``). ``forget`` (a sync that succeeded) resets the item."""

    def __init__(self, clock: Any, *, base: float = FAILURE_BASE_DELAY, cap: float = FAILURE_MAX_DELAY,
                 qps: float = RETRY_QPS, burst: int = RETRY_BURST) -> None:
        self.base = base
        self.cap = cap
        self.bucket = TokenBucket(clock, qps, burst) if qps > 0 else None
        self._failures: dict[Any, int] = {}
        self._lock = threading.Lock()

    def when(self, item: Any) -> float:
        """The simulated seconds ``item`` waits before it is tried again (AddRateLimited)."""
        with self._lock:
            exp = self._failures.get(item, 0)
            self._failures[item] = exp + 1
        backoff = self.base * 2.0 ** min(exp, 64)
        own = self.cap if backoff > self.cap else backoff
        overall = self.bucket.reserve() if self.bucket is not None else 0.0
        return max(own, overall)

    def num_requeues(self, item: Any) -> int:
        with self._lock:
            return self._failures.get(item, 0)

    def forget(self, item: Any) -> None:
        if not self._failures:
            return
        with self._lock:
            self._failures.pop(item, None)


class FixedIntervalRateLimiter:
    """``FixedItemIntervalRateLimiter`` (pkg/controller/podautoscaler/rate_limiters.go): every
    item waits ``interval``, failed or not (the HPA controller's ``NewDefaultHPARateLimiter``)."""

    def __init__(self, interval: float) -> None:
        self.interval = interval

    def when(self, item: Any) -> float:
        return self.interval

    def num_requeues(self, item: Any) -> int:
        return 0

    def forget(self, item: Any) -> None:
        pass
