"""Loud failure instead of silent fail-open: what ``/readyz`` checks, and what it reports.

A webhook that answers "allowed, unchanged" for every pod looks healthy while it
protects nothing; but an unready webhook is out of service (failurePolicy
Ignore: every pod goes in unplaced), so readiness is for the process's own
health only, never for a condition of the whole cluster, which every replica
sees at once. Not ready (``/readyz`` 503 with the reason,
``spotguard_admission_ready`` 0, a warning log line):

* no Kubernetes connection could be configured (``core.Context.readiness``);
* the cluster was never reached by this process (its first checks all failed).

Reported (a log line, a Warning Event ``AdmissionDegraded`` on the state
namespace, once per change; ``spotguard_admission_cluster_condition{condition}``
1; ``/readyz``'s body, 200) but the webhook stays ready, because taking it out
of service helps no pod:

* ``namespace_missing``: the state namespace (``$SPOTGUARD_NAMESPACE``, where
  the reservation Leases and the ConfigMap live) does not exist;
* ``no_nodes``: the cluster has no nodes;
* ``no_on_demand_nodes``: no node matches the on-demand requirement and nothing can
  launch one (no Karpenter NodePool allows on-demand, and
  ``SPOTGUARD_ON_DEMAND_LAUNCHABLE`` is not ``true``; see ``launches``): floor pods
  then go where they can run, see below. Where an on-demand node can be launched this
  is no condition at all: floor pods keep their requirement and wait for the node
  (an info log line says so once);
* ``no_spot_nodes``: no node matches the spot preference (Event ``NoSpotNodes``;
  during a mass reclaim every spot node is gone for a while, exactly when floors
  matter most; spot slots only *prefer* spot, so they still run);
* ``cluster_unreadable``: the cluster could not be read for the check (a slow
  or failing API server): the other conditions stand as last seen.

A pod whose on-demand slot cannot be honoured because no node it can run on is
on-demand, and no on-demand node can be launched for it, is placed on spot instead
(never a pod no node can take); that is a
Warning Event on its workload (once per workload and ten minutes), a log line
and ``spotguard_admission_unplaceable_total{placement}``.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING, Any

from spotguard.admission import launches, metrics, throttle
from spotguard.gateway import resources as r
from spotguard.policy.capacity import Capacity
from spotguard.policy.placement import Placement

if TYPE_CHECKING:
    from spotguard.admission.core import Context
    from spotguard.admission.resolve import Resolved

log = logging.getLogger(__name__)

CHECK_SECONDS = 5.0  # how long one readiness verdict is reused
CONDITIONS = metrics.CONDITIONS


class Health:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self._lock = threading.Lock()
        self._checked = -1e18
        self._reached = False
        self._problem: str | None = None
        self._conditions: dict[str, str] = {}  # condition -> what it is, in words
        self._events = throttle.Throttle()
        self._launch: str | None = None  # what launches on-demand capacity while no node is on-demand
        metrics.READY.set(0)
        for condition in CONDITIONS:
            metrics.CONDITION.labels(condition).set(0)

    def problem(self) -> str | None:
        """Why this process should not be ready, or None (checked at most every 5 s)."""
        with self._lock:
            if time.monotonic() - self._checked < CHECK_SECONDS:
                return self._problem
            self._checked = time.monotonic()
            previous = dict(self._conditions)
            try:
                found = self._check()
            except Exception as exc:
                why = f"cannot check the cluster: {type(exc).__name__}: {str(exc)[:200]}"
                log.warning("admission readiness check failed", extra={"reason": why})
                found = {k: v for k, v in previous.items() if k != "cluster_unreadable"}
                found["cluster_unreadable"] = why
                problem = None if self._reached else f"the cluster was never reached: {why}"
            else:
                self._reached = True
                problem = None
            self._conditions = found
            self._verdict(problem)
            self._report(previous, found)
            return problem

    def warning(self) -> str | None:
        """What is wrong in the cluster without making the webhook unready (``/readyz``'s body)."""
        with self._lock:
            return "; ".join(self._conditions.values()) or None

    def _check(self) -> dict[str, str]:
        ctx = self.ctx
        assert ctx.kube is not None  # Context.readiness answers first without a connection
        found: dict[str, str] = {}
        if ctx.kube.find(r.NAMESPACES, ctx.namespace) is None:
            found["namespace_missing"] = (
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
            found["no_nodes"] = "the cluster has no nodes"
            return found
        launch = None if on_demand else ctx.launches.cluster_wide(config)
        self._launchable(launch)
        if not on_demand and launch is None:
            found["no_on_demand_nodes"] = (
                f"no node matches the on-demand requirement (none of {len(capacities)} nodes is on-demand "
                f"under the label schemes {schemes}; unknown capacity counts as {config.unknown_capacity}) "
                "and nothing can launch one (no Karpenter NodePool allows on-demand; "
                f"{launches.SETTING}={config.on_demand_launchable.value})"
            )
        if not spot:
            found["no_spot_nodes"] = (
                f"no node matches the spot preference (none of {len(capacities)} nodes is spot under {schemes})"
            )
        return found

    def _launchable(self, launch: str | None) -> None:
        """Say (once per change) that on-demand floors wait for a launch rather than go to spot."""
        if launch == self._launch:
            return
        self._launch = launch
        if launch is not None:
            log.info("no on-demand node: on-demand floors wait for one to be launched", extra={"by": launch})

    def _verdict(self, problem: str | None) -> None:
        previous, self._problem = self._problem, problem
        metrics.READY.set(1 if problem is None else 0)
        if problem == previous:
            return
        if problem is None:
            log.info("admission ready", extra={"was": previous} if previous else {})
        else:
            log.warning("admission not ready", extra={"reason": problem})

    def _report(self, previous: dict[str, str], found: dict[str, str]) -> None:
        """Log, count and tell (a Warning Event) each condition of the cluster that appeared or went."""
        for condition in CONDITIONS:
            metrics.CONDITION.labels(condition).set(1 if condition in found else 0)
        for condition in sorted(set(previous) - set(found)):
            log.info("cluster condition cleared", extra={"condition": condition})
        kube: Any = self.ctx.kube
        for condition in sorted(set(found) - set(previous)):
            message = found[condition]
            if condition == "no_spot_nodes":
                log.warning(
                    "no spot node: spot slots run on on-demand until spot capacity returns", extra={"reason": message}
                )
            else:
                log.warning(
                    "admission degraded: it stays ready (an unready webhook would let every pod in unplaced)",
                    extra={"condition": condition, "reason": message},
                )
            if kube is None or condition in ("namespace_missing", "cluster_unreadable"):
                continue  # nowhere to write it, or no cluster to write it to
            involved = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.ctx.namespace}}
            reason = "NoSpotNodes" if condition == "no_spot_nodes" else "AdmissionDegraded"
            kube.create_event(involved, reason, message, "Warning", component="spotguard-admission", best_effort=True)

    def report_unplaceable(self, resolved: Resolved, wanted: Placement) -> None:
        """A slot of ``wanted`` capacity that no node the pod can run on offers."""
        metrics.UNPLACEABLE.labels(wanted.value).inc()
        w = resolved.workload
        if not self._events.due(f"{w.uid or w.key}/{wanted.value}"):
            return
        message = (
            f"no node this pod can run on is {wanted.value} under the configured label schemes, "
            f"and none can be launched for it; "
            f"the pod is placed where it can run and {w.key} is below its {wanted.value} floor"
        )
        log.warning("floor cannot be honoured", extra={"workload": w.key, "wanted": wanted.value})
        kube: Any = self.ctx.kube
        if kube is not None:
            kube.create_event(
                resolved.obj,
                f"No{wanted.value.title().replace('-', '')}Nodes",
                message,
                "Warning",
                component="spotguard-admission",
                best_effort=True,
            )
