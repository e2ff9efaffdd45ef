"""The spot-interruption function for Knative, served by func-python 0.8.1 (CloudEvents, ASGI).

func-python calls ``new()`` once and serves the object it returns: ``start(cfg)``
on the ASGI lifespan startup, ``alive()`` and ``ready()`` at
``/health/liveness`` and ``/health/readiness``, and ``handle(scope, receive,
send)`` for every other request, with the CloudEvent already decoded into
``scope["event"]`` (binary or structured mode; a request that is not a
CloudEvent is answered 400 by func-python before it gets here) and ``send``
able to answer with a CloudEvent.

The answer comes from the same core as the local server
(:func:`spotguard.interruption.cloudevents.handle_event`): 200 with a result
CloudEvent for handled, ignored, malformed and foreign events, 503 for a
transient failure so that Knative delivers the event again. A PingSource event
(``dev.knative.sources.ping``) runs the reconcile that scales surges back.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from spotguard import logs, readiness, serving
from spotguard.interruption import cloudevents, dispatch

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Any  # func_python.cloudevent.CloudEventSender

serving.function_logging()  # at import, before func-python's first line
log = logging.getLogger("spotguard.interruption.knative")


def new() -> Function:
    return Function()


class Function:
    def __init__(self, handler: dispatch.Handler | None = None) -> None:
        """``handler`` is for tests; deployed, it is built in :meth:`start` from the environment."""
        self.handler: dispatch.Serialized | None = dispatch.Serialized(handler) if handler else None
        self.error = ""
        self._lock = threading.Lock()

    def start(self, cfg: dict[str, str]) -> None:
        """Connect to the cluster once per instance (in-cluster service account)."""
        logs.configure(cfg.get("SPOTGUARD_LOG_LEVEL"))  # again: func-python's server is set up by now
        self._connect()

    def stop(self) -> None:
        log.info("spot-interruption function stopping")

    def alive(self) -> tuple[bool, str]:
        return True, "OK"

    def ready(self) -> tuple[bool, str]:
        """Ready when it can do its job: connected, the cluster reached, its last attempts not all failed."""
        if self.handler is None:
            return False, "not connected: " + (self.error or "not started")
        why = self.handler.readiness.check() if self.handler.readiness is not None else None
        return (True, "OK") if why is None else (False, why)

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        event = scope["event"]
        handler = self.handler or await asyncio.to_thread(self._connect)
        if handler is None:
            reply = cloudevents.Reply(
                503, {"id": event.get_id(), "type": event.get_type(), "result": "retry", "reason": self.error}
            )
        else:
            # The handler blocks on Kubernetes API calls: keep the event loop free.
            reply = await asyncio.to_thread(cloudevents.handle_event, event, handler)
        await send.structured(reply.to_event(), reply.status)

    def _connect(self) -> dispatch.Serialized | None:
        with self._lock:
            if self.handler is not None:
                return self.handler
            try:
                from spotguard.interruption import handler

                inner = handler.Handler.from_environment()
                self.handler = dispatch.Serialized(inner, readiness.Readiness(readiness.cluster_probe(inner.kube)))
                self.error = ""
            except Exception as exc:
                self.error = f"{type(exc).__name__}: {exc}"
                log.exception("cannot connect to the cluster", extra={"error": self.error})
            return self.handler
