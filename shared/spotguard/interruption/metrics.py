"""Prometheus metrics of the interruption handler (module level: one registry per process).

The transports count deliveries in :mod:`spotguard.interruption.telemetry`; these
count what the handler did with the notices.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

NOTICES = Counter(
    "spotguard_interruption_notices_total",
    "Notices handled, by kind (interruption, rebalance, state-change, lifecycle, scheduled-change; drain: a node "
    "autoscaler's drain the reconcile found) and outcome (done, ignored, retry; planned: a drain's).",
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
    "Kubernetes or EC2 API calls that failed, by step (list, taint, surge, budget, hpa, finish, ec2, ec2-denied).",
    ["step"],
)
NOTICE_TO_SURGE = Histogram(
    "spotguard_interruption_notice_to_surge_seconds",
    "Time from the notice (its EventBridge time) to the surge written on the workload.",
    buckets=(0.25, 0.5, 1, 2, 5, 10, 20, 30, 45, 60, 90, 120, 300),
)
EVICTIONS = Counter(
    "spotguard_interruption_evictions_total",
    "Doomed pods evicted by spotguard itself (drain: true) once their replacements were Ready.",
)
HURRIED = Counter(
    "spotguard_interruption_upkeeps_deferred_total",
    "Handlings and reconciles that left their upkeep (scale backs, untaints, the ledger) to the next pass "
    "because notices were waiting: a steady rise means the API server is slow or the notices come faster "
    "than they are handled.",
)
# What an operator alerts on (set by every handling and reconcile).
SURGING = Gauge("spotguard_interruption_workloads_surging", "Workloads with a surge in progress.")
OVERDUE = Gauge(
    "spotguard_interruption_surges_overdue",
    "Surges in progress whose every doomed node is past its deadline (the reclaim time): they should be ending.",
)
BELOW_FLOOR = Gauge(
    "spotguard_interruption_workloads_below_floor",
    "Workloads with fewer Ready pods on on-demand nodes than their on-demand floor.",
)
