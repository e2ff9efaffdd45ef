"""Fault injection for the simulated API server's HTTP layer.

``faults.set(verb="patch", resource="deployments", error_rate=0.2, status=500)``
makes a fifth of the PATCHes to Deployments fail with a 500 Status;
``latency_seconds`` delays matching requests; ``status="timeout"`` (or
``timeout=True``) holds a request for ``hold_seconds`` and then drops the
connection without an answer, beyond a client's timeout. In-process controllers
talk to the store directly and are never faulted.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from spotguard_sim import errors

VERBS = ("*", "get", "list", "watch", "create", "update", "patch", "delete")


class DropConnection(Exception):
    """Close the connection without an answer (a timeout as the client sees it)."""


@dataclass(frozen=True)
class Rule:
    verb: str
    resource: str
    error_rate: float
    status: int | str
    latency_seconds: float
    hold_seconds: float
    subresource: str | None = None
    # run before a matching request is served: e.g. ``store.compact`` (an etcd compaction
    # between two pages of a list, as an operator's ``etcdctl compact`` can land)
    before: Callable[[], None] | None = None

    def applies(self, verb: str, resource: str) -> bool:
        return self.verb in ("*", verb) and self.resource in ("*", resource)


_REASONS = {
    400: errors.BadRequest,
    404: errors.NotFound,
    409: errors.Conflict,
    410: errors.Gone,
    422: errors.Invalid,
    429: errors.TooManyRequests,
    500: errors.InternalError,
    503: errors.ServiceUnavailable,
    504: errors.Timeout,
}


class Faults:
    def __init__(self, seed: int | None = None) -> None:
        self._rules: list[Rule] = []
        self._lock = threading.Lock()
        self._random = random.Random(seed)
        self.injected = 0

    def set(
        self,
        verb: str = "*",
        resource: str = "*",
        error_rate: float = 0.0,
        status: int | str = 500,
        latency_seconds: float = 0.0,
        *,
        timeout: bool = False,
        hold_seconds: float = 30.0,
        before: Callable[[], None] | None = None,
    ) -> Rule:
        """Add a fault rule (rules add up: the first one that fires wins)."""
        if verb not in VERBS:
            raise ValueError(f"verb must be one of {', '.join(VERBS)}, got {verb!r}")
        if not 0.0 <= error_rate <= 1.0:
            raise ValueError(f"error_rate must be between 0 and 1, got {error_rate}")
        if timeout:
            status = "timeout"
        if status != "timeout" and status not in _REASONS:
            raise ValueError(f"status must be one of {sorted(_REASONS)} or 'timeout', got {status!r}")
        rule = Rule(verb, resource, error_rate, status, max(0.0, latency_seconds), hold_seconds,
                    before=before)
        with self._lock:
            self._rules.append(rule)
        return rule

    def clear(self) -> None:
        with self._lock:
            self._rules.clear()

    def check(self, verb: str, resource: str) -> None:
        """Delay and/or raise for a request; called by the HTTP layer before serving it."""
        with self._lock:
            rules = [r for r in self._rules if r.applies(verb, resource)]
            rolls = [self._random.random() for _ in rules]
        delay = max((r.latency_seconds for r in rules), default=0.0)
        if delay:
            time.sleep(delay)
        for rule in rules:
            if rule.before is not None:
                rule.before()
        for rule, roll in zip(rules, rolls, strict=True):
            if rule.error_rate and roll < rule.error_rate:
                self.injected += 1
                if rule.status == "timeout":
                    time.sleep(rule.hold_seconds)
                    raise DropConnection()
                cls = _REASONS[int(rule.status)]
                # API Priority and Fairness throttling (429) suggests a retry in 1 s
                extra = {"retryAfterSeconds": 1} if int(rule.status) == 429 else {}
                raise cls(f"injected fault: {verb} {resource} answered {rule.status}", **extra)
