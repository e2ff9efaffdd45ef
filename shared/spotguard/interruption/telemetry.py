"""Prometheus metrics of the spot-interruption transports (served at ``GET /metrics``).

Names carry the ``spotguard_interruption_`` prefix; the handler's own metrics
(surges written, time from notice to surge) live beside its code.
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram

NOTICES = Counter(
    "spotguard_interruption_notices_received_total",
    "EC2 notices received, by kind (interruption, rebalance, state-change, unknown) and result "
    "(done, ignored, retry, malformed, foreign).",
    ["kind", "result"],
)
ERRORS = Counter(
    "spotguard_interruption_delivery_errors_total",
    "Deliveries that were not handled: malformed or foreign payloads, handler and reconcile failures.",
    ["transport", "error"],
)
HANDLE_SECONDS = Histogram(
    "spotguard_interruption_handle_seconds",
    "Time the handler took for one delivery (one plan for all of its notices).",
    ["transport"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120),
)
NOTICE_AGE = Histogram(
    "spotguard_interruption_notice_age_seconds",
    "Time from the notice (its EventBridge time) to the end of its handling, for handled notices.",
    ["kind"],
    buckets=(0.5, 1, 2, 5, 10, 20, 30, 45, 60, 90, 120, 180, 300),
)
RECONCILES = Counter("spotguard_interruption_reconciles_total", "Scheduled reconciles that completed.")
RECONCILE_SECONDS = Histogram(
    "spotguard_interruption_reconcile_seconds",
    "Time one reconcile took.",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60),
)
