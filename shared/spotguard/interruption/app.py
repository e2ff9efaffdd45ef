"""The Flask app: the CloudEvents endpoint, health and metrics.

=======================  =====================================================
``POST /``               a CloudEvent (binary or structured mode): see
                         :mod:`spotguard.interruption.cloudevents`
``GET /healthz``         200 ``{"status": "ok"}`` while the process answers
                         (also ``/health/liveness``, func-python's path)
``GET /readyz``          200, or 503 with why the function cannot do its job
                         (:mod:`spotguard.readiness`; also ``/health/readiness``)
``GET /metrics``         Prometheus text format
=======================  =====================================================

The app itself is :func:`spotguard.eventhttp.create_app`'s.
"""

from __future__ import annotations

import logging

import flask

from spotguard import eventhttp
from spotguard.interruption import cloudevents, dispatch

log = logging.getLogger("spotguard.interruption")

# Larger than any notice; a bigger body is not one of ours.
MAX_BODY = 1024 * 1024


def create_app(handler: dispatch.Handler) -> flask.Flask:
    """The WSGI app serving ``handler``. Share one handler per process (it is thread-safe
    when wrapped in :class:`spotguard.interruption.dispatch.Serialized`, whose readiness
    ``/readyz`` reports)."""
    ready = getattr(handler, "readiness", None)
    return eventhttp.create_app(
        "spotguard.interruption",
        lambda headers, body: cloudevents.handle_http(headers, body, handler),
        max_body=MAX_BODY,
        log=log,
        ready=ready.check if ready is not None else None,
    )
