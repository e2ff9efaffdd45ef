"""Prometheus metrics of the node-added reconcile (module level: one registry per process)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

PASSES = Counter(
    "spotguard_nodeadded_passes_total",
    "Reconcile passes, by trigger (node-added, ping, state-change, schedule, cli) and result (done, failed).",
    ["trigger", "result"],
)
PASS_SECONDS = Histogram(
    "spotguard_nodeadded_pass_seconds",
    "Time one reconcile pass took.",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60),
)
MOVES = Counter(
    "spotguard_nodeadded_moves_total",
    "Moves by direction (to-spot, to-on-demand), method (scale, evict) and step "
    "(started, finished, aborted, blocked (a budget or webhook refused the eviction), throttled (the API "
    "server answered 429 without refusing: tried again next pass), not-begun (the count changed between "
    "the plan and its scale-up: the next pass ends the record), held, ended, failed).",
    ["direction", "method", "step"],
)
SKIPPED = Gauge(
    "spotguard_nodeadded_skipped_workloads",
    "Workloads off their optimum that the last pass left alone, by reason.",
    ["reason"],
)
OFF_OPTIMUM = Gauge(
    "spotguard_nodeadded_workloads_off_optimum",
    "Workloads off their optimum at the last pass: above their floor on on-demand (surplus) or below it (deficit).",
    ["kind"],
)
CLEANUPS = Counter(
    "spotguard_nodeadded_cleanups_total",
    "Leftovers removed: reservation Leases of ReplicaSets that no longer exist (lease); pods left Pending on the "
    "spot requirement of a move that spotguard no longer asks for, evicted (pending-spot-pod).",
    ["what"],
)
AUTOSCALER = Counter(
    "spotguard_nodeadded_autoscaler_writes_total",
    "Autoscaler minReplicas raised for a scale move (raised) and put back after it (restored).",
    ["what"],
)
ERRORS = Counter(
    "spotguard_nodeadded_errors_total",
    "Kubernetes API calls that failed, by step (list, move, finish, autoscaler, lease, stranded, label, taint, "
    "interruption, headroom).",
    ["step"],
)
HEADROOM = Gauge(
    "spotguard_nodeadded_headroom_placeholders",
    "On-demand headroom placeholder pods at the last pass: wanted (the policy's count, capped), uncapped (before "
    "headroom-max-pods) and kept (the Deployment's replicas as written, or as read where no write was needed or "
    "it failed); unplaced: placeholders the scheduler has found no room for in over 600 s (no node launched "
    "for them).",
    ["state"],
)
HEADROOM_HELD = Gauge(
    "spotguard_nodeadded_headroom_held",
    "On-demand room the wanted placeholders request in all, by resource (cpu in cores, memory in bytes).",
    ["resource"],
)
HEADROOM_WRITES = Counter(
    "spotguard_nodeadded_headroom_writes_total",
    "Writes of the headroom Deployment by step (created, resized, deleted) and result (done, failed).",
    ["step", "result"],
)
