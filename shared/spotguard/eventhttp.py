"""CloudEvents 1.0 over HTTP for a function: decode, call, reply, and the app that serves it.

One adapter for every function served over CloudEvents (spot-interruption,
node-added); each gives its own ``handle_event`` (a decoded CloudEvent in, a
:class:`Reply` out), its reply type and source (a :class:`Reply` subclass),
its body limit and its name:

=======================  =====================================================
``POST /``               a CloudEvent in binary or structured mode; 400 (JSON)
                         when the request is not a CloudEvent at all, else
                         the function's reply as a structured CloudEvent
                         (Knative accepts an empty body or a CloudEvent as a
                         reply, nothing else)
``GET /healthz``         200 ``{"status": "ok"}`` while the process answers
                         (also ``/health/liveness``, func-python's path)
``GET /readyz``          200 ``{"status": "ok"}``, or 503 ``{"status": "not ready",
                         "reason": ...}`` when the function cannot do its job
                         (:mod:`spotguard.readiness`; also ``/health/readiness``)
``GET /metrics``         Prometheus text format
other methods on ``/``   405 (JSON); a body over the limit: 413 (JSON)
=======================  =====================================================
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, ClassVar

import flask
import prometheus_client
from cloudevents.core import exceptions as ce_exceptions
from cloudevents.core.base import BaseCloudEvent
from cloudevents.core.bindings import http as ce_http
from cloudevents.core.v1.event import CloudEvent

STRUCTURED = "application/cloudevents+json"

Exchange = tuple[int, dict[str, str], bytes]  # status, headers, body


class NotACloudEvent(ValueError):
    """The HTTP request is not a CloudEvent in binary or structured mode (answer 400)."""


@dataclass(frozen=True)
class Reply:
    """What a function answers to one CloudEvent; a subclass names the reply's type and source."""

    status: int
    data: dict[str, Any] = field(default_factory=dict)

    RESULT_TYPE: ClassVar[str] = "dev.spotguard.result"
    RESULT_SOURCE: ClassVar[str] = "/spotguard"

    def to_event(self) -> CloudEvent:
        return CloudEvent(
            attributes={
                "type": self.RESULT_TYPE,
                "source": self.RESULT_SOURCE,
                "id": str(uuid.uuid4()),
                "time": datetime.now(UTC),
                "datacontenttype": "application/json",
            },
            data=self.data,
        )

    def to_http(self) -> ce_http.HTTPMessage:
        """The answer as a structured-mode HTTP message (Content-Type application/cloudevents+json)."""
        return ce_http.to_structured_event(self.to_event())


def decode_http(headers: Mapping[str, str], body: bytes) -> BaseCloudEvent:
    """Read a CloudEvent from an HTTP request in binary or structured mode.

    Raises :class:`NotACloudEvent` with a message saying what is missing.
    """
    lowered = {name.lower(): value for name, value in headers.items()}
    binary = any(name.startswith("ce-") for name in lowered)
    content_type = lowered.get("content-type", "").split(";")[0].strip().lower()
    try:
        return ce_http.from_http_event(ce_http.HTTPMessage(headers=lowered, body=body))
    except (ce_exceptions.BaseCloudEventException, ValueError, TypeError, AttributeError, RecursionError) as exc:
        if binary:
            raise NotACloudEvent(f"not a valid CloudEvent in binary mode: {exc}") from None
        if content_type == STRUCTURED:
            raise NotACloudEvent(f"not a valid CloudEvent in structured mode: {exc}") from None
        raise NotACloudEvent(
            "expected a CloudEvent: binary mode (ce-specversion, ce-id, ce-source and ce-type "
            f"headers) or structured mode (Content-Type: {STRUCTURED}); got neither "
            f"(Content-Type {content_type or 'missing'!r})"
        ) from None


def handle_http(headers: Mapping[str, str], body: bytes, handle_event: Callable[[BaseCloudEvent], Reply]) -> Exchange:
    """The whole HTTP exchange: (status, headers, body). 400 when it is not a CloudEvent."""
    try:
        event = decode_http(headers, body)
    except NotACloudEvent as exc:
        text = json.dumps({"error": "not a CloudEvent", "reason": str(exc)}).encode()
        return 400, {"content-type": "application/json"}, text
    reply = handle_event(event)
    message = reply.to_http()
    return reply.status, dict(message.headers), message.body


def create_app(
    name: str,
    exchange: Callable[[Mapping[str, str], bytes], Exchange],
    *,
    max_body: int,
    log: logging.Logger,
    ready: Callable[[], str | None] | None = None,
) -> flask.Flask:
    """The WSGI app serving one function's ``exchange`` (see the module docstring)."""
    app = flask.Flask(name)
    app.config["MAX_CONTENT_LENGTH"] = max_body

    @app.post("/")
    def receive() -> flask.Response:
        status, headers, body = exchange(dict(flask.request.headers), flask.request.get_data())
        if status == 400:
            log.warning(
                "rejected a request that is not a CloudEvent",
                extra={"remote": flask.request.remote_addr, "content_type": flask.request.content_type},
            )
        return flask.Response(body, status=status, headers=headers)

    @app.get("/healthz")
    @app.get("/health/liveness")
    def healthz() -> flask.Response:
        return flask.jsonify(status="ok")

    @app.get("/readyz")
    @app.get("/health/readiness")
    def readyz() -> flask.Response | tuple[flask.Response, int]:
        why = ready() if ready is not None else None
        if why is None:
            return flask.jsonify(status="ok")
        return flask.jsonify(status="not ready", reason=why), 503

    @app.get("/metrics")
    def metrics() -> flask.Response:
        return flask.Response(prometheus_client.generate_latest(), content_type=prometheus_client.CONTENT_TYPE_LATEST)

    @app.errorhandler(405)
    def not_allowed(exc: Exception) -> tuple[flask.Response, int]:
        return flask.jsonify(error="method not allowed", reason="POST a CloudEvent to /"), 405

    @app.errorhandler(413)
    def too_large(exc: Exception) -> tuple[flask.Response, int]:
        return flask.jsonify(error="request too large", reason=f"more than {max_body} bytes"), 413

    return app
