"""When and how long the gateway retries a failed Kubernetes API request.

What is retried, and why:

* **Reads** (get, list) are retried on every transient failure: any 5xx, a 429,
  a timeout and any connection error. Reading twice changes nothing.
* **Writes** (create, update, patch, delete, evict) are retried only where the
  server certainly did not act on the first attempt:

  - 429 Too Many Requests: API Priority and Fairness rejects a request before
    it is processed (honouring ``Retry-After``);
  - 503 Service Unavailable: the apiserver (or its load balancer) refused it;
  - a connection error before the request was sent (connection refused, DNS,
    connect timeout).

  A 500/502/504, a read timeout or a connection dropped after sending may hide
  a write that did happen: a retried create could make a second object (with
  ``generateName``), a retried update of a Lease counter could count twice.
  Those errors go to the caller as :class:`~spotguard.gateway.errors.Transient`,
  who knows whether its write is idempotent.
* **Conflict** (409) is never retried here: the caller must re-read the object
  and recompute its change. Nor are 4xx answers other than 429 (they will not
  change by themselves).
* An **eviction** answered 429 is a PodDisruptionBudget saying "not now"; the
  gateway does not wait for it (``retry_429=False``), the caller (a drainer,
  node-added) decides when to come back.

Delays grow exponentially (``base_delay * 2**n``, capped at ``max_delay``) with
jitter (each delay is drawn between half and all of that), and a
``Retry-After`` from the server is honoured. ``attempts`` bounds the number of
tries, and ``deadline`` the total time (requests and sleeps), so an admission
webhook with a three-second budget can ask for ``Policy(attempts=3,
deadline=2.0, timeout=1.0)``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from spotguard.gateway import errors


@dataclass(frozen=True)
class Policy:
    attempts: int = 5  # tries in all, the first included; 1 means no retry
    deadline: float = 30.0  # seconds for all tries and the sleeps between them
    timeout: float = 10.0  # seconds for one request
    connect_timeout: float = 3.0
    base_delay: float = 0.1
    max_delay: float = 5.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("attempts must be at least 1")
        if self.deadline <= 0 or self.timeout <= 0 or self.connect_timeout <= 0:
            raise ValueError("deadline and timeouts must be positive")

    def delay(self, retry_number: int, retry_after: float | None = None, rng: random.Random | None = None) -> float:
        """Seconds to sleep before retry ``retry_number`` (1 for the first retry)."""
        ceiling = min(self.max_delay, self.base_delay * float(2 ** (retry_number - 1)))
        draw = (rng or _JITTER).random()
        jittered = ceiling * (0.5 + 0.5 * draw)
        if retry_after is not None:
            return max(retry_after, jittered)
        return jittered


# Jitter from a generator of our own: the global one is the application's (and its tests') to seed.
_JITTER = random.Random()
DEFAULT = Policy()
NONE = Policy(attempts=1)


def retryable(error: errors.ApiError, *, write: bool, retry_429: bool = True) -> bool:
    """Whether a failed attempt may be tried again (see the module docstring)."""
    if isinstance(error, errors.TooManyRequests):
        return retry_429
    if not isinstance(error, errors.Transient):
        return False
    if not write:
        return True
    if error.status == 503:
        return True
    return error.status == 0 and not request_sent(error)


def request_sent(error: errors.ApiError) -> bool:
    """False only when the request certainly never reached the server."""
    return bool(getattr(error, "request_sent", True))
