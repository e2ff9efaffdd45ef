"""Prometheus metrics of the admission function (process-wide, registered once).

* ``spotguard_admission_requests_total{outcome, placement}``: answered reviews;
  ``outcome`` is ``patched``, ``unchanged`` (already placed), ``skipped`` (not
  ours), ``failed_open`` (internal error: allowed without a patch) or
  ``malformed`` (a 4xx answer); ``placement`` is ``on-demand``, ``spot`` or ``none``.
* ``spotguard_admission_errors_total{kind}``: internal errors by exception class.
* ``spotguard_admission_duration_seconds``: time to answer one review.
* ``spotguard_admission_reservation_conflicts_total``: Lease updates lost to another
  instance (each is re-read and recomputed).
* ``spotguard_admission_stale_workloads_total``: workloads read again because the
  pod being admitted showed the cached copy was older than it (a surge or a scale).
* ``spotguard_admission_nodes{capacity}``: nodes counting as on-demand / spot.
* ``spotguard_admission_evictions_total{verdict, reason}``: ``pods/eviction`` reviews
  answered by the eviction guard (``allowed`` or ``denied``, and why).
* ``spotguard_admission_ready``: 1 when this process is ready, else 0 (why: ``/readyz``, the log).
* ``spotguard_admission_cluster_condition{condition}``: 1 while a condition of the cluster
  holds that the webhook reports and stays ready through (:mod:`spotguard.admission.health`):
  ``namespace_missing``, ``no_nodes``, ``no_on_demand_nodes``, ``no_spot_nodes``,
  ``cluster_unreadable``.
* ``spotguard_admission_unplaceable_total{placement}``: slots no reachable node offers.
* ``spotguard_admission_dropped_connections_total{reason}``: client connections dropped
  because the client stalled past the client limit (:mod:`spotguard.admission.connections`):
  ``idle`` (sent nothing), ``handshake`` (TLS handshake unfinished), ``request`` (request
  head or body unfinished), ``response`` (the answer not taken).

Kubernetes API requests are the gateway's ``spotguard_kube_requests_total{verb,
resource, code}`` (every attempt, retries included), for every function alike.

With several gunicorn workers each worker has its own registry; ``--metrics-port``
serves them summed (prometheus_client's multiprocess mode). The gauges say how
they combine, so that no series carries a ``pid`` label: ready and a condition
are the highest of the live workers (a worker that has not checked yet says 0),
node counts the most recent.
"""

from __future__ import annotations

import prometheus_client

REQUESTS = prometheus_client.Counter(
    "spotguard_admission_requests",
    "AdmissionReview requests answered, by outcome and placement",
    ["outcome", "placement"],
)
ERRORS = prometheus_client.Counter(
    "spotguard_admission_errors",
    "Internal errors while admitting a pod (the pod was allowed without a patch)",
    ["kind"],
)
DURATION = prometheus_client.Histogram(
    "spotguard_admission_duration_seconds",
    "Time to answer one AdmissionReview",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)
SHED = prometheus_client.Counter(
    "spotguard_admission_shed",
    "Reviews answered allowed and unchanged without deciding: they waited past their deadline before being served",
)
DEGRADED = prometheus_client.Counter(
    "spotguard_admission_degraded",
    "Pods placed from what the review already knew because the API server did not answer in time: "
    "'unreserved' (an on-demand slot whose Lease write there was no time for), 'unconfirmed' (the write "
    "did not come back in time), 'uncounted' (no time for the count: decided on the last one), "
    "'stale_read' (a workload or namespace as last read), 'by_name' (a Deployment known by its "
    "ReplicaSet's name), 'late' (taken up past its deadline), "
    "'by_ordinal' (a StatefulSet pod placed by its ordinal, its set's pods "
    "not listed in time). Such a slot can put a workload a replica over its floor until node-added's next pass",
    ["how"],
)
CONFLICTS = prometheus_client.Counter(
    "spotguard_admission_reservation_conflicts",
    "Reservation Lease writes that lost to another instance and were recomputed",
)

EVICTIONS = prometheus_client.Counter(
    "spotguard_admission_evictions",
    "pods/eviction reviews answered by the eviction guard, by verdict and reason",
    ["verdict", "reason"],
)

STALE = prometheus_client.Counter(
    "spotguard_admission_stale_workloads",
    "Workloads read again because the pod showed the cached copy was older than it",
)

NODES = prometheus_client.Gauge(
    "spotguard_admission_nodes",
    "Nodes by the capacity they count as (at the last readiness check)",
    ["capacity"],
    multiprocess_mode="livemostrecent",
)
READY = prometheus_client.Gauge(
    "spotguard_admission_ready",
    "1 when this process is ready (its own health: a connection, the cluster reached); else 0",
    multiprocess_mode="livemax",
)
CONDITIONS = ("namespace_missing", "no_nodes", "no_on_demand_nodes", "no_spot_nodes", "cluster_unreadable")
CONDITION = prometheus_client.Gauge(
    "spotguard_admission_cluster_condition",
    "1 while a condition of the cluster holds that the webhook reports and stays ready through",
    ["condition"],
    multiprocess_mode="livemax",
)
UNPLACEABLE = prometheus_client.Counter(
    "spotguard_admission_unplaceable",
    "Slots that no node the pod can run on offers (the pod went where it can run)",
    ["placement"],
)

DROPPED_CONNECTIONS = prometheus_client.Counter(
    "spotguard_admission_dropped_connections",
    "Client connections dropped because the client stalled past the client limit, by where it stalled",
    ["reason"],
)
for _reason in ("idle", "handshake", "request", "response"):
    DROPPED_CONNECTIONS.labels(_reason)  # every reason shown, at 0 until it happens


def render() -> tuple[bytes, str]:
    """The exposition text and its content type."""
    return prometheus_client.generate_latest(), prometheus_client.CONTENT_TYPE_LATEST
