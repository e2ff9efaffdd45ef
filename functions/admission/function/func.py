"""The admission webhook as a Knative function, served by func-python (ASGI).

func-python calls ``new()`` once, then ``start(cfg)`` (the environment) on the
ASGI lifespan startup, routes ``/health/liveness`` and ``/health/readiness`` to
``alive()`` and ``ready()``, and every other request to ``handle(scope,
receive, send)``. The answer comes from the same core as the local server.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from spotguard import logs, serving
from spotguard.admission import core, errors, transport

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

serving.function_logging()  # at import, before func-python's first line
log = logging.getLogger("spotguard.admission.knative")


def new() -> Function:
    return Function()


class Function:
    def __init__(self) -> None:
        self.ctx: core.Context | None = None

    def start(self, cfg: dict[str, str]) -> None:
        """Connect to the cluster (once per instance; caches live as long as it does)."""
        logs.configure(cfg.get("SPOTGUARD_LOG_LEVEL"))  # again: func-python's server is set up by now
        self.ctx = core.context_from_env(cfg)

    def stop(self) -> None:
        log.info("admission function stopping")

    def alive(self) -> tuple[bool, str]:
        return True, "OK"

    def ready(self) -> tuple[bool, str]:
        reason = self.ctx.readiness() if self.ctx is not None else "not started"
        if reason is None:
            return True, "OK"
        return False, reason

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.ctx is None:  # served without the lifespan protocol
            self.ctx = await asyncio.to_thread(core.context_from_env)
        body, too_large = await _read_body(receive)
        if too_large:
            answer = transport.error_answer(errors.BodyTooLarge(f"the body is over {transport.MAX_BODY} bytes"))
        else:
            method, path = str(scope.get("method") or "GET"), str(scope.get("path") or "/")
            # The core blocks on Kubernetes API calls: keep the event loop free.
            answer = await asyncio.to_thread(transport.handle, method, path, body, self.ctx)
        status, headers, payload = answer
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [[k.lower().encode(), v.encode()] for k, v in headers.items()],
            }
        )
        await send({"type": "http.response.body", "body": payload})


async def _read_body(receive: Receive) -> tuple[bytes, bool]:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message.get("type") == "http.disconnect":
            break
        chunk = message.get("body") or b""
        size += len(chunk)
        if size > transport.MAX_BODY:
            return b"", True
        chunks.append(chunk)
        if not message.get("more_body"):
            break
    return b"".join(chunks), False
