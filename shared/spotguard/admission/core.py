"""The admission core: an AdmissionReview dict in, an AdmissionReview response dict out.

``serve(review, ctx)`` decodes the review (a malformed one raises
:class:`~spotguard.admission.errors.WebhookError`), decides the pod's slot with
the policy package, and builds the answer with the pure :func:`build_response`.
It never denies: anything that is not ours, and any internal failure (an
unreachable API, a bug), is answered ``allowed`` without a patch, logged and
counted. The HTTP adapters (Flask, Knative/ASGI, Lambda) only move bytes.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import math
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent import futures
from dataclasses import dataclass
from typing import Any, TypeVar

from spotguard.admission import deadline, errors, health, launches, metrics, reviews, throttle
from spotguard.admission import resolve as resolve_mod
from spotguard.admission.reservations import LIST_RESERVE, POD_ANNOTATION, UNANSWERED, Decide, Reservations
from spotguard.admission.resolve import Resolved, Resolver, Unresolved
from spotguard.gateway import kube as kube_mod
from spotguard.gateway import resources, retry
from spotguard.policy import fit, floors, moves, patches, placement, ranks, surgecopy, surges
from spotguard.policy.capacity import Capacity
from spotguard.policy.config import Config
from spotguard.policy.placement import Placement
from spotguard.policy.validation import Problem
from spotguard.policy.views import NodeView, PodView
from spotguard.policy.workloads import PLACEMENT_LABEL, Kind, Workload

log = logging.getLogger(__name__)
T = TypeVar("T")

DEFAULT_NAMESPACE = "spotguard"
# Admission runs under a three-second webhook timeout: short API deadlines, few retries.
API_POLICY = retry.Policy(attempts=2, deadline=1.5, timeout=1.0, connect_timeout=0.5, base_delay=0.05)
# With no spot node in the cached list, the list is read again when older than this (seconds):
# spot nodes joining after a reclaim are seen at once, not after the node cache's minute.
NO_SPOT_NODES_MAX_AGE = 1.0
# One review's deadline: the time the shipped webhook's call has (3 s) but what the answer
# needs to travel back (deadline.CALLER_SHARE), counted from the request's arrival.
DEFAULT_REVIEW_SECONDS = deadline.CALLER_SHARE * deadline.CALLER_TIMEOUT
API_POLICY_REVIEW = 2.0  # the review length API_POLICY was made for


def api_policy(review_seconds: float) -> retry.Policy:
    """:data:`API_POLICY` (made for a 2 s review) scaled to the review deadline: a slower
    control plane's longer deadline lets each call take proportionally longer too. Inside a
    review every call is bounded by the review's remaining time instead
    (:class:`deadline.DeadlineKube`); this policy serves the calls made outside one."""
    scale = max(review_seconds, 0.1) / API_POLICY_REVIEW
    return dataclasses.replace(
        API_POLICY,
        deadline=API_POLICY.deadline * scale,
        timeout=API_POLICY.timeout * scale,
        connect_timeout=API_POLICY.connect_timeout * scale,
    )

SHED_BELOW = 0.05  # seconds: a review with less left than this when a thread takes it is answered at once
# seconds of the caller's timeout a review taken up past its deadline needs left to be
# answered from what the process knows (``_late``) rather than shed
LATE_ANSWER_MIN = 0.1


@dataclass(frozen=True)
class Outcome:
    outcome: str  # patched | unchanged | skipped | failed_open
    reason: str
    placement: Placement | None = None
    patch: Sequence[Mapping[str, Any]] = ()
    warnings: Sequence[str] = ()
    # placed from what the review knew when the API server did not answer in time (see
    # metrics.DEGRADED): "" for a decision on a full read
    degraded: tuple[str, ...] = ()  # how it was placed without API answers (spotguard_admission_degraded_total)


class EventReporter:
    """Warning Events for invalid annotations, deduplicated in-process."""

    def __init__(self, kube: Any | None, interval: float = throttle.EVENT_INTERVAL) -> None:
        self.kube = kube
        self.throttle = throttle.Throttle(interval)

    def report(self, resolved: Resolved, problems: Sequence[Problem]) -> None:
        if not problems:
            return
        message = "; ".join(str(p) for p in problems)
        w = resolved.workload
        if not self.throttle.due((w.uid or w.key, message)):
            return
        log.warning("invalid spotguard annotation", extra={"workload": w.key, "problems": message})
        if self.kube is not None:
            self.kube.create_event(
                resolved.obj,
                "InvalidAnnotation",
                f"{message} (the default applies)",
                "Warning",
                component="spotguard-admission",
                best_effort=True,
            )


class Context:
    """What one process needs to admit pods: configuration, API access, caches.

    ``config`` is either a fixed :class:`Config` or a callable returning the current
    one (the gateway's cached settings loader: environment plus ConfigMap).
    ``review_seconds`` is the deadline of one review (well inside the webhook's
    3 s timeout); ``pending_grace`` how long a reservation may wait for its pod.
    """

    def __init__(
        self,
        config: Config | Callable[[], Config],
        kube: Any | None,
        namespace: str = DEFAULT_NAMESPACE,
        *,
        trust_seconds: float = 3.0,
        connect_error: str = "",
        pending_grace: float = 1.0,
        review_seconds: float = DEFAULT_REVIEW_SECONDS,
        workload_ttl: float = resolve_mod.WORKLOAD_TTL_SECONDS,
    ) -> None:
        self._config = config
        self.namespace = namespace
        self.connect_error = connect_error
        self.review_seconds = review_seconds
        self.pool = futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="spotguard-admission")
        self.kube = None if kube is None else deadline.DeadlineKube(kube, api_policy(review_seconds))
        self.events = EventReporter(self.kube)
        self.health = health.Health(self)
        if self.kube is not None:
            self.resolver = Resolver(self.kube, workload_ttl=workload_ttl)
            self.launches = launches.Launches(self.kube)
            self.reservations = Reservations(
                self.kube,
                self.resolver,
                namespace,
                trust_seconds=trust_seconds,
                pending_grace=pending_grace,
                review_seconds=review_seconds,
                # its own threads: a Lease read must never queue behind prefetches and warm-ups
                pool=futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="spotguard-lease"),
            )

    @property
    def config(self) -> Config:
        return self._config() if callable(self._config) else self._config

    @property
    def ready(self) -> bool:
        return self.readiness() is None

    def readiness(self) -> str | None:
        """None when ready; otherwise why not (for ``/readyz``)."""
        if self.kube is None:
            return f"no Kubernetes connection: {self.connect_error}"
        return self.health.problem()

    def readiness_warning(self) -> str | None:
        """What is wrong without making the webhook unready (shown in ``/readyz``'s body)."""
        return self.health.warning() if self.kube is not None else None

    def warm_up(self) -> None:
        """Read the configuration, the nodes and the state namespace ahead of the first review."""
        if self.kube is None:
            return
        for fn in (lambda: self.config, self.health.problem):
            self.pool.submit(_quietly, fn)


def _quietly(fn: Callable[[], Any]) -> None:
    try:
        fn()
    except Exception as exc:  # a warm-up only: the review that needs it will report it
        log.debug("warm-up failed", extra={"error": str(exc)})


def seconds_setting(
    env: Mapping[str, str], name: str, default: float, most: float = math.inf, logger: logging.Logger = log
) -> float:
    """The setting ``name`` in seconds (:func:`spotguard.gateway.settings.seconds`)."""
    from spotguard.gateway import settings

    return settings.seconds(env, name, default, most, logger)


def context_from_env(
    env: Mapping[str, str] | None = None,
    kubeconfig: str | None = None,
    connect: Callable[[str | None], kube_mod.Kube] | None = None,
) -> Context:
    """A Context for this process. A cluster that cannot be reached leaves it not ready
    (every pod is then allowed without a patch) instead of failing to start."""
    from spotguard.gateway import settings
    from spotguard.policy import config as config_mod

    env = dict(os.environ if env is None else env)
    namespace = env.get("SPOTGUARD_NAMESPACE") or DEFAULT_NAMESPACE
    trust = seconds_setting(env, "SPOTGUARD_ADMISSION_TRUST_SECONDS", 3.0)
    grace = seconds_setting(env, "SPOTGUARD_ADMISSION_PENDING_GRACE_SECONDS", 1.0)
    review = (
        seconds_setting(env, "SPOTGUARD_ADMISSION_DEADLINE_SECONDS", DEFAULT_REVIEW_SECONDS) or DEFAULT_REVIEW_SECONDS
    )
    if grace + LIST_RESERVE >= review:
        log.warning(
            "SPOTGUARD_ADMISSION_PENDING_GRACE_SECONDS leaves no time inside the review deadline; shortened",
            extra={"grace": grace, "deadline": review},
        )
        grace = max(0.0, review / 2)
    try:
        k = (connect or kube_mod.connect)(kubeconfig or env.get("SPOTGUARD_KUBECONFIG") or None)
        k = k.with_policy(api_policy(review))
    except Exception as exc:
        log.error("no Kubernetes connection; admitting pods unchanged", extra={"error": str(exc)})
        config, problems = config_mod.from_env(env)
        for p in problems:
            log.warning("invalid setting; using the default", extra={"problem": str(p)})
        return Context(config, None, namespace, trust_seconds=trust, connect_error=str(exc), review_seconds=review)
    loader = settings.Loader(k, env)
    ctx = Context(
        lambda: loader.get()[0],
        k,
        namespace,
        trust_seconds=trust,
        pending_grace=grace,
        review_seconds=review,
        workload_ttl=settings.workload_cache_seconds(env),
    )
    ctx.warm_up()
    return ctx


# -- decoding ----------------------------------------------------------------------------


def parse(review: Any) -> reviews.Request:
    """The review's request, or a :class:`errors.WebhookError` saying what is wrong."""
    if not isinstance(review, dict):
        raise errors.WrongType("the body must be a JSON object (an AdmissionReview)")
    if review.get("apiVersion") != reviews.API_VERSION or review.get("kind") != reviews.KIND:
        raise errors.WrongType(
            f"expected apiVersion {reviews.API_VERSION} kind {reviews.KIND}, got "
            f"{str(review.get('apiVersion'))[:80]!r} {str(review.get('kind'))[:80]!r}"
        )
    request = review.get("request")
    if not isinstance(request, dict):
        raise errors.MissingRequest("the AdmissionReview has no request")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise errors.MissingRequest("request.uid must be a non-empty string")
    return request  # type: ignore[return-value]


def _is_pod_create(request: Mapping[str, Any]) -> str | None:
    """Why the request is not a pod CREATE (None when it is)."""
    resource = request.get("resource")
    if not isinstance(resource, dict) or resource.get("resource") != "pods" or resource.get("group"):
        return "not a pod"
    if request.get("subResource"):
        return f"pods/{request.get('subResource')}"
    if request.get("operation") != "CREATE":
        return f"operation {request.get('operation')}"
    return None


# -- the response ------------------------------------------------------------------------


def build_response(
    *,
    uid: str,
    patch: Sequence[Mapping[str, Any]] = (),
    warnings: Sequence[str] = (),
    audit: Mapping[str, str] | None = None,
) -> reviews.ResponseReview:
    """The AdmissionReview answer: always allowed; a base64 JSONPatch when there is one."""
    response: reviews.Response = {"uid": uid, "allowed": True}
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(list(patch), separators=(",", ":")).encode()).decode()
    if warnings:
        response["warnings"] = [w[:256] for w in warnings]
    if audit:
        response["auditAnnotations"] = dict(audit)
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


def placement_patch(
    pod: Mapping[str, Any],
    where: Placement,
    config: Config,
    token: str | None,
    surge: bool = False,
    *,
    spot_key: str | None = None,
    cost: int | None = None,
    require_spot: bool = False,
    node_keys: Iterable[str] | None = None,
    keep: bool = False,
    move: str = "",
) -> list[dict[str, Any]]:
    """The policy's patch, plus the reservation token annotation for a recorded slot."""
    options: dict[str, Any] = {
        "cost": cost,
        "require_spot": require_spot,
        "node_keys": node_keys,
        "keep": keep,
        "move": move,
    }
    if token is None:
        return patches.build(pod, where, config, surge, spot_key, **options)
    meta = dict(pod.get("metadata") or {})
    annotations = meta.get("annotations")
    if isinstance(annotations, dict):
        first: list[dict[str, Any]] = [
            {"op": "add", "path": patches.pointer("metadata", "annotations", POD_ANNOTATION), "value": token}
        ]
        annotations = {**annotations, POD_ANNOTATION: token}
    else:
        first = [{"op": "add", "path": "/metadata/annotations", "value": {POD_ANNOTATION: token}}]
        annotations = {POD_ANNOTATION: token}
    with_token = {**pod, "metadata": {**meta, "annotations": annotations}}
    return first + patches.build(with_token, where, config, surge, spot_key, **options)


# -- the decision ------------------------------------------------------------------------


def admit(request: reviews.Request, ctx: Context) -> Outcome:
    """Decide for one request; never raises (an internal error fails open).

    The whole decision runs under one deadline (``ctx.review_seconds`` of work, and at most
    85 % of the caller's timeout from the request's arrival, see :func:`deadline.for_review`):
    past it the answer is "allowed, unchanged" and nothing more is written. A review that
    waited (behind a burst) until almost no time is left is shed: answered at once,
    unchanged, counted and logged, rather than answered after the API server gave up on it.
    """
    d = deadline.for_review(ctx.review_seconds)
    begun = time.monotonic()
    if d.remaining() < SHED_BELOW and _is_pod_create(request) is None:
        late = _late(request, ctx, d)
        if late is not None:
            return late
        metrics.SHED.inc()
        log.warning(
            "review shed: it waited past its deadline before it was served; allowing the pod unchanged",
            extra={"uid": request.get("uid"), "late_by": round(-d.remaining(), 3)},
        )
        return Outcome("shed", "waited past its deadline before it was served")
    try:
        with deadline.running(d), deadline.noting() as notes:
            outcome = _admit(request, ctx)
            if outcome.outcome == "patched" and d.remaining() <= 0:
                # Decided past the deadline: sent while the caller still waits (a reservation
                # written for it holds only if the pod carries it; withholding the answer
                # would not unwrite it), else it is thrown away whatever is sent.
                if not _caller_waits():
                    raise deadline.DeadlineExceeded("review deadline passed while deciding")
                notes.append("late")
            return _degraded(request, outcome, notes)
    except errors.WebhookError:
        raise
    except Exception as exc:
        kind = type(exc).__name__
        metrics.ERRORS.labels(kind).inc()
        arrival = deadline.arrival()
        log.error(
            "admission failed; allowing the pod unchanged",
            extra={
                "uid": request.get("uid"),
                "error": str(exc),
                "kind": kind,
                # where the review's time went: waiting for a thread (or a stalled process)
                # before deciding, and deciding (its API calls)
                "waited": round(begun - arrival.at, 3) if arrival is not None else None,
                "seconds": round(time.monotonic() - begun, 3),
            },
            exc_info=not isinstance(exc, (kube_mod.ApiError, deadline.DeadlineExceeded)),
        )
        return Outcome("failed_open", f"internal error: {kind}")


def _degraded(request: reviews.Request, outcome: Outcome, notes: Sequence[str]) -> Outcome:
    """``outcome`` marked with what it was decided on in place of API answers (``notes``),
    counted and logged when it is a degraded placement."""
    if notes and outcome.outcome == "patched":
        outcome = dataclasses.replace(outcome, degraded=tuple(dict.fromkeys((*outcome.degraded, *notes))))
    if outcome.degraded:
        for how in outcome.degraded:
            metrics.DEGRADED.labels(how).inc()
        log.warning(
            "the API server did not answer in time; pod placed from what the review knew",
            extra={
                "uid": request.get("uid"),
                "how": ",".join(outcome.degraded),
                "placement": outcome.placement.value if outcome.placement else None,
                "reason": outcome.reason,
            },
        )
    return outcome


def _caller_waits() -> bool:
    """Whether the caller of the request being served still waits ``LATE_ANSWER_MIN`` for it
    (its timeout counted from the request's arrival; False when the arrival is unknown)."""
    arrival = deadline.arrival()
    if arrival is None:
        return False
    timeout = arrival.timeout if arrival.timeout is not None else deadline.CALLER_TIMEOUT
    return arrival.at + timeout - time.monotonic() >= LATE_ANSWER_MIN


def _late(request: reviews.Request, ctx: Context, d: deadline.Deadline) -> Outcome | None:
    """A review that waited for a thread past its deadline, answered from what this process
    knows while its caller still waits (at least ``LATE_ANSWER_MIN`` of the caller's timeout
    left): no API call is made (each would start past the deadline), so nothing is written
    and an answer the caller no longer takes leaves nothing behind. None: shed it."""
    if not _caller_waits():
        return None
    try:
        with deadline.running(d), deadline.noting() as notes:
            outcome = _admit(request, ctx)
    except Exception:  # a decision that needed the API server: shed as before
        return None
    if outcome.outcome in ("skipped", "unchanged"):
        return outcome
    if outcome.outcome != "patched":
        return None
    return _degraded(request, outcome, [*notes, "late"])


def _admit(request: reviews.Request, ctx: Context) -> Outcome:
    not_ours = _is_pod_create(request)
    if not_ours:
        return Outcome("skipped", not_ours)
    pod = request.get("object")
    if not isinstance(pod, dict):
        raise errors.MissingObject("a pod CREATE without request.object")
    config = ctx.config
    meta = pod.get("metadata") if isinstance(pod.get("metadata"), dict) else {}
    namespace = str(request.get("namespace") or (meta or {}).get("namespace") or "")
    view = PodView.from_json({**pod, "metadata": {**(meta or {}), "namespace": namespace}})
    skip = placement.skip_reason(view, config)
    if skip:
        return Outcome("skipped", skip)
    existing = view.placement_label
    if existing in (Placement.ON_DEMAND.value, Placement.SPOT.value):
        where = Placement(existing)
        ops = patches.build(pod, where, config, placement.is_surge_replica(view))
        if not ops or ctx.kube is None or not _label_from_template(view, ctx):
            return Outcome("patched" if ops else "unchanged", "already placed (reinvocation)", where, ops)
        # The label came with the pod template, not from this webhook: decided afresh.
        view = dataclasses.replace(view, labels={k: v for k, v in view.labels.items() if k != PLACEMENT_LABEL})
    if ctx.kube is None:
        raise RuntimeError(f"no Kubernetes connection: {ctx.connect_error}")
    # First round trip: the namespace, the nodes and the pod's owner at the same time
    # (warm caches need no thread hand-off at all).
    ns_future = _soon(ctx, ctx.resolver.has_namespace(namespace), ctx.resolver.namespace_annotations, namespace)
    nodes_future = _soon(ctx, ctx.resolver.has_nodes(), ctx.resolver.nodes)
    owner_rs = ctx.resolver.cached_replicaset(view)
    if owner_rs is None:
        # A ReplicaSet not cached (its first pods): its Deployment (named after it), the
        # Lease and the pod count are read while the ReplicaSet is, not after it.
        ctx.resolver.prefetch_deployment(view, ctx.pool)
        owner_rs = ctx.resolver.replicaset_hint(view)
    warm: futures.Future[None] | None = None
    if owner_rs is not None and ctx.reservations.needs_count(owner_rs):
        # The Lease and the pod count while the workload is read.
        warm = deadline.submit(ctx.pool, ctx.reservations.warm, owner_rs, config)
    resolved = ctx.resolver.resolve(view)
    ns_annotations = ns_future.result()
    if isinstance(resolved, Unresolved):
        return Outcome("skipped", resolved.reason)
    if resolved.workload.replicas < 1:
        # Cached while it was scaled to zero; a pod being created means it has grown.
        resolved = ctx.resolver.refresh_workload(resolved)
    elif _beyond_ordinals(resolved, view):
        # The StatefulSet was scaled since it was cached: read it again.
        metrics.STALE.inc()
        resolved = ctx.resolver.refresh_workload(resolved)
    workload = resolved.workload
    floor = floors.floor_for(workload, config, ns_annotations, replicas=max(workload.replicas, 1))
    ctx.events.report(resolved, floor.problems)
    if not floor.enabled:
        return Outcome("skipped", f"{workload.key} opted out")
    pinned = view.node_name and placement.pinned_slot(view, ctx.resolver.node_capacity(config, [view.node_name]))
    if pinned:
        if pinned.placement is None:
            return Outcome("skipped", pinned.reason)
        return Outcome("patched", pinned.reason, pinned.placement, patches.build(pod, pinned.placement, config))
    forced = _forced(view, nodes_future.result(), config, resolved, ctx)
    if forced is not None and forced.placement is not None:
        key = _spot_key(nodes_future.result(), config) if forced.placement is Placement.SPOT else None
        return Outcome(
            "patched", forced.reason, forced.placement, patches.build(pod, forced.placement, config, spot_key=key)
        )

    decide = _deciding(view, workload, floor)
    latest = [workload]  # the workload as last read (a refresh reads it again)

    def refresh() -> tuple[int, Decide]:
        """The Deployment read again (bypassing the cache) and the decision on its floor."""
        metrics.STALE.inc()
        again = ctx.resolver.refresh_workload(resolved)
        if not again.fresh:  # the read was not answered in time (the copy last read came back)
            raise deadline.DeadlineExceeded(f"{resolved.workload.key} not read again in time")
        w = again.workload
        latest[0] = w
        f = floors.floor_for(w, config, ns_annotations, replicas=max(w.replicas, 1))
        ctx.events.report(again, f.problems)
        log.info(
            "workload changed since it was cached; deciding on the new floor",
            extra={"uid": request.get("uid"), "workload": w.key, "replicas": w.replicas, "floor": f.on_demand},
        )
        return w.replicas, _deciding(view, w, f)

    def grow(replicas: int) -> Decide:
        """The decision on the workload as last read, grown to ``replicas`` (the pods known
        prove at least that many, and its read again was not answered in time)."""
        w = dataclasses.replace(latest[0], replicas=replicas)
        return _deciding(view, w, floors.floor_for(w, config, ns_annotations, replicas=max(replicas, 1)))

    token: str | None = None
    cost: int | None = None
    degraded: tuple[str, ...] = ()
    if workload.kind is Kind.STATEFULSET:
        # Its controller removes the highest ordinals first, whatever their cost.
        decision, latest[0], degraded = _statefulset_decision(view, resolved, config, ns_annotations, ctx)
    elif floor.on_demand == 0:
        decision = decide(0, (), 0)  # nothing to reserve
    else:
        if warm is not None:
            try:
                warm.result()
            except UNANSWERED:  # the count is tried again (or the pod decided on what is known)
                log.info("counting ahead was not answered in time", extra={"uid": request.get("uid")})
        numbering = ranks.ranks_for(floors.base_spec(workload, config, ns_annotations), config.on_demand_deletion_cost)
        claim = ctx.reservations.claim(
            resolved=resolved,
            floor=floor.on_demand,
            token=str(request["uid"]),
            config=config,
            decide=decide,
            dry_run=bool(request.get("dryRun")),
            replicas=workload.replicas,
            refresh=None if resolved.fresh else refresh,
            grow=grow,
            ranks=numbering,
        )
        decision, token, degraded = claim.decision, claim.token, claim.degraded
        if numbering is not None and claim.number is not None:
            cost = numbering.cost(claim.number)
    if decision.placement is None:
        return Outcome("skipped", decision.reason)
    spot_key = _spot_key(nodes_future.result(), config) if decision.placement is Placement.SPOT else None
    # A replica created for a move back to spot requires spot: the provisioner launches a spot
    # node for it where none has room (spotguard.policy.moves.launching_move); not one the owner
    # added above the move's count. It is marked with the move, so that node-added takes it if it
    # is still Pending once the move is over (spotguard.policy.moves.stranded).
    move = moves.launching_move(latest[0]) if decision.placement is Placement.SPOT else None
    if move is not None and latest[0].kind is Kind.DEPLOYMENT and config.surge_copy:
        # A copy's surge keeps its record on the copy (the Deployment carries none): a surge in
        # progress makes the replicas created now replacements, never the move's.
        move = moves.launching_move(surgecopy.with_record(latest[0], _copy_record(ctx, latest[0])))
    require_spot = move is not None
    keys = {k for n in nodes_future.result() for k in n.labels} if require_spot else None
    # A StatefulSet whose every replica is its floor: no drain may take its pods (floors.every_pod_is_floor).
    # Only an on-demand StatefulSet pod can be one: a Deployment's review computes no second floor.
    final = latest[0]
    keep = (
        final.kind is Kind.STATEFULSET
        and decision.placement is Placement.ON_DEMAND
        and floors.every_pod_is_floor(
            final, floors.floor_for(final, config, ns_annotations, replicas=max(final.replicas, 1))
        )
    )
    ops = placement_patch(
        pod,
        decision.placement,
        config,
        token,
        decision.surge,
        spot_key=spot_key,
        cost=cost,
        require_spot=require_spot,
        node_keys=keys,
        keep=keep,
        move=moves.move_id(move) if move is not None else "",
    )
    return Outcome("patched", decision.reason, decision.placement, ops, degraded=degraded)


def _deciding(pod: PodView, workload: Workload, floor: floors.Floor) -> Decide:
    """A Deployment pod's decision given what its Lease and count hold (see ``Decide``)."""

    def decide(held: int, surge_created: tuple[float, ...] = (), reserved_surge: int = 0) -> placement.Decision:
        return placement.decide(
            pod=pod,
            workload=workload,
            floor=floor,
            reserved_on_demand=held,
            surge_created=surge_created,
            reserved_surge=reserved_surge,
        )

    return decide


def _spot_key(nodes: Sequence[NodeView], config: Config) -> str | None:
    """The cluster's spot-only label key (``patches.spot_only_key``), from the cached node list."""
    return patches.spot_only_key((n.labels for n in nodes), config)


def _label_from_template(pod: PodView, ctx: Context) -> bool:
    """Whether the pod's ``spotguard.io/placement`` label is its template's (the webhook owns
    that label: one a template carries says nothing about where this pod was placed)."""
    owner = pod.owner
    if owner is None:
        return False
    if owner.kind == "ReplicaSet":
        obj = ctx.resolver.replicaset_of(pod)
    else:
        resolved = ctx.resolver.resolve(pod)
        obj = resolved.obj if isinstance(resolved, Resolved) else None
    template = (((obj or {}).get("spec") or {}).get("template") or {}).get("metadata") or {}
    return PLACEMENT_LABEL in (template.get("labels") or {})


def _soon(ctx: Context, cached: bool, fn: Callable[..., T], *args: Any) -> futures.Future[T]:
    """``fn(*args)`` now when its answer is cached, else in the pool (alongside other lookups)."""
    if not cached:
        return deadline.submit(ctx.pool, fn, *args)
    done: futures.Future[T] = futures.Future()
    done.set_result(fn(*args))
    return done


def _forced(
    pod: PodView, nodes: Sequence[NodeView], config: Config, resolved: Resolved, ctx: Context
) -> placement.Decision | None:
    """The slot the pod's own spec leaves it, when only one capacity is in its reach.

    A pod pinned to a node pool whose nodes are all spot will run on spot whatever
    spotguard asks: it is placed (and counted) as spot, and never given an on-demand
    requirement that no node could meet. Likewise a pod that only on-demand nodes
    can take is on-demand. With nothing in reach (no node matches yet: an autoscaler
    may add one) the floor decides as usual, and so it does when only spot nodes are
    in reach but an on-demand node can be launched for the pod (a Karpenter NodePool
    allows it, or ``SPOTGUARD_ON_DEMAND_LAUNCHABLE=true``): an on-demand slot then keeps
    its requirement and waits for the node, which placing it on spot would never bring.
    """
    if not nodes:
        return None
    reach = fit.within_reach(pod, nodes, config)
    if reach == {Capacity.ON_DEMAND} and moves.launching(resolved.workload):
        # A move back to spot is under way: its replicas wait for the spot node the provisioner
        # launches for them (spotguard.policy.moves), none need exist yet.
        return None
    if reach == {Capacity.SPOT}:
        launch = ctx.launches.for_pod(pod, config)
        if launch is not None:
            log.debug("no on-demand node in reach; one can be launched", extra={"by": launch})
            return None
        if not pod.has_required_affinity and not pod.node_selector:
            # No pin of the user's at all: the cluster has no on-demand node.
            ctx.health.report_unplaceable(resolved, Placement.ON_DEMAND)
        return placement.Decision(Placement.SPOT, "only spot nodes match the pod's own node requirements")
    if reach == {Capacity.ON_DEMAND} and not pod.has_required_affinity and not pod.node_selector:
        # No pin of the user's: the cluster had no spot node when the list was read. Spot nodes
        # that joined since (node-added moving replicas back) must not be missed for a minute:
        # read the list again (at most every NO_SPOT_NODES_MAX_AGE seconds while none is spot).
        try:
            fresh = ctx.resolver.nodes(max_age=NO_SPOT_NODES_MAX_AGE)
        except Exception:  # the review's deadline or the API: decide on the list we have
            log.warning("could not read the nodes again; deciding on the cached list", exc_info=True)
            fresh = []
        reach = fit.within_reach(pod, fresh, config) if fresh else reach
    if reach == {Capacity.ON_DEMAND}:
        return placement.Decision(Placement.ON_DEMAND, "only on-demand nodes match the pod's own node requirements")
    return None


def _statefulset_decision(
    view: PodView, resolved: Resolved, config: Config, ns_annotations: Mapping[str, str], ctx: Context
) -> tuple[placement.Decision, Workload, tuple[str, ...]]:
    """By the pods actually placed: the set's live pods and the set itself, both read now
    (the decision, the set as read, and "by_ordinal" when the pods could not be read in time).

    The set is read again even when cached: a scale-down right before a scale-up
    leaves a cached copy with more replicas (a higher floor) than the set has.
    The GET rides along with the LIST, so it costs no extra round trip.

    When the API server does not answer the LIST within the review's time, the pod is
    placed by its ordinal on the set as known (the lowest ordinals hold the floor, as
    they do once the set has settled) rather than let through with no placement.
    """
    assert ctx.kube is not None
    fresh: futures.Future[Resolved] | None = None
    if not resolved.fresh:
        fresh = deadline.submit(ctx.pool, ctx.resolver.refresh_workload, resolved)
    obj = resolved.obj
    spec = obj.get("spec") or {}
    match = (spec.get("selector") or {}).get("matchLabels") or resolved.workload.selector
    selector = resolve_mod.label_selector(match)
    degraded: tuple[str, ...] = ()
    try:
        raw = ctx.kube.list(resources.PODS, resolved.workload.namespace, label_selector=selector)
    except (deadline.DeadlineExceeded, kube_mod.Transient):
        raw, degraded = [], ("by_ordinal",)
    if fresh is not None:
        if degraded:
            if fresh.done() and fresh.exception() is None:
                resolved = fresh.result()
        else:
            resolved = fresh.result()
    workload = resolved.workload
    floor = floors.floor_for(workload, config, ns_annotations, replicas=max(workload.replicas, 1))
    spec = resolved.obj.get("spec") or {}
    start = (spec.get("ordinals") or {}).get("start") or 0
    if not isinstance(start, int) or start < 0:
        start = 0
    uid = workload.uid
    siblings = [
        p
        for p in (PodView.from_json(x, scheduling=False) for x in raw)
        if p.owner is not None and p.owner.kind == "StatefulSet" and (not uid or p.owner.uid == uid)
    ]
    capacity = ctx.resolver.node_capacity(config, [p.node_name for p in siblings if p.node_name])
    decision = placement.decide(
        pod=view,
        workload=workload,
        floor=floor,
        siblings=siblings,
        node_capacity=capacity,
        ordinal_start=start,
    )
    return decision, workload, degraded


def _beyond_ordinals(resolved: Resolved, pod: PodView) -> bool:
    """A StatefulSet pod whose ordinal is past the cached replicas (its set was scaled since)."""
    if resolved.fresh or resolved.workload.kind is not Kind.STATEFULSET:
        return False
    ordinal = pod.ordinal
    if ordinal is None:
        return False
    start = ((resolved.obj.get("spec") or {}).get("ordinals") or {}).get("start") or 0
    return isinstance(start, int) and ordinal >= start + resolved.workload.replicas


def serve(review: Any, ctx: Context) -> reviews.ResponseReview:
    """Answer one AdmissionReview (raises :class:`errors.WebhookError` when it is not one)."""
    started = time.perf_counter()
    try:
        request = parse(review)
    except errors.WebhookError:
        metrics.REQUESTS.labels("malformed", "none").inc()
        raise
    try:
        outcome = admit(request, ctx)
    except errors.WebhookError:
        metrics.REQUESTS.labels("malformed", "none").inc()
        raise
    audit = {"spotguard.io/decision": f"{outcome.outcome}: {outcome.reason}"[:256]}
    if outcome.placement is not None:
        audit["spotguard.io/placement"] = outcome.placement.value
    answer = build_response(uid=request["uid"], patch=outcome.patch, warnings=outcome.warnings, audit=audit)
    placement_label = outcome.placement.value if outcome.placement is not None else "none"
    metrics.REQUESTS.labels(outcome.outcome, placement_label).inc()
    metrics.DURATION.observe(time.perf_counter() - started)
    log.debug(
        "admitted",
        extra={
            "uid": request["uid"],
            "outcome": outcome.outcome,
            "reason": outcome.reason,
            "placement": placement_label,
        },
    )
    return answer


def _copy_record(ctx: Context, workload: Workload) -> surges.SurgeRecord | None:
    """The record of the Deployment's surge copy (cached), or None: no copy, or the copy could
    not be read (the move's requirement stands then; node-added's pass takes a pod it strands,
    ``moves.stranded``)."""
    try:
        rs = ctx.resolver.surge_copy(workload.namespace, workload.name)
    except (kube_mod.ApiError, deadline.DeadlineExceeded) as exc:
        log.debug("could not read the surge copy", extra={"workload": workload.key, "error": str(exc)})
        return None
    return None if rs is None else surgecopy.record_of(rs)
