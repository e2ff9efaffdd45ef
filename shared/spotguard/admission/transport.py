"""The HTTP surface shared by every adapter (Flask, Knative/ASGI, Lambda Function URL).

``handle(method, path, body, ctx)`` returns ``(status, headers, body)``:

* ``POST /mutate`` (and ``POST /``, for a Knative Service or a Function URL that
  is called on its root): an AdmissionReview in, an AdmissionReview out (200),
  or a JSON error (400 not JSON / not an AdmissionReview / no request, 413 body
  over :data:`MAX_BODY`). Never a 5xx; a pod CREATE is never denied.
* ``POST /evictions`` (or any of the above: the review says what it is): a
  ``pods/eviction`` review, answered by the eviction guard
  (:mod:`spotguard.admission.evictions`), which may deny with 429.
* ``GET /healthz``: the process is up. ``GET /readyz``: it can do its job (a cluster
  connection, the state namespace, on-demand and spot nodes; see
  :mod:`spotguard.admission.health`), else 503 with the reason.
* ``GET /metrics``: Prometheus exposition.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from spotguard.admission import core, errors, evictions, metrics

log = logging.getLogger(__name__)

MAX_BODY = 3 * 1024 * 1024  # kube-apiserver caps requests at 3 MiB too
JSON = "application/json"
Headers = dict[str, str]
MUTATE_PATHS = frozenset({"/mutate", "/", "/evictions"})


def json_answer(status: int, body: Any) -> tuple[int, Headers, bytes]:
    return status, {"Content-Type": JSON}, json.dumps(body, separators=(",", ":")).encode()


def error_answer(exc: errors.WebhookError) -> tuple[int, Headers, bytes]:
    return json_answer(exc.code, exc.body())


def decode(body: bytes) -> Any:
    if len(body) > MAX_BODY:
        raise errors.BodyTooLarge(f"the body is {len(body)} bytes; the limit is {MAX_BODY}")
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise errors.NotJSON(f"the body is not JSON: {str(exc)[:200]}") from None


def mutate(body: bytes, ctx: core.Context) -> tuple[int, Headers, bytes]:
    review: Any = None
    try:
        review = decode(body)
        if evictions.is_eviction(review):
            return json_answer(200, evictions.serve(review, ctx))
        return json_answer(200, core.serve(review, ctx))
    except errors.WebhookError as exc:
        if isinstance(exc, (errors.BodyTooLarge, errors.NotJSON)):
            metrics.REQUESTS.labels("malformed", "none").inc()
        log.info("malformed admission request", extra={"reason": exc.reason, "error": exc.message})
        return error_answer(exc)
    except Exception as exc:  # a bug: still never a 5xx, never a denial
        metrics.ERRORS.labels(type(exc).__name__).inc()
        log.exception("unexpected error answering an admission request")
        request = review.get("request") if isinstance(review, dict) else None
        uid = request.get("uid") if isinstance(request, dict) else None
        if isinstance(uid, str) and uid:
            return json_answer(200, core.build_response(uid=uid))
        return error_answer(errors.WebhookError(f"cannot answer: {type(exc).__name__}"))


def handle(method: str, path: str, body: bytes, ctx: core.Context | None) -> tuple[int, Headers, bytes]:
    """Route one HTTP request. ``ctx`` None: the process is still starting."""
    method = method.upper()
    path = "/" + path.strip("/") if path else "/"
    if path in MUTATE_PATHS:
        if method != "POST":
            return error_answer(errors.MethodNotAllowed(f"{method} {path}: use POST"))
        if ctx is None:
            return error_answer(errors.WebhookError("not started yet"))
        return mutate(body, ctx)
    if path in ("/healthz", "/readyz", "/metrics") and method not in ("GET", "HEAD"):
        return error_answer(errors.MethodNotAllowed(f"{method} {path}: use GET"))
    if path == "/healthz":
        return 200, {"Content-Type": "text/plain"}, b"ok"
    if path == "/readyz":
        reason = ctx.readiness() if ctx is not None else "starting"
        if reason is None:
            warning = ctx.readiness_warning() if ctx is not None else None
            ready = "ok" if warning is None else f"ok (warning: {warning})"
            return 200, {"Content-Type": "text/plain"}, ready.encode()
        return 503, {"Content-Type": "text/plain"}, f"not ready: {reason}".encode()
    if path == "/metrics":
        text, content_type = metrics.render()
        return 200, {"Content-Type": content_type}, text
    return error_answer(errors.NotFound(f"no such path {path[:200]}"))
