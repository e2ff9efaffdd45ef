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
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from spotguard.admission import errors, metrics, reviews
from spotguard.admission.reservations import POD_ANNOTATION, Reservations
from spotguard.admission.resolve import Resolved, Resolver, Unresolved
from spotguard.gateway import kube as kube_mod
from spotguard.gateway import retry
from spotguard.policy import floors, patches, placement
from spotguard.policy.config import Config
from spotguard.policy.placement import Placement
from spotguard.policy.validation import Problem
from spotguard.policy.views import PodView
from spotguard.policy.workloads import Kind

log = logging.getLogger(__name__)

DEFAULT_NAMESPACE = "spotguard"
# Admission runs under a three-second webhook timeout: short API deadlines, few retries.
API_POLICY = retry.Policy(attempts=2, deadline=1.5, timeout=1.0, connect_timeout=0.5, base_delay=0.05)
EVENT_INTERVAL = 600.0  # seconds between two identical Events about one workload


@dataclass(frozen=True)
class Outcome:
    outcome: str  # patched | unchanged | skipped | failed_open
    reason: str
    placement: Placement | None = None
    patch: Sequence[Mapping[str, Any]] = ()
    warnings: Sequence[str] = ()


class EventReporter:
    """Warning Events for invalid annotations, deduplicated in-process."""

    def __init__(self, kube: kube_mod.Kube | None, interval: float = EVENT_INTERVAL) -> None:
        self.kube = kube
        self.interval = interval
        self._sent: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()

    def report(self, resolved: Resolved, problems: Sequence[Problem]) -> None:
        if not problems:
            return
        message = "; ".join(str(p) for p in problems)
        w = resolved.workload
        key = (w.uid or w.key, message)
        now = time.monotonic()
        with self._lock:
            last = self._sent.get(key)
            if last is not None and now - last < self.interval:
                return
            if len(self._sent) > 10_000:
                self._sent.clear()
            self._sent[key] = now
        log.warning("invalid spotguard annotation", extra={"workload": w.key, "problems": message})
        if self.kube is not None:
            metrics.api_call("create", "events")
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
    """

    def __init__(
        self,
        config: Config | Callable[[], Config],
        kube: kube_mod.Kube | None,
        namespace: str = DEFAULT_NAMESPACE,
        *,
        trust_seconds: float = 3.0,
        connect_error: str = "",
        pending_grace: float = 5.0,
    ) -> None:
        self._config = config
        self.kube = kube
        self.namespace = namespace
        self.connect_error = connect_error
        self.events = EventReporter(kube)
        if kube is not None:
            self.resolver = Resolver(kube)
            self.reservations = Reservations(
                kube, self.resolver, namespace, trust_seconds=trust_seconds, pending_grace=pending_grace
            )

    @property
    def config(self) -> Config:
        return self._config() if callable(self._config) else self._config

    @property
    def ready(self) -> bool:
        return self.kube is not None


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
    trust = float(env.get("SPOTGUARD_ADMISSION_TRUST_SECONDS") or 3.0)
    grace = float(env.get("SPOTGUARD_ADMISSION_PENDING_GRACE_SECONDS") or 5.0)
    try:
        k = (connect or kube_mod.connect)(kubeconfig or env.get("SPOTGUARD_KUBECONFIG") or None)
        k = k.with_policy(API_POLICY)
    except Exception as exc:
        log.error("no Kubernetes connection; admitting pods unchanged", extra={"error": str(exc)})
        config, problems = config_mod.from_env(env)
        for p in problems:
            log.warning("invalid setting; using the default", extra={"problem": str(p)})
        return Context(config, None, namespace, trust_seconds=trust, connect_error=str(exc))
    loader = settings.Loader(k, env)
    return Context(lambda: loader.get()[0], k, namespace, trust_seconds=trust, pending_grace=grace)


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
    pod: Mapping[str, Any], where: Placement, config: Config, token: str | None
) -> list[dict[str, Any]]:
    """The policy's patch, plus the reservation token annotation for an on-demand slot."""
    if token is None:
        return patches.build(pod, where, config)
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
    return first + patches.build(with_token, where, config)


# -- the decision ------------------------------------------------------------------------


def admit(request: reviews.Request, ctx: Context) -> Outcome:
    """Decide for one request; never raises (an internal error fails open)."""
    try:
        return _admit(request, ctx)
    except errors.WebhookError:
        raise
    except Exception as exc:
        kind = type(exc).__name__
        metrics.ERRORS.labels(kind).inc()
        log.error(
            "admission failed; allowing the pod unchanged",
            extra={"uid": request.get("uid"), "error": str(exc), "kind": kind},
            exc_info=not isinstance(exc, kube_mod.ApiError),
        )
        return Outcome("failed_open", f"internal error: {kind}")


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
        ops = patches.build(pod, where, config)
        return Outcome("patched" if ops else "unchanged", "already placed (reinvocation)", where, ops)
    if ctx.kube is None:
        raise RuntimeError(f"no Kubernetes connection: {ctx.connect_error}")
    ns_annotations = ctx.resolver.namespace_annotations(namespace)
    resolved = ctx.resolver.resolve(view)
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

    def decide(held: int) -> placement.Decision:
        return placement.decide(pod=view, workload=workload, floor=floor, reserved_on_demand=held)

    def refresh() -> tuple[int, Callable[[int], placement.Decision]]:
        """The Deployment read again (bypassing the cache) and the decision on its floor."""
        metrics.STALE.inc()
        again = ctx.resolver.refresh_workload(resolved)
        w = again.workload
        f = floors.floor_for(w, config, ns_annotations, replicas=max(w.replicas, 1))
        ctx.events.report(again, f.problems)
        log.info(
            "workload changed since it was cached; deciding on the new floor",
            extra={"uid": request.get("uid"), "workload": w.key, "replicas": w.replicas, "floor": f.on_demand},
        )
        return w.replicas, lambda held: placement.decide(pod=view, workload=w, floor=f, reserved_on_demand=held)

    token: str | None = None
    if workload.kind is Kind.STATEFULSET or floor.on_demand == 0:
        decision = decide(0)  # by ordinal, or nothing to reserve
    else:
        claim = ctx.reservations.claim(
            resolved=resolved,
            floor=floor.on_demand,
            token=str(request["uid"]),
            config=config,
            decide=decide,
            dry_run=bool(request.get("dryRun")),
            replicas=workload.replicas,
            refresh=None if resolved.fresh else refresh,
        )
        decision, token = claim.decision, claim.token
    if decision.placement is None:
        return Outcome("skipped", decision.reason)
    ops = placement_patch(pod, decision.placement, config, token)
    return Outcome("patched", decision.reason, decision.placement, ops)


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
