"""The production server: gunicorn (embedded through ``BaseApplication``), HTTPS only, TLS 1.2+.

Each worker builds its own :class:`~spotguard.admission.core.Context` (API
connection and caches) on its first request, after the fork. Workers are
``gthread`` so kube-apiserver's kept-alive connections are served in parallel.
"""

from __future__ import annotations

import functools
import ssl
from collections.abc import Callable
from typing import Any

from gunicorn.app.base import BaseApplication

from spotguard.admission import app as app_mod
from spotguard.admission import core


def tls_context(config: Any, default_ssl_context_factory: Callable[[], ssl.SSLContext]) -> ssl.SSLContext:
    """gunicorn's ``ssl_context`` hook: the default context, raised to TLS 1.2 at least."""
    context = default_ssl_context_factory()
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.options |= ssl.OP_NO_COMPRESSION
    return context


BACKLOG = 2048  # pending connections per listening socket (the kernel caps it at net.core.somaxconn)
WORKER_CONNECTIONS = 1000  # open connections per worker


class Server(BaseApplication):  # type: ignore[misc]
    def __init__(self, factory: Callable[[], core.Context], options: dict[str, Any]) -> None:
        self.factory = factory
        self.options = options
        super().__init__()

    def load_config(self) -> None:
        for key, value in self.options.items():
            if value is not None and key in self.cfg.settings:
                self.cfg.set(key, value)

    def load(self) -> Any:
        return app_mod.create_app(self.factory)


def options(
    *,
    host: str,
    port: int,
    certfile: str | None,
    keyfile: str | None,
    workers: int = 2,
    threads: int = 8,
    log_level: str = "warning",
    metrics_port: int | None = None,
) -> dict[str, Any]:
    hooks: dict[str, Any] = {}
    if metrics_port is not None:
        hooks = {"when_ready": functools.partial(serve_metrics, host, metrics_port), "child_exit": worker_gone}
    return {
        **hooks,
        "bind": f"{host}:{port}" if ":" not in host else f"[{host}]:{port}",
        "certfile": certfile,
        "keyfile": keyfile,
        "ssl_context": tls_context,
        "workers": workers,
        "worker_class": "gthread",
        "threads": threads,
        # A burst (a ReplicaSet's slow-start batch of up to 500 pods, several ReplicaSets at
        # once) opens hundreds of connections within milliseconds: the listen queue holds
        # them until a worker accepts (a full queue is "connection refused"), and each
        # worker keeps up to worker_connections open (idle kept-alive ones cost no thread).
        "backlog": BACKLOG,
        "worker_connections": WORKER_CONNECTIONS,
        "timeout": 30,
        "graceful_timeout": 10,
        "keepalive": 75,  # longer than kube-apiserver's idle connection reuse (so it reuses, not reconnects)
        "limit_request_line": 8190,
        "limit_request_fields": 100,
        "preload_app": False,
        "accesslog": None,
        "errorlog": "-",
        "loglevel": log_level,
        "proc_name": "spotguard-admission",
    }


def serve_metrics(host: str, port: int, arbiter: Any) -> None:
    """gunicorn's ``when_ready`` hook (in the master): plain-HTTP /metrics summed over the workers."""
    import prometheus_client
    from prometheus_client import multiprocess

    registry = prometheus_client.CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    prometheus_client.start_http_server(port, addr=host, registry=registry)


def worker_gone(arbiter: Any, worker: Any) -> None:
    """gunicorn's ``child_exit`` hook: a dead worker's live gauges stop counting."""
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)  # type: ignore[no-untyped-call]


def run(factory: Callable[[], core.Context], **kwargs: Any) -> None:
    Server(factory, options(**kwargs)).run()
