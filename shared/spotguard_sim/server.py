"""The simulated API server's HTTP(S) transport: threads, TLS, keep-alive, chunked watches."""

from __future__ import annotations

import contextlib
import email.utils
import http.server
import logging
import select
import socket
import ssl
import threading
import time
from typing import Any
from urllib.parse import unquote

import orjson

from spotguard_sim import authn, errors, faults, rbac, requestinfo, routes, tls, wire

log = logging.getLogger("spotguard.sim.server")

ADMIN_TOKEN = authn.ADMIN_TOKEN
ADMIN_USER = authn.ADMIN_USER


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: ApiServer

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server.track_connection(self.connection, add=True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.track_connection(self.connection, add=False)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("api " + format, *args)

    def date_time_string(self, timestamp: float | None = None) -> str:
        """The ``Date`` header on the simulated cluster's clock, the one its timestamps are on
        (kube-apiserver's net/http writes it from the control plane's clock)."""
        return email.utils.formatdate(self.server.api.store.clock.now() if timestamp is None else timestamp,
                                      usegmt=True)  # fmt: skip

    def _serve(self) -> None:
        path, _, raw_query = self.path.partition("?")
        path = unquote(path)
        query = wire.parse_query(raw_query)
        try:
            body = self._read_body()
        except ValueError as exc:
            self.close_connection = True
            response = wire.status_response(errors.BadRequest(f"cannot read the request body: {exc}"))
            self._send(response)
            return
        headers = {k.lower(): v for k, v in self.headers.items()}
        request = wire.Request(
            method=self.command, path=path, query=query, headers=headers, body=body, user=authn.ANONYMOUS,
        )
        try:
            self.server.check_faults(request)
            request.user = self._authorized(request)
            response = self.server.api.handle(request)
        except faults.DropConnection:
            self.close_connection = True
            return
        except errors.StatusError as exc:
            response = wire.status_response(exc)
        except Exception as exc:
            log.exception("api request failed", extra={"method": self.command, "path": self.path})
            response = wire.status_response(errors.internal_error(str(exc)))
        if response.watch is not None:
            self._stream(response)
            return
        self._send(response)

    def _authorized(self, request: wire.Request) -> dict[str, Any]:
        """Authenticate, impersonate, authorize (kube-apiserver's filter chain); the user the
        request acts as, or a 401 or 403 :class:`errors.StatusError`."""
        api = self.server.api
        peer = None
        if isinstance(self.connection, ssl.SSLSocket):
            peer = self.connection.getpeercert() or None
        user = api.authenticator.authenticate(self.headers.get("Authorization"), peer)
        impersonation = {name: self.headers.get_all(name) or [] for name in
                         ("impersonate-user", "impersonate-group", "impersonate-uid")}
        user = authn.impersonate(user, impersonation, api.authorizer)
        attrs = requestinfo.attributes(request.method, request.path, request.query, user)
        decision = api.authorizer.authorize(attrs)
        if not decision.allowed:
            message, details = rbac.forbidden_message(attrs, decision.reason)
            raise errors.Forbidden(message, **details)
        return user

    def _read_body(self) -> bytes:
        """The request body: ``Transfer-Encoding: chunked`` (RFC 9112 7.1) or ``Content-Length``."""
        encoding = (self.headers.get("Transfer-Encoding") or "").lower()
        if "chunked" in encoding:
            parts: list[bytes] = []
            while True:
                line = self.rfile.readline(65537)
                if not line.endswith(b"\n"):
                    raise ValueError("truncated chunk size line")
                size_text = line.split(b";", 1)[0].strip()
                try:
                    size = int(size_text, 16)
                except ValueError:
                    raise ValueError(f"bad chunk size {size_text[:20]!r}") from None
                if size == 0:
                    while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass  # trailer fields
                    return b"".join(parts)
                data = self.rfile.read(size)
                if len(data) != size:
                    raise ValueError("truncated chunk")
                parts.append(data)
                if self.rfile.readline(3) not in (b"\r\n", b"\n"):
                    raise ValueError("chunk not followed by CRLF")
        raw = self.headers.get("Content-Length")
        length = int(raw) if raw and raw.strip().isdigit() else 0
        return self.rfile.read(length) if length else b""

    def _send(self, response: wire.Response) -> None:
        self.send_response(response.status)
        self.send_header("Content-Type", response.content_type)
        self.send_header("Content-Length", str(len(response.body)))
        if "Cache-Control" not in response.headers:
            self.send_header("Cache-Control", "no-cache, private")
        for key, value in response.headers.items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(response.body)

    def _stream(self, response: wire.Response) -> None:
        watcher = response.watch
        assert watcher is not None
        self.server.track(watcher)
        deadline = time.monotonic() + response.watch_timeout if response.watch_timeout else None
        next_bookmark = time.monotonic() + response.watch_bookmark_seconds
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("Cache-Control", "no-cache, private")
            self.end_headers()
            self.wfile.flush()
            while not self.server.stopping.is_set():
                wait = 1.0
                if deadline is not None:
                    wait = min(wait, deadline - time.monotonic())
                    if wait <= 0:
                        break
                if response.watch_bookmark is not None:
                    if time.monotonic() >= next_bookmark:
                        line = b'{"type":"BOOKMARK","object":' + response.watch_bookmark() + b"}\n"
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                        self.wfile.flush()
                        next_bookmark = time.monotonic() + response.watch_bookmark_seconds
                    wait = max(0.0, min(wait, next_bookmark - time.monotonic()))
                item = watcher.next_raw(timeout=wait)
                if item is None:
                    if watcher.closed:
                        break
                    if self._client_gone():
                        break
                    continue
                event_type, entry = item
                body = entry.raw
                if response.watch_transform is not None and event_type not in ("BOOKMARK", "ERROR"):
                    body = response.watch_transform(body)
                line = b'{"type":"' + event_type.encode() + b'","object":' + body + b"}\n"
                self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError, ssl.SSLError, OSError):
            self.close_connection = True
        finally:
            watcher.close()
            self.server.untrack(watcher)

    def _client_gone(self) -> bool:
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
        except (OSError, ValueError):
            return True
        if not readable:
            return False
        self.close_connection = True
        return True

    do_GET = _serve
    do_POST = _serve
    do_PUT = _serve
    do_PATCH = _serve
    do_DELETE = _serve
    do_HEAD = _serve


class ApiServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256

    def __init__(
        self,
        api: routes.Api,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        tls_enabled: bool = True,
        fault_set: faults.Faults | None = None,
    ) -> None:
        super().__init__((host, port), Handler)
        self.api = api
        self.faults = fault_set or faults.Faults()
        self.stopping = threading.Event()
        self._watchers: set[Any] = set()
        self._connections: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.cert = tls.self_signed() if tls_enabled else None
        self.client_ca = tls.client_ca() if tls_enabled else None
        self._ctx = self.cert.server_context(self.client_ca.cert_pem if self.client_ca else None) if self.cert else None

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        scheme = "https" if self._ctx else "http"
        return f"{scheme}://{host!s}:{port}"

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, addr = super().get_request()
        if self._ctx is not None:
            # the handshake happens in the handler thread, on first read
            sock = self._ctx.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return sock, addr

    def check_faults(self, request: wire.Request) -> None:
        try:
            target = wire.resolve(request.path)
        except errors.StatusError:
            return
        if target is None:
            return
        verb = wire.verb_of(request.method, target, request.query)
        self.faults.check(verb, target.rtype.plural)

    def track_connection(self, conn: socket.socket, *, add: bool) -> None:
        with self._lock:
            if add:
                self._connections.add(conn)
            else:
                self._connections.discard(conn)

    def track(self, watcher: Any) -> None:
        with self._lock:
            self._watchers.add(watcher)

    def untrack(self, watcher: Any) -> None:
        with self._lock:
            self._watchers.discard(watcher)

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("connection error from %s", client_address, exc_info=True)

    def stop(self) -> None:
        self.stopping.set()
        with self._lock:
            watchers = list(self._watchers)
        for w in watchers:
            w.close()
        self.shutdown()
        self.server_close()
        with self._lock:
            connections = list(self._connections)
        for conn in connections:  # idle keep-alive connections would outlive the server
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)


def start(api: routes.Api, port: int = 0, *, tls_enabled: bool = True,
          fault_set: faults.Faults | None = None) -> tuple[ApiServer, threading.Thread]:
    """Start serving in a background thread."""
    server = ApiServer(api, port=port, tls_enabled=tls_enabled, fault_set=fault_set)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2},
                              name="spotguard-apiserver", daemon=True)
    thread.start()
    return server, thread


def encode(obj: Any) -> bytes:
    return orjson.dumps(obj)
