"""Prometheus metrics of the interruption handler (module level: one registry per process).

The transports count deliveries in :mod:`spotguard.interruption.telemetry`; these
count what the handler did with the notices.
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram

NOTICES = Counter(
    "spotguard_interruption_notices_total",
    "Notices handled, by kind (interruption, rebalance, state-change) and outcome (done, ignored, retry).",
    ["kind", "outcome"],
)
SURGES = Counter(
    "spotguard_interruption_surges_total",
    "Workload surges written (one per workload and plan), and surge replicas added.",
    ["unit"],
)
SCALE_BACKS = Counter(
    "spotguard_interruption_scale_backs_total",
    "Surges that ended: the workload scaled back, the autoscaler restored, the temporary budget deleted.",
)
TAINTS = Counter("spotguard_interruption_taints_total", "Nodes tainted spotguard.io/interruption.")
ERRORS = Counter(
    "spotguard_interruption_errors_total",
    "Kubernetes or EC2 API calls that failed, by step (list, taint, surge, budget, hpa, finish, ec2).",
    ["step"],
)
NOTICE_TO_SURGE = Histogram(
    "spotguard_interruption_notice_to_surge_seconds",
    "Time from the notice (its EventBridge time) to the surge written on the workload.",
    buckets=(0.25, 0.5, 1, 2, 5, 10, 20, 30, 45, 60, 90, 120, 300),
)
