"""The Flask app: the CloudEvents endpoint, health and metrics.

=======================  =====================================================
``POST /``               a CloudEvent (binary or structured mode): see
                         :mod:`spotguard.nodeadded.cloudevents`
``GET /healthz``         200 ``{"status": "ok"}`` while the process answers
                         (also ``/health/liveness``, func-python's path)
``GET /readyz``          200, or 503 with why passes cannot run
                         (:meth:`Service.ready`; also ``/health/readiness``)
``GET /metrics``         Prometheus text format
=======================  =====================================================

The app itself is :func:`spotguard.eventhttp.create_app`'s.
"""

from __future__ import annotations

import flask

from spotguard import eventhttp
from spotguard.nodeadded import cloudevents, service

MAX_BODY = 4 * 1024 * 1024  # a Node object is a few kB; a big one is tens


def create_app(svc: service.Service) -> flask.Flask:
    return eventhttp.create_app(
        "spotguard.nodeadded",
        lambda headers, body: cloudevents.handle_http(headers, body, svc),
        max_body=MAX_BODY,
        log=service.log,
        ready=svc.ready,
    )
