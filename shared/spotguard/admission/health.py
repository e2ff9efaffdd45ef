"""Loud failure instead of silent fail-open: what ``/readyz`` checks, and what it reports.

A webhook that answers "allowed, unchanged" for every pod looks healthy while it
protects nothing. These conditions make the process not ready, with the reason
as ``/readyz``'s body, a warning log line, the gauge
``spotguard_admission_ready{reason}`` and a Warning Event on the state namespace
(once per change):

* the state namespace (``$SPOTGUARD_NAMESPACE``, where the reservation Leases
  and the ConfigMap live) does not exist;
* no node matches the on-demand requirement (no on-demand node under any label
  scheme: every floor pod would stay Pending, so none is pinned);
* no node matches the spot preference (nothing to place spot slots on; often a
  label scheme the configuration does not know).

A pod whose on-demand slot cannot be honoured because no node it can run on is
on-demand is placed on spot instead (never a pod no node can take); that is a
Warning Event on its workload (once per workload and ten minutes), a log line
and ``spotguard_admission_unplaceable_total{placement}``.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from spotguard.admission import metrics
from spotguard.gateway import resources as r
from spotguard.policy.capacity import Capacity
from spotguard.policy.placement import Placement

if TYPE_CHECKING:
    from spotguard.admission.core import Context
    from spotguard.admission.resolve import Resolved

log = logging.getLogger(__name__)

CHECK_SECONDS = 5.0  # how long one readiness verdict is reused
EVENT_INTERVAL = 600.0


class Health:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._lock = threading.Lock()
        self._checked = -1e18
        self._problem: str | None = None
        self._reported: str | None = ""  # the last verdict logged ("" before the first)
        self._events: dict[str, float] = {}

    def problem(self) -> str | None:
        """Why the process should not be ready, or None (checked at most every 5 s)."""
        with self._lock:
            if time.monotonic() - self._checked < CHECK_SECONDS:
                return self._problem
            try:
                found = self._check()
            except Exception as exc:
                found = f"cannot check the cluster: {type(exc).__name__}: {str(exc)[:200]}"
            self._problem, self._checked = found, time.monotonic()
            if found != self._reported:
                self._report(found)
            return found

    def _check(self) -> str | None:
        ctx = self.ctx
        if ctx.kube is None:
            return f"no Kubernetes connection: {ctx.connect_error}"
        metrics.api_call("get", r.NAMESPACES.name)
        if ctx.kube.find(r.NAMESPACES, ctx.namespace) is None:
            return (
                f"the state namespace {ctx.namespace!r} does not exist (SPOTGUARD_NAMESPACE): "
                "reservations cannot be kept; create it"
            )
        config = ctx.config
        capacities = [config.node_capacity(n.labels) for n in ctx.resolver.nodes()]
        on_demand = sum(1 for c in capacities if c is Capacity.ON_DEMAND)
        spot = sum(1 for c in capacities if c is Capacity.SPOT)
        metrics.NODES.labels("on-demand").set(on_demand)
        metrics.NODES.labels("spot").set(spot)
        schemes = ", ".join(s.key for s in config.label_schemes)
        if not capacities:
            return "the cluster has no nodes"
        if not on_demand:
            return (
                f"no node matches the on-demand requirement (none of {len(capacities)} nodes is on-demand "
                f"under the label schemes {schemes}; unknown capacity counts as {config.unknown_capacity})"
            )
        if not spot:
            return f"no node matches the spot preference (none of {len(capacities)} nodes is spot under {schemes})"
        return None

    def _report(self, found: str | None) -> None:
        previous, self._reported = self._reported, found
        metrics.READY.clear()
        metrics.READY.labels(found or "ok").set(1 if found is None else 0)
        if found is None:
            if previous:
                log.info("admission ready again", extra={"was": previous})
            return
        log.warning("admission not ready", extra={"reason": found})
        kube = self.ctx.kube
        if kube is not None and "state namespace" not in found and "Kubernetes connection" not in found:
            involved = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.ctx.namespace}}
            metrics.api_call("create", "events")
            kube.create_event(
                involved, "AdmissionNotReady", found, "Warning", component="spotguard-admission", best_effort=True
            )

    def report_unplaceable(self, resolved: Resolved, wanted: Placement) -> None:
        """A slot of ``wanted`` capacity that no node the pod can run on offers."""
        metrics.UNPLACEABLE.labels(wanted.value).inc()
        w = resolved.workload
        key = f"{w.uid or w.key}/{wanted.value}"
        now = time.monotonic()
        with self._lock:
            last = self._events.get(key)
            if last is not None and now - last < EVENT_INTERVAL:
                return
            if len(self._events) > 10_000:
                self._events.clear()
            self._events[key] = now
        message = (
            f"no node this pod can run on is {wanted.value} under the configured label schemes; "
            f"the pod is placed where it can run and {w.key} is below its {wanted.value} floor"
        )
        log.warning("floor cannot be honoured", extra={"workload": w.key, "wanted": wanted.value})
        kube: Any = self.ctx.kube
        if kube is not None:
            metrics.api_call("create", "events")
            kube.create_event(
                resolved.obj,
                f"No{wanted.value.title().replace('-', '')}Nodes",
                message,
                "Warning",
                component="spotguard-admission",
                best_effort=True,
            )
