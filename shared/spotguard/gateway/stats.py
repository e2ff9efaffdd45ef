"""A count of the Kubernetes API requests a :class:`~spotguard.gateway.kube.Kube` made.

Every HTTP attempt counts, retries included: this is the API cost that tests
and benchmarks report (``k.stats.requests``, ``k.stats.writes``,
``k.stats.by_verb``). Verbs are the Kubernetes audit verbs: get, list,
create, update, patch, delete (an eviction is a ``create`` of ``pods/eviction``).

The same requests are also counted in the process-wide Prometheus counter
``spotguard_kube_requests_total{verb, resource, code}``, registered once per
process when this module is imported (many ``Kube`` instances share it).
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import prometheus_client

WRITE_VERBS = frozenset({"create", "update", "patch", "delete"})

REQUESTS_TOTAL = prometheus_client.Counter(
    "spotguard_kube_requests",
    "Kubernetes API requests made by spotguard, retries included",
    ["verb", "resource", "code"],
)
RETRIES_TOTAL = prometheus_client.Counter(
    "spotguard_kube_retries",
    "Kubernetes API requests that spotguard retried",
    ["verb", "resource"],
)


@dataclass(frozen=True)
class Snapshot:
    requests: int
    writes: int
    retries: int
    by_verb: dict[str, int] = field(default_factory=dict)
    by_resource: dict[str, int] = field(default_factory=dict)
    by_code: dict[int, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "writes": self.writes,
            "retries": self.retries,
            "by_verb": dict(self.by_verb),
            "by_resource": dict(self.by_resource),
            "by_code": {str(k): v for k, v in self.by_code.items()},
        }


class Stats:
    """Thread-safe request counters; read them as attributes or take a :meth:`snapshot`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._verbs: Counter[str] = Counter()
        self._resources: Counter[str] = Counter()
        self._codes: Counter[int] = Counter()
        self._pairs: Counter[tuple[str, str]] = Counter()
        self._retries = 0

    def record(self, verb: str, resource: str, code: int) -> None:
        """One HTTP attempt; ``code`` 0 when no answer came (timeout, connection refused)."""
        with self._lock:
            self._verbs[verb] += 1
            self._resources[resource] += 1
            self._codes[code] += 1
            self._pairs[(verb, resource)] += 1
        REQUESTS_TOTAL.labels(verb, resource, str(code)).inc()

    def record_retry(self, verb: str, resource: str) -> None:
        with self._lock:
            self._retries += 1
        RETRIES_TOTAL.labels(verb, resource).inc()

    @property
    def requests(self) -> int:
        with self._lock:
            return sum(self._verbs.values())

    @property
    def writes(self) -> int:
        with self._lock:
            return sum(n for verb, n in self._verbs.items() if verb in WRITE_VERBS)

    @property
    def retries(self) -> int:
        with self._lock:
            return self._retries

    @property
    def by_verb(self) -> dict[str, int]:
        with self._lock:
            return dict(self._verbs)

    @property
    def by_resource(self) -> dict[str, int]:
        with self._lock:
            return dict(self._resources)

    @property
    def by_code(self) -> dict[int, int]:
        with self._lock:
            return dict(self._codes)

    def count(self, verb: str | None = None, resource: str | None = None) -> int:
        """Requests of one verb and/or resource (``count("patch", "pods")``)."""
        with self._lock:
            return sum(
                n
                for (v, r), n in self._pairs.items()
                if (verb is None or v == verb) and (resource is None or r == resource)
            )

    def snapshot(self) -> Snapshot:
        with self._lock:
            return Snapshot(
                requests=sum(self._verbs.values()),
                writes=sum(n for v, n in self._verbs.items() if v in WRITE_VERBS),
                retries=self._retries,
                by_verb=dict(self._verbs),
                by_resource=dict(self._resources),
                by_code=dict(self._codes),
            )

    def reset(self) -> None:
        with self._lock:
            self._verbs.clear()
            self._resources.clear()
            self._codes.clear()
            self._pairs.clear()
            self._retries = 0

    def __repr__(self) -> str:
        snap = self.snapshot()
        return f"Stats(requests={snap.requests}, writes={snap.writes}, by_verb={snap.by_verb})"
