"""The node-added function for Knative, served by func-python 0.8.1 (CloudEvents, ASGI).

func-python calls ``new()`` once and serves the object it returns: ``start(cfg)``
on the ASGI lifespan startup, ``alive()`` and ``ready()`` at
``/health/liveness`` and ``/health/readiness``, and ``handle(scope, receive,
send)`` for every other request, with the CloudEvent already decoded into
``scope["event"]`` (binary or structured mode).

The answer comes from the same core as the local server
(:func:`spotguard.nodeadded.cloudevents.handle_event`): an ApiServerSource
event for a Node added waits for the node to be Ready (within
``SPOTGUARD_NODE_JOIN_WAIT_SECONDS``) and runs a pass; a PingSource event runs
a pass. 200 with a result CloudEvent, or 503 when the pass could not run, so
that Knative delivers the event again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from spotguard import logs, serving
from spotguard.nodeadded import cloudevents, service

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Any  # func_python.cloudevent.CloudEventSender

serving.function_logging()  # at import, before func-python's first line
log = logging.getLogger("spotguard.nodeadded.knative")


def new() -> Function:
    return Function()


class Function:
    def __init__(self, svc: service.Service | None = None) -> None:
        """``svc`` is for tests; deployed, it is built from the environment on first use."""
        self.service = svc or service.Service(_reconciler)
        self.error = ""

    def start(self, cfg: dict[str, str]) -> None:
        logs.configure(cfg.get("SPOTGUARD_LOG_LEVEL"))  # again: func-python's server is set up by now
        try:
            _ = self.service.reconciler  # connect once per instance (in-cluster service account)
            self.error = ""
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {exc}"
            log.exception("cannot connect to the cluster", extra={"error": self.error})

    def stop(self) -> None:
        log.info("node-added function stopping")

    def alive(self) -> tuple[bool, str]:
        return True, "OK"

    def ready(self) -> tuple[bool, str]:
        """Ready when passes can run: connected, the cluster reached, the last passes not all failed."""
        if self.error:
            return False, "not connected: " + self.error
        why = self.service.ready()
        return (True, "OK") if why is None else (False, why)

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        # A pass blocks on Kubernetes API calls (and may wait for a node): keep the event loop free.
        reply = await asyncio.to_thread(cloudevents.handle_event, scope["event"], self.service)
        await send.structured(reply.to_event(), reply.status)


def _reconciler() -> Any:
    from spotguard.nodeadded.reconciler import Reconciler

    return Reconciler.from_environment()
