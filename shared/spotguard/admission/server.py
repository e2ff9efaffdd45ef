"""The production server: gunicorn (embedded through ``BaseApplication``), HTTPS only, TLS 1.2+.

Each worker builds its own :class:`~spotguard.admission.core.Context` (API
connection and caches) on its first request, after the fork. Workers are
``gthread`` (:class:`Worker`) so kube-apiserver's connections are served in
parallel; each request is stamped when the worker's main loop hands it to a
thread, and its review's deadline counts from there.
"""

from __future__ import annotations

import contextlib
import functools
import os
import ssl
import threading
import time
from collections.abc import Callable
from typing import Any

from gunicorn import glogging
from gunicorn.app.base import BaseApplication
from gunicorn.workers import gthread

from spotguard import logs
from spotguard.admission import app as app_mod
from spotguard.admission import connections, core, deadline

_contexts: dict[tuple[Any, ...], ssl.SSLContext] = {}
_contexts_lock = threading.Lock()


def _signature(path: str | None) -> tuple[Any, ...]:
    if not path:
        return (None,)
    try:
        st = os.stat(path)
    except OSError:
        return (path, None)
    return (path, st.st_ino, st.st_size, st.st_mtime_ns)


def tls_context(config: Any, default_ssl_context_factory: Callable[[], ssl.SSLContext]) -> ssl.SSLContext:
    """gunicorn's ``ssl_context`` hook: the default context, raised to TLS 1.2 at least.

    gunicorn asks for a context on every new connection; building one (reading and
    parsing the certificate and key) costs about a millisecond of CPU, which a burst of
    hundreds of new connections pays hundreds of times. The context is built once and
    built again only when the certificate or key file changes (a rotated Secret).

    Its sockets are :class:`connections.ClientSocket`: the handshake, the request and each
    write of the answer are bounded by the client limit."""
    key = (_signature(config.certfile), _signature(config.keyfile), _signature(config.ca_certs))
    with _contexts_lock:
        context = _contexts.get(key)
        if context is None:
            context = default_ssl_context_factory()
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            context.options |= ssl.OP_NO_COMPRESSION
            context.sslsocket_class = connections.ClientSocket
            _contexts.clear()
            _contexts[key] = context
        return context


class Worker(gthread.ThreadWorker):  # type: ignore[misc]
    """gunicorn's threaded worker, with each request stamped when it is ready to be served
    (accepted, or a kept-alive connection readable): the review's deadline counts from
    there, so a review that waited out its time behind a burst is shed, not answered late.

    No thread waits on a client past the client limit (:mod:`spotguard.admission.connections`):
    a new connection that has sent nothing yet goes back to the worker's poller at once
    (gunicorn's own worker holds a thread for up to 5 s first) and is closed when it has
    sent nothing within the limit (gunicorn's: the 75 s keep-alive); the TLS socket bounds
    the handshake and the request; a kept-alive connection's next request gets the limit
    afresh when a thread takes it up."""

    def enqueue_req(self, conn: Any) -> None:
        conn.spotguard_ready = time.monotonic()
        super().enqueue_req(conn)

    def handle(self, conn: Any) -> Any:
        if not conn.initialized and not conn.data_ready and not conn.wait_for_data(0):
            return gthread._DEFER  # to the poller, which hands it back when its first bytes arrive
        if isinstance(conn.sock, connections.ClientSocket):
            conn.sock.arm()
        keep = super().handle(conn)
        if keep is False and isinstance(conn.sock, connections.ClientSocket):
            # gunicorn closes it next, on its main loop, lingering up to 2 s for the client
            # to close first: every connection of the worker would wait on this client.
            conn.sock.linger()
        return keep

    def finish_request(self, conn: Any, fs: Any) -> None:
        super().finish_request(conn, fs)
        if self.pending_conns and self.pending_conns[-1] is conn:
            # Deferred above (only new connections are): closed unless it speaks within the
            # limit. Every entry gets "now + limit", so the queue stays in expiry order.
            conn.timeout = time.monotonic() + connections.limit()

    def murder_pending(self) -> None:
        """gunicorn's ``murder_pending``, each connection closed counted and logged."""
        now = time.monotonic()
        while self.pending_conns and self.pending_conns[0].timeout <= now:
            conn = self.pending_conns.popleft()
            with contextlib.suppress(OSError, KeyError, ValueError):
                self.poller.unregister(conn.sock)
            self.nr_conns -= 1
            conn.close()
            connections.dropped("idle", conn.client)

    def handle_request(self, req: Any, conn: Any) -> Any:
        try:
            with deadline.arrived(getattr(conn, "spotguard_ready", None)):
                return super().handle_request(req, conn)
        finally:
            if isinstance(conn.sock, connections.ClientSocket):
                conn.sock.answered()

    def handle_error(self, req: Any, client: Any, addr: Any, exc: BaseException) -> None:
        try:
            super().handle_error(req, client, addr, exc)
        finally:
            if isinstance(client, connections.ClientSocket):
                client.answered()


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
        "worker_class": Worker,
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
        "logger_class": ErrorLog,
        "proc_name": "spotguard-admission",
    }


class ErrorLog(glogging.Logger):  # type: ignore[misc]
    """gunicorn's log through spotguard's formatter: no console handler of its own, its records
    to the root logger's (:mod:`spotguard.logs`), at gunicorn's level."""

    def setup(self, cfg: Any) -> None:
        super().setup(cfg)
        logs.through_root(self.error_log)


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


def run(
    factory: Callable[[], core.Context], *, client_timeout: float = connections.DEFAULT_LIMIT, **kwargs: Any
) -> None:
    connections.configure(client_timeout)  # before the fork: every worker has it
    Server(factory, options(**kwargs)).run()
