"""Serve a function's WSGI app over plain HTTP with hypercorn, until SIGTERM/SIGINT.

One place for what spot-interruption and node-added both need: the bind address
(IPv6 in brackets), no access log, hypercorn's lines through spotguard's log
formatter, a graceful stop on a signal, and a body limit at the app's own size
(hypercorn otherwise reads up to 16 MiB of a WSGI request into memory before the
app can refuse it).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from typing import Any

from spotguard import logs

log = logging.getLogger(__name__)


def serve(wsgi_app: Any, host: str, port: int, *, max_body: int, graceful_timeout: float) -> None:
    """Serve ``wsgi_app`` on ``host:port`` until SIGTERM or SIGINT."""
    import hypercorn.asyncio
    import hypercorn.config

    config = hypercorn.config.Config()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.accesslog = None
    # hypercorn's own lines through spotguard's formatter (no console handler of its own).
    config.errorlog = logs.through_root(logging.getLogger("hypercorn.error"))
    config.graceful_timeout = graceful_timeout
    config.wsgi_max_body_size = max_body

    async def main() -> None:
        loop = asyncio.get_running_loop()
        stopped = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stopped.set)
        log.info("serving CloudEvents", extra={"url": f"http://{host}:{port}/"})
        await hypercorn.asyncio.serve(wsgi_app, config, shutdown_trigger=stopped.wait, mode="wsgi")

    asyncio.run(main())


def function_logging() -> None:
    """Every line of a Knative function through spotguard's formatter, from its first.

    Called by each ``functions/<name>/function/func.py`` at import, before
    func-python logs anything; its ``start(cfg)`` configures again with the
    function's level (:func:`spotguard.logs.configure`), once func-python's
    ``logging.basicConfig`` has run. func-python builds hypercorn's ``Config``
    itself, and hypercorn would otherwise give ``hypercorn.error`` a console
    handler of its own when it first logs: every ``Config`` made from now on
    logs through the root logger."""
    import hypercorn.config

    logs.configure()
    hypercorn.config.Config.errorlog = logs.through_root(logging.getLogger("hypercorn.error"))


def wait_for_signal(stop: threading.Event) -> None:
    """Block until SIGTERM or SIGINT, then set ``stop``."""

    def on_signal(signum: int, frame: object) -> None:
        log.info("signal received: stopping", extra={"signal": signal.Signals(signum).name})
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    while not stop.wait(1.0):
        pass
