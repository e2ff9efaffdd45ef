"""The Flask app: the CloudEvents endpoint, health and metrics.

=======================  =====================================================
``POST /``               a CloudEvent (binary or structured mode): see
                         :mod:`spotguard.interruption.cloudevents`
``GET /healthz``         200 ``{"status": "ok"}`` (also ``/health/liveness``
                         and ``/health/readiness``, the paths func-python uses)
``GET /metrics``         Prometheus text format
=======================  =====================================================
"""

from __future__ import annotations

import logging

import flask
import prometheus_client

from spotguard.interruption import cloudevents, dispatch

log = logging.getLogger("spotguard.interruption")

# Larger than any notice; a bigger body is not one of ours.
MAX_BODY = 1024 * 1024


def create_app(handler: dispatch.Handler) -> flask.Flask:
    """The WSGI app serving ``handler``. Share one handler per process (it is thread-safe
    when wrapped in :class:`spotguard.interruption.dispatch.Serialized`)."""
    app = flask.Flask("spotguard.interruption")
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY

    @app.post("/")
    def receive() -> flask.Response:
        status, headers, body = cloudevents.handle_http(dict(flask.request.headers), flask.request.get_data(), handler)
        if status == 400:
            log.warning(
                "rejected a request that is not a CloudEvent",
                extra={"remote": flask.request.remote_addr, "content_type": flask.request.content_type},
            )
        return flask.Response(body, status=status, headers=headers)

    @app.get("/healthz")
    @app.get("/health/liveness")
    @app.get("/health/readiness")
    def healthz() -> flask.Response:
        return flask.jsonify(status="ok")

    @app.get("/metrics")
    def metrics() -> flask.Response:
        return flask.Response(prometheus_client.generate_latest(), content_type=prometheus_client.CONTENT_TYPE_LATEST)

    @app.errorhandler(405)
    def not_allowed(exc: Exception) -> tuple[flask.Response, int]:
        return flask.jsonify(error="method not allowed", reason="POST a CloudEvent to /"), 405

    @app.errorhandler(413)
    def too_large(exc: Exception) -> tuple[flask.Response, int]:
        return flask.jsonify(error="request too large", reason=f"more than {MAX_BODY} bytes"), 413

    return app
