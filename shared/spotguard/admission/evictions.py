"""The eviction guard: the validating webhook for ``pods/eviction`` CREATE.

kube-apiserver sends an AdmissionReview for every Eviction (``resource`` pods,
``subResource`` eviction, ``object`` the ``policy/v1`` Eviction, ``name`` the pod)
before it checks the PodDisruptionBudgets. A denial with ``status.code`` 429 is
returned to the caller as 429 TooManyRequests (the message prefixed with
``admission webhook "..." denied the request``; ``details.retryAfterSeconds``
becomes the ``Retry-After`` header): ``kubectl drain``,
aws-node-termination-handler and Karpenter retry it as they retry a budget.

This module reads (the pod, its workload, the workload's pods, a Deployment's surge
copy for the record it carries, the nodes), asks
:func:`spotguard.policy.evictions.decide` and answers. It writes nothing (a
dry-run eviction is answered the same way). It fails open (no cluster connection,
RBAC, a bug: "allowed"), except where the API server is unwell (5xx, 429, timeouts,
the review deadline): then it asks the drainer to retry in a second, for at most
``Timing.error_hold`` seconds per pod (:func:`spotguard.policy.evictions.on_error`).
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from concurrent import futures
from typing import Any, TypeVar

from spotguard.admission import core, deadline, errors, metrics, resolve, reviews, sightings
from spotguard.gateway import errors as gateway_errors
from spotguard.gateway import resources
from spotguard.policy import evictions, floors, interruption, surgecopy
from spotguard.policy.capacity import Capacity
from spotguard.policy.config import Config
from spotguard.policy.notices import NODE_NOTICE, NodeNotice
from spotguard.policy.surges import SurgeRecord
from spotguard.policy.views import Owner, PodView
from spotguard.policy.workloads import ENABLED, Kind, Workload, surge_deployment

log = logging.getLogger(__name__)
T = TypeVar("T")
MAX_REMEMBERED = 10_000  # entries in each of a guard's own maps (selectors, failing pods)
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
        floor_hold=_seconds(env, "SPOTGUARD_EVICTION_FLOOR_HOLD_SECONDS", default.floor_hold),
    )


def _seconds(env: Mapping[str, str], name: str, default: float) -> float:
    return core.seconds_setting(env, name, default, most=600, logger=log)


class Guard:
    """One process's guard. ``clock`` is epoch seconds (the reclaim times in the
    notices are too); ``sightings`` remember, per node, when this process first saw its
    drain signals (the grace is measured from there, with this process's clock only;
    :mod:`spotguard.admission.sightings`). ``refresh``: real seconds between two reads of
    the sighted nodes."""

    def __init__(
        self,
        clock: Callable[[], float] = time.time,
        timing: evictions.Timing | None = None,
        refresh: float = sightings.REFRESH_SECONDS,
    ) -> None:
        self.clock = clock
        self.timing = timing or timing_from_env()
        self.sightings = sightings.Sightings(clock, refresh)
        # pod key -> the first and the last of its reviews' failures in a row
        self._errors: dict[str, tuple[float, float]] = {}
        # a pod's controller (uid) -> its workload's label selector, as a LIST's labelSelector
        # (a Deployment's and a StatefulSet's selector never change): the pods are listed as
        # soon as the pod is read, beside the workload's re-read
        self._selectors: dict[str, str | None] = {}
        self._lock = threading.Lock()
        # (monotonic start, the guard's clock at the start, the LIST)
        self._list: tuple[float, float, futures.Future[Any]] | None = None
        # The guard's own threads: a review's reads run beside each other, and a drainer's
        # parallel evictions must not queue behind one another (or behind placement's). A
        # review's workload reads (``tasks``) wait for reads of their own (``pool``), which
        # never wait for a task: two pools, so a burst cannot fill one with waiters.
        self.pool = futures.ThreadPoolExecutor(max_workers=64, thread_name_prefix="spotguard-evictions")
        self.tasks = futures.ThreadPoolExecutor(max_workers=32, thread_name_prefix="spotguard-eviction-reviews")

    def nodes(self, ctx: core.Context, since: float) -> tuple[float, futures.Future[Any]]:
        """A LIST of every node that started at or after ``since`` (the review's arrival,
        monotonic), and at most SHARE_LIST_SECONDS ago: one per burst. Returned with when it
        started (the guard's clock).

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
                shared[2].done() and shared[2].exception() is not None
            ):
                return shared[1], shared[2]
            started = self.clock()
            listing = deadline.submit(self.pool, kube.list, resources.NODES)
            self._list = (now, started, listing)
            return started, listing

    def first_seen(self, ctx: core.Context, node: evictions.NodeFacts, now: float) -> float:
        """When this process first saw ``node``'s drain signals (``now`` the first time), and
        its sighted nodes are read again until none is left."""
        seen = self.sightings.observe(node, now)
        if seen is None:
            return now
        if ctx.kube is not None:
            config = ctx.config
            # the reader's GETs run outside any review, so without a review's deadline
            self.sightings.watch(functools.partial(ctx.kube.find, resources.NODES), lambda raw: node_facts(raw, config))
        return seen

    def selector(self, owner: str) -> str | bool | None:
        """The selector remembered for the controller ``owner`` (False: none yet)."""
        with self._lock:
            return self._selectors.get(owner, False)

    def remember_selector(self, owner: str, match: str | None) -> None:
        with self._lock:
            if len(self._selectors) >= MAX_REMEMBERED:
                self._selectors.clear()
            self._selectors[owner] = match

    def first_error(self, pod: str, now: float) -> float:
        """When this pod's reviews began failing in a row (``now`` on the first failure;
        :func:`evictions.errors_began`)."""
        with self._lock:
            previous = self._errors.get(pod)
            if previous is not None and now - previous[0] > 600:
                previous = None
            began = evictions.errors_began(previous, now, self.timing)
            if previous is None and len(self._errors) >= MAX_REMEMBERED:
                self._errors.clear()
            self._errors[pod] = (began, now)
            return began

    def succeeded(self, pod: str) -> None:
        with self._lock:
            self._errors.pop(pod, None)


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
    raw = kube.find(resources.PODS, name, namespace)
    if raw is None:
        return evictions.Decision(True, "no-such-pod")
    pod = PodView.from_json(raw, scheduling=False)
    if pod.labels.get(ENABLED) == "false":  # as the pod-create webhook's objectSelector
        return evictions.Decision(True, "not-managed")
    if not pod.active or not pod.ready:
        return evictions.Decision(True, "not-serving")
    if pod.owner is None or pod.owner.kind not in ("ReplicaSet", "StatefulSet") or not pod.node_name:
        return evictions.Decision(True, "not-managed")
    # The pod's node decides first; what a node going away needs is read beside it (the
    # review's deadline has room for about two rounds of reads after the pod's on a slow
    # API server), and not waited for unless the node is going away.
    own_node = deadline.submit(guard.pool, _read_node, kube, pod.node_name, guard.clock)
    listed_at, nodes_raw = guard.nodes(ctx, arrived)
    workload_reads = deadline.submit(guard.tasks, _workload_reads, ctx, guard, pod)
    fresh, node_read_at = _result(own_node, f"GET nodes {pod.node_name}")
    node = None if fresh is None else node_facts(fresh, config)
    now = guard.clock()
    first_seen = now if node is None else guard.first_seen(ctx, node, now)
    early = evictions.at_node(pod=pod, node=node)
    if early is not None:
        return early
    assert node is not None
    try:
        found = _result(workload_reads, "the workload's reads")
        if found is None:
            return evictions.Decision(True, "not-managed")
        workload, floor_on_demand, pods, copy_record = found
        nodes = {n.name: n for n in (node_facts(o, config) for o in _result(nodes_raw, "LIST nodes"))}
    except RETRYABLE:
        known = evictions.without_workload(node=node)
        if known is not None:
            return known
        raise
    guard.sightings.observe_all(nodes.values(), read_at=listed_at)
    nodes[pod.node_name] = node  # its own node as read for this review
    return evictions.decide(
        pod=pod, workload=workload, floor_on_demand=floor_on_demand, pods=pods, nodes=nodes,
        now=guard.clock(), first_seen=first_seen, timing=guard.timing, node_read_at=node_read_at,
        copy_record=copy_record,
    )


def _read_node(kube: Any, name: str, clock: Callable[[], float]) -> tuple[dict[str, Any] | None, float]:
    """The pod's node, and when it was read: the decision may come seconds later (slow
    workload reads), and the node's facts are as of this read only."""
    found = kube.find(resources.NODES, name)
    return found, clock()


def _result(future: futures.Future[T], what: str) -> T:
    """``future``'s result, waited for until the review's deadline at most."""
    try:
        return future.result(timeout=max(0.0, deadline.remaining(30.0)) + 0.05)
    except futures.TimeoutError:
        raise deadline.DeadlineExceeded(f"review deadline reached waiting for {what}") from None


def _workload_reads(
    ctx: core.Context, guard: Guard, pod: PodView
) -> tuple[Workload, int, list[PodView], SurgeRecord | None] | None:
    """The pod's workload as it is now, its floor, its own pods and the surge record its
    surge copy carries (a Deployment's; None: no copy, or one without a record); None where
    spotguard does not manage it.

    A pod of a surge copy (``spotguard.policy.surgecopy``: its controller the ReplicaSet
    ``spotguard-surge-<name>``, its ``spotguard.io/surge-of`` label ``<name>``) is a replica of
    the Deployment ``<name>`` in its namespace (:func:`interruption.copy_workload_key`): the
    copy has no controller of its own, so it is decided as that Deployment's pods are."""
    kube = ctx.kube
    assert kube is not None
    resolver = ctx.resolver
    namespace = pod.namespace
    owner = pod.owner.uid if pod.owner is not None else ""
    surged = None if interruption.copy_workload_key(pod) is None else surge_deployment(pod.labels, pod.annotations)
    # A workload's selector never changes (apps/v1): once known, its pods are listed beside
    # the (re-)read of the workload (the surge record as it is now), not after it.
    listing: futures.Future[Any] | None = None
    known = guard.selector(owner) if owner else False
    if known is not False:
        listing = deadline.submit(guard.pool, kube.list, resources.PODS, namespace, known)
    annotations = deadline.submit(guard.pool, resolver.namespace_annotations, namespace)
    # The Deployment's copy (its record), read from the start under the name its ReplicaSet's
    # name says (``<deployment>-<pod-template-hash>``), again below where that was wrong.
    guess = surged or resolve.deployment_name(pod)
    copy_read = None if guess is None else deadline.submit(guard.pool, _copy_record, resolver, namespace, guess)
    resolved = resolver.resolve(pod) if surged is None else resolver.deployment(namespace, surged)
    if isinstance(resolved, resolve.Unresolved):
        return None
    match = resolve.label_selector(resolved.workload.selector)
    if listing is None or known != match:
        listing = deadline.submit(guard.pool, kube.list, resources.PODS, namespace, match)
    if owner:
        guard.remember_selector(owner, match)
    resolved = resolver.refresh_workload(resolved)
    workload = resolved.workload
    if workload.kind is not Kind.DEPLOYMENT:
        copy_read = None  # a StatefulSet is never surged by a copy
    elif copy_read is None or guess != workload.name:
        copy_read = deadline.submit(guard.pool, _copy_record, resolver, namespace, workload.name)
    floor = floors.floor_for(workload, ctx.config, _result(annotations, "GET namespaces"))
    if not floor.enabled:
        return None
    selector = (resolved.obj.get("spec") or {}).get("selector") or {}
    candidates = [
        p for p in (PodView.from_json(o, scheduling=False) for o in _result(listing, "LIST pods"))
        if interruption.selector_matches(selector, p.labels)
    ]
    own = _own(ctx, guard, resolved, candidates)
    record = None if copy_read is None else _result(copy_read, "GET replicasets (the surge copy)")
    return workload, floor.on_demand, own, record


def _copy_record(resolver: resolve.Resolver, namespace: str, deployment: str) -> SurgeRecord | None:
    """The surge record the copy of the Deployment ``deployment`` carries (None: no copy, a
    ReplicaSet so named that is not its copy, or a copy without a record). Read as it is now
    (not cached): the copy's record changes with each of its writes."""
    rs = resolver.surge_copy(namespace, deployment, fresh=True)
    return None if rs is None else surgecopy.record_of(rs)


def _own(ctx: core.Context, guard: Guard, resolved: resolve.Resolved, pods: list[PodView]) -> list[PodView]:
    """The workload's own pods among ``pods`` (its selector's): a StatefulSet's by their
    controller's uid, a Deployment's by their ReplicaSet's controller uid. Another
    workload whose selector overlaps (``web-canary`` with ``app=web,track=canary`` beside
    ``web`` with ``app=web``) has pods that match but are not this one's replicas."""
    workload = resolved.workload
    if workload.kind is Kind.STATEFULSET:
        return [p for p in pods if p.owner is not None and p.owner.kind == "StatefulSet" and _same(p.owner, workload)]
    # The pods of its surge copy (spotguard.policy.surgecopy) are its replicas too: they carry
    # its labels and serve behind its Services, though no ReplicaSet of its owns them.
    copies = [p for p in pods if interruption.copy_workload_key(p) == workload.key]
    pods = [p for p in pods if interruption.copy_workload_key(p) is None]
    own: dict[tuple[str, str], bool] = {}  # (ReplicaSet name, uid) -> the workload's?
    if resolved.replicaset is not None:
        meta = resolved.replicaset.get("metadata") or {}
        own[(str(meta.get("name") or ""), resolved.replicaset_uid)] = True
    lookups: dict[tuple[str, str], futures.Future[Any]] = {}
    for p in pods:
        o = p.owner
        if o is not None and o.kind == "ReplicaSet" and (o.name, o.uid) not in own and (o.name, o.uid) not in lookups:
            lookups[(o.name, o.uid)] = deadline.submit(guard.pool, ctx.resolver.replicaset_of, p)
    for key, future in lookups.items():
        ref = resolve.controller_ref(_result(future, "GET replicasets"))
        own[key] = ref is not None and ref.get("kind") == "Deployment" and (
            str(ref.get("uid") or "") == workload.uid if workload.uid else ref.get("name") == workload.name
        )
    return [
        p for p in pods
        if p.owner is not None and p.owner.kind == "ReplicaSet" and own.get((p.owner.name, p.owner.uid), False)
    ] + copies


def _same(owner: Owner, workload: Workload) -> bool:
    return owner.uid == workload.uid if owner.uid and workload.uid else owner.name == workload.name


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
