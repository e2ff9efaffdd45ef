"""The Flask app: the CloudEvents endpoint, health and metrics.

=======================  =====================================================
``POST /``               a CloudEvent (binary or structured mode): see
                         :mod:`spotguard.nodeadded.cloudevents`
``GET /healthz``         200 ``{"status": "ok"}`` (also ``/health/liveness``
                         and ``/health/readiness``, the paths func-python uses)
``GET /metrics``         Prometheus text format
=======================  =====================================================
"""

from __future__ import annotations

import flask
import prometheus_client

from spotguard.nodeadded import cloudevents, service

MAX_BODY = 4 * 1024 * 1024  # a Node object is a few kB; a big one is tens


def create_app(svc: service.Service) -> flask.Flask:
    app = flask.Flask("spotguard.nodeadded")
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY

    @app.post("/")
    def receive() -> flask.Response:
        status, headers, body = cloudevents.handle_http(dict(flask.request.headers), flask.request.get_data(), svc)
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

    return app
