"""The eviction guard: the validating webhook for ``pods/eviction`` CREATE.

kube-apiserver sends an AdmissionReview for every Eviction (``resource`` pods,
``subResource`` eviction, ``object`` the ``policy/v1`` Eviction, ``name`` the pod)
before it checks the PodDisruptionBudgets. A denial with ``status.code`` 429 is
returned to the caller as 429 TooManyRequests (the message prefixed with
``admission webhook "..." denied the request``; ``details.retryAfterSeconds``
becomes the ``Retry-After`` header): ``kubectl drain``,
aws-node-termination-handler and Karpenter retry it as they retry a budget.

This module reads (the pod, its workload, the workload's pods, the nodes), asks
:func:`spotguard.policy.evictions.decide` and answers. It writes nothing (a
dry-run eviction is answered the same way). It fails open (no cluster connection,
RBAC, a bug: "allowed"), except where the API server is unwell (5xx, 429, timeouts,
the review deadline): then it asks the drainer to retry in a second, for at most
``Timing.error_hold`` seconds per pod (:func:`spotguard.policy.evictions.on_error`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from concurrent import futures
from typing import Any

from spotguard.admission import core, deadline, errors, metrics, resolve, reviews
from spotguard.gateway import errors as gateway_errors
from spotguard.gateway import resources
from spotguard.policy import evictions, floors, interruption
from spotguard.policy.capacity import Capacity
from spotguard.policy.config import Config
from spotguard.policy.notices import NODE_NOTICE, NodeNotice
from spotguard.policy.views import PodView

log = logging.getLogger(__name__)
FIRST_SEEN_MAX = 10_000
# A drainer evicts a node's pods in parallel: their reviews share one node LIST when it
# started at most this long before them (the pod's own node is always read fresh).
SHARE_LIST_SECONDS = 0.25


def is_eviction(review: Any) -> bool:
    """Whether ``review`` is an AdmissionReview of a ``pods/eviction`` request."""
    request = review.get("request") if isinstance(review, dict) else None
    if not isinstance(request, dict):
        return False
    resource = request.get("resource")
    return (
        isinstance(resource, dict)
        and resource.get("resource") == "pods"
        and not resource.get("group")
        and request.get("subResource") == "eviction"
    )


def timing_from_env(env: Mapping[str, str] | None = None) -> evictions.Timing:
    env = os.environ if env is None else env
    default = evictions.Timing()
    return evictions.Timing(
        grace=_seconds(env, "SPOTGUARD_EVICTION_GRACE_SECONDS", default.grace),
        release=_seconds(env, "SPOTGUARD_EVICTION_RELEASE_SECONDS", default.release),
        rebalance_hold=_seconds(env, "SPOTGUARD_EVICTION_REBALANCE_HOLD_SECONDS", default.rebalance_hold),
        error_hold=_seconds(env, "SPOTGUARD_EVICTION_ERROR_HOLD_SECONDS", default.error_hold),
    )


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    return core.seconds_setting(env, name, default, most=600, logger=log)


class Guard:
    """One process's guard. ``clock`` is epoch seconds (the reclaim times in the
    notices are too); ``first_seen`` remembers, per node, when this process first saw
    it going away without spotguard's notice (the grace is measured from there, with
    this process's clock only)."""

    def __init__(self, clock: Callable[[], float] = time.time, timing: evictions.Timing | None = None) -> None:
        self.clock = clock
        self.timing = timing or timing_from_env()
        self._first_seen: dict[str, float] = {}
        self._first_error: dict[str, float] = {}  # pod key -> when its failures in a row began
        self._lock = threading.Lock()
        self._list: tuple[float, futures.Future[Any]] | None = None  # (monotonic start, the LIST)

    def nodes(self, ctx: core.Context, since: float) -> futures.Future[Any]:
        """A LIST of every node that started at or after ``since`` (the review's arrival,
        monotonic), and at most SHARE_LIST_SECONDS ago: one per burst.

        Never an older one: a drainer cordons node X and evicts its pod A, then cordons Y and
        evicts B, a pod of the same workload. A list from before both cordons shows each
        review the other node as staying, so each counts the other's pod as serving and
        both evictions are allowed: the workload loses two. A list that started after the
        review arrived (so after its own node's cordon) cannot do that: for both reviews to
        count the other's pod, each list would have to start before the other's cordon,
        and so before the other review arrived (tests/admission/test_evictions.py)."""
        kube = ctx.kube
        assert kube is not None
        with self._lock:
            now = time.monotonic()
            shared = self._list
            if shared is not None and since <= shared[0] and now - shared[0] <= SHARE_LIST_SECONDS and not (
                shared[1].done() and shared[1].exception() is not None
            ):
                return shared[1]
            listing = deadline.submit(ctx.pool, kube.list, resources.NODES)
            self._list = (now, listing)
            return listing

    def first_seen(self, node: str, now: float) -> float:
        with self._lock:
            seen = self._first_seen.get(node)
            if seen is None or now - seen > 600:  # an old sighting is a new drain
                if len(self._first_seen) >= FIRST_SEEN_MAX:
                    self._first_seen.clear()
                seen = self._first_seen[node] = now
            return seen


    def first_error(self, pod: str, now: float) -> float:
        """When this pod's reviews began failing in a row (``now`` on the first failure)."""
        with self._lock:
            began = self._first_error.get(pod)
            if began is None or now - began > 600:
                if len(self._first_error) >= FIRST_SEEN_MAX:
                    self._first_error.clear()
                began = self._first_error[pod] = now
            return began

    def succeeded(self, pod: str) -> None:
        with self._lock:
            self._first_error.pop(pod, None)


# A review that failed on one of these may succeed a second later: the guard asks the
# drainer to come back rather than give it the pod unchecked (policy.evictions.on_error).
RETRYABLE: tuple[type[BaseException], ...] = (*gateway_errors.RETRY_LATER, deadline.DeadlineExceeded, TimeoutError)


_guards: weakref.WeakKeyDictionary[core.Context, Guard] = weakref.WeakKeyDictionary()
_guards_lock = threading.Lock()


def guard_for(ctx: core.Context) -> Guard:
    with _guards_lock:
        guard = _guards.get(ctx)
        if guard is None:
            guard = _guards[ctx] = Guard()
        return guard


def configure(ctx: core.Context, guard: Guard) -> None:
    """Use ``guard`` (another clock or timing, e.g. a simulated cluster's) for ``ctx``."""
    with _guards_lock:
        _guards[ctx] = guard


def serve(review: Any, ctx: core.Context) -> reviews.ResponseReview:
    """Answer one ``pods/eviction`` AdmissionReview (raises :class:`errors.WebhookError`
    when it is not an AdmissionReview at all)."""
    started = time.perf_counter()
    arrived = time.monotonic()
    request = core.parse(review)
    uid = request["uid"]
    pod_key = f"{request.get('namespace')}/{request.get('name')}"
    guard = guard_for(ctx)
    try:
        with deadline.running(deadline.Deadline.after(ctx.review_seconds)):
            decision = _decide(request, ctx, arrived)
        guard.succeeded(pod_key)
    except Exception as exc:
        kind = type(exc).__name__
        metrics.ERRORS.labels(kind).inc()
        if isinstance(exc, RETRYABLE):
            now = guard.clock()
            decision = evictions.on_error(
                error=f"{kind}: {exc}"[:200], first_error=guard.first_error(pod_key, now), now=now, timing=guard.timing
            )
        else:
            decision = evictions.Decision(True, f"failed-open: {kind}")
        outcome = "allowing the eviction" if decision.allowed else "asking for a retry"
        log.warning(
            f"eviction guard could not decide; {outcome}",
            extra={"uid": uid, "error": str(exc), "kind": kind, "pod": pod_key},
        )
    metrics.EVICTIONS.labels("allowed" if decision.allowed else "denied", decision.reason.split(":")[0]).inc()
    metrics.DURATION.observe(time.perf_counter() - started)
    log.info(
        "eviction reviewed",
        extra={"uid": uid, "namespace": request.get("namespace"), "pod": request.get("name"),
               "allowed": decision.allowed, "reason": decision.reason},
    )
    return build_response(uid, decision)


def build_response(uid: str, decision: evictions.Decision) -> reviews.ResponseReview:
    audit = {"spotguard.io/eviction": decision.reason[:256]}
    if decision.allowed:
        answer = core.build_response(uid=uid, audit=audit)
        return answer
    response: reviews.Response = {
        "uid": uid,
        "allowed": False,
        "status": {
            "code": 429,
            "reason": "TooManyRequests",
            "message": decision.message,
            "details": {"retryAfterSeconds": decision.retry_after},
        },
        "auditAnnotations": audit,
    }
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


def _decide(request: reviews.Request, ctx: core.Context, arrived: float) -> evictions.Decision:
    if request.get("operation") != "CREATE" or not is_eviction({"request": request}):
        return evictions.Decision(True, "not-an-eviction")
    kube = ctx.kube
    if kube is None:
        return evictions.Decision(True, "no-cluster-connection")
    namespace = str(request.get("namespace") or "")
    name = str(request.get("name") or "")
    if not namespace or not name:
        raise errors.MissingObject("a pods/eviction review without namespace or name")
    config = ctx.config
    if namespace in config.excluded_namespaces:
        return evictions.Decision(True, "not-managed")
    guard = guard_for(ctx)
    nodes_raw = guard.nodes(ctx, arrived)
    raw = kube.find(resources.PODS, name, namespace)
    if raw is None:
        return evictions.Decision(True, "no-such-pod")
    pod = PodView.from_json(raw, scheduling=False)
    # its own node fresh: a drainer cordons it milliseconds before the first eviction
    own_node = deadline.submit(ctx.pool, kube.find, resources.NODES, pod.node_name) if pod.node_name else None
    resolved = ctx.resolver.resolve(pod)
    if isinstance(resolved, resolve.Unresolved):
        return evictions.Decision(True, "not-managed")
    resolved = ctx.resolver.refresh_workload(resolved)  # the surge record as it is now
    workload = resolved.workload
    floor = floors.floor_for(workload, config, ctx.resolver.namespace_annotations(namespace))
    if not floor.enabled:
        return evictions.Decision(True, "not-managed")
    selector = (resolved.obj.get("spec") or {}).get("selector") or {}
    match = ",".join(f"{k}={v}" for k, v in sorted(workload.selector.items())) or None
    pods = [
        p for p in (PodView.from_json(o, scheduling=False) for o in kube.list(resources.PODS, namespace, match))
        if interruption.selector_matches(selector, p.labels) and _same_controller_kind(p, workload.kind.value)
    ]
    nodes = {n.name: n for n in (node_facts(o, config) for o in nodes_raw.result())}
    if own_node is not None:
        fresh = own_node.result()
        if fresh is None:
            nodes.pop(pod.node_name, None)
        else:
            nodes[pod.node_name] = node_facts(fresh, config)
    now = guard.clock()
    node = nodes.get(pod.node_name)
    first_seen = now
    if node is not None and node.going_away and node.notice is None:
        first_seen = guard.first_seen(node.name, now)
    return evictions.decide(
        pod=pod, workload=workload, floor_on_demand=floor.on_demand, pods=pods, nodes=nodes,
        now=now, first_seen=first_seen, timing=guard.timing,
    )


def _same_controller_kind(pod: PodView, kind: str) -> bool:
    owner = pod.owner
    if owner is None:
        return False
    return owner.kind == ("StatefulSet" if kind == "StatefulSet" else "ReplicaSet")


def node_facts(raw: Mapping[str, Any], config: Config) -> evictions.NodeFacts:
    meta = raw.get("metadata") or {}
    spec = raw.get("spec") or {}
    return evictions.NodeFacts(
        name=str(meta.get("name") or ""),
        spot=config.node_capacity(meta.get("labels") or {}) is Capacity.SPOT,
        unschedulable=bool(spec.get("unschedulable")),
        taint_keys=frozenset(str(t.get("key") or "") for t in spec.get("taints") or [] if isinstance(t, dict)),
        notice=NodeNotice.parse((meta.get("annotations") or {}).get(NODE_NOTICE)),
    )
