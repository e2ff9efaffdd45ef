"""Client connections of the served webhook: no wait on a client is unbounded.

gunicorn's ``gthread`` worker serves a connection on a thread of its pool from
the TLS handshake to the answer, and waits on the client without a limit: a
client that connects and stalls in the handshake (or after a partial
ClientHello, or half-way through its request) holds a thread for good, and a
few of them hold every thread of a replica, whose reviews then time out and
their pods are admitted unplaced (``failurePolicy: Ignore``).

Every wait on the client is bounded by one setting, the *client limit*
(``SPOTGUARD_ADMISSION_CLIENT_TIMEOUT_SECONDS``, :data:`DEFAULT_LIMIT`):

* ``idle``: a new connection that has sent nothing is not given a thread (the
  worker's poller watches it) and is closed when it has sent nothing within
  the limit;
* ``handshake``: the whole TLS handshake, from the thread starting it;
* ``request``: the request head and body together, from the end of the
  handshake (from the thread taking it up, on a kept-alive connection); a
  client trickling a byte at a time is cut at the limit too;
* ``response``: each write of the answer.

A connection cut for one of them is dropped (closed without an answer),
counted in ``spotguard_admission_dropped_connections_total{reason}`` and logged.

:class:`ClientSocket` is the TLS socket class (``SSLContext.sslsocket_class``)
that applies the bounds; the worker (:mod:`spotguard.admission.server`) does
the ``idle`` part.
"""

from __future__ import annotations

import errno
import logging
import math
import socket
import ssl
import threading
import time
from collections.abc import Mapping
from typing import Any

from spotguard.admission import metrics

log = logging.getLogger(__name__)

SETTING = "SPOTGUARD_ADMISSION_CLIENT_TIMEOUT_SECONDS"
# kube-apiserver's own clock for a webhook call (the shipped timeoutSeconds: 3 s) covers its
# connection and handshake too and starts before the server's: a client that has kept a
# thread waiting this long has given up on the call already.
DEFAULT_LIMIT = 3.0
MIN_LIMIT = 0.1  # below this a loaded node's own handshakes would be cut
MAX_LIMIT = 30.0  # the longest timeoutSeconds Kubernetes allows a webhook
MIN_WAIT = 0.001  # past its deadline a read takes only what has arrived already
LOG_EVERY = 10.0  # seconds between two log lines of drops for the same reason

_log_lock = threading.Lock()
_last_logged: dict[str, tuple[float, int]] = {}  # reason -> (time.monotonic() of its last line, drops since)


def limit_from_env(env: Mapping[str, str]) -> float:
    """The client limit from ``$SPOTGUARD_ADMISSION_CLIENT_TIMEOUT_SECONDS``; an invalid
    value (not a number, or outside ``[MIN_LIMIT, MAX_LIMIT]``) is logged and the default used."""
    raw = env.get(SETTING)
    if not raw:
        return DEFAULT_LIMIT
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not MIN_LIMIT <= value <= MAX_LIMIT:  # NaN fails this too
        log.warning(
            "invalid setting; using the default",
            extra={
                "setting": SETTING,
                "value": raw,
                "error": f"must be a number of seconds from {MIN_LIMIT:g} to {MAX_LIMIT:g}",
                "default": DEFAULT_LIMIT,
            },
        )
        return DEFAULT_LIMIT
    return value


def configure(seconds: float) -> None:
    """Set this process's client limit (the server does, before gunicorn forks its workers)."""
    ClientSocket.limit_seconds = seconds


def limit() -> float:
    return ClientSocket.limit_seconds


class Stalled(ConnectionResetError, TimeoutError):
    """The client kept the server waiting past the limit: its connection is dropped.

    A :class:`ConnectionResetError` (``ECONNRESET``), which gunicorn's worker takes for a
    client gone and closes quietly, and a :class:`TimeoutError`, which code bounding its own
    reads (gunicorn's drain of an unread body) takes for a timeout."""

    def __init__(self, reason: str) -> None:
        super().__init__(errno.ECONNRESET, f"client stalled ({reason}), connection dropped")
        self.reason = reason


def dropped(reason: str, client: Any) -> None:
    """Count and log one connection dropped for a client that stalled: a line for the first
    drop, then at most one every :data:`LOG_EVERY` seconds per reason (a flood of stalled
    connections is an attack's, and must not become a flood of log lines), with the
    number of drops not logged since the last line."""
    metrics.DROPPED_CONNECTIONS.labels(reason).inc()
    now = time.monotonic()
    with _log_lock:
        last, unlogged = _last_logged.get(reason, (-math.inf, 0))
        if now - last < LOG_EVERY:
            _last_logged[reason] = (last, unlogged + 1)
            return
        _last_logged[reason] = (now, 0)
    log.warning(
        "client connection dropped: it stalled past the client limit",
        extra={"reason": reason, "client": _address(client), "limit_seconds": limit(), "not_logged_since": unlogged},
    )


def _address(client: Any) -> str:
    if isinstance(client, tuple) and len(client) >= 2:
        return f"{client[0]}:{client[1]}"
    return str(client)


class ClientSocket(ssl.SSLSocket):
    """The served end of one client's TLS connection, every wait on the client bounded.

    gunicorn switches the socket between non-blocking (its poller) and blocking (a thread
    serving it) and sets timeouts of its own (draining a body, lingering at the close):
    those are kept as asked, and no wait is longer than the limit allows. What a read may
    wait for depends on the phase of the connection:

    * ``handshake``, then ``request`` (:meth:`arm`): until the phase's deadline, the limit
      from its start; a read that runs out drops the connection (:class:`Stalled`);
    * ``answered`` (:meth:`answered`): the answer is out; a read (gunicorn draining an
      unread body) waits the limit at most, and running out is not a stall;
    * ``closing`` (:meth:`linger`) and ``dropped``: no read waits at all, so that
      gunicorn's own close, which runs on the worker's main loop, never waits on a client.

    Each write of the answer may wait the limit, and a client that takes none of it for
    that long is dropped as well.
    """

    limit_seconds = DEFAULT_LIMIT  # the client limit, the same for the whole process
    _wanted: float | None = None  # the timeout asked for by the server code (None: blocking)
    _phase = "handshake"
    _deadline = 0.0  # time.monotonic(): the handshake or the request is read by then

    def settimeout(self, value: float | None) -> None:
        self._wanted = value
        super().settimeout(self._write_bound()[0])

    def setblocking(self, flag: bool) -> None:
        self.settimeout(None if flag else 0.0)

    # -- the phases ----------------------------------------------------------------------

    def arm(self) -> None:
        """A request starts: its head and body must arrive within the limit from now."""
        self._phase, self._deadline = "request", time.monotonic() + self.limit_seconds

    def answered(self) -> None:
        """The answer is out (or the request failed): reading the request is over."""
        if self._phase == "request":
            self._phase = "answered"

    def linger(self, seconds: float = 2.0) -> None:
        """Close the way gunicorn does (send FIN, read until the client closes, at most
        ``seconds`` and the limit), on the serving thread: gunicorn's close then runs on its
        main loop without waiting. The socket stays open for gunicorn to close."""
        if self._phase in ("closing", "dropped") or self.fileno() < 0:
            return
        self._phase = "answered"  # what the client does now is no stall of a request
        try:
            self.shutdown(socket.SHUT_WR)
            end = time.monotonic() + min(seconds, self.limit_seconds)
            drained = 0
            while drained < 65536 and (left := end - time.monotonic()) > 0:
                self.settimeout(left)
                data = self.recv(4096)
                if not data:
                    break
                drained += len(data)
        except OSError:  # the client is gone, or took longer: closing anyway
            pass
        finally:
            self._phase = "closing"

    # -- waiting on the client ------------------------------------------------------------

    def do_handshake(self, block: bool = False) -> None:
        wanted = self._wanted
        self._phase, self._deadline = "handshake", time.monotonic() + self.limit_seconds
        bound, ours = self._read_bound()
        super().settimeout(bound)
        try:
            super().do_handshake(block)
        except TimeoutError as exc:
            stalled = self._stalled(ours)
            if stalled is None:
                raise
            raise stalled from exc
        finally:
            self.settimeout(wanted)
        self.arm()

    def recv(self, buflen: int = 1024, flags: int = 0) -> bytes:
        ours = self._before_read()
        try:
            return super().recv(buflen, flags)
        except TimeoutError as exc:
            stalled = self._stalled(ours)
            if stalled is None:
                raise
            raise stalled from exc

    def recv_into(self, buffer: Any, nbytes: int | None = None, flags: int = 0) -> int:
        ours = self._before_read()
        try:
            return super().recv_into(buffer, nbytes, flags)
        except TimeoutError as exc:
            stalled = self._stalled(ours)
            if stalled is None:
                raise
            raise stalled from exc

    def send(self, data: Any, flags: int = 0) -> int:
        bound, ours = self._write_bound()
        super().settimeout(bound)
        try:
            return super().send(data, flags)
        except TimeoutError as exc:
            stalled = self._stalled(ours, "response")
            if stalled is None:
                raise
            raise stalled from exc

    # -- the bounds ----------------------------------------------------------------------

    def _write_bound(self) -> tuple[float | None, bool]:
        """The timeout of the next wait to write (or of a read after the answer), and
        whether it is the limit's (else the caller's own)."""
        return self._bounded(self.limit_seconds)

    def _read_bound(self) -> tuple[float | None, bool]:
        if self._phase in ("handshake", "request"):
            return self._bounded(max(self._deadline - time.monotonic(), MIN_WAIT))
        if self._phase == "answered":
            timeout, _ = self._bounded(self.limit_seconds)
            return timeout, False
        return self._bounded(MIN_WAIT)[0], False  # closing, dropped: no waiting

    def _bounded(self, left: float) -> tuple[float | None, bool]:
        wanted = self._wanted
        if wanted == 0.0:
            return 0.0, False  # non-blocking: never waits
        if self._phase in ("closing", "dropped"):
            left = MIN_WAIT
        if wanted is not None and wanted < left:
            return wanted, False
        return left, self._phase not in ("closing", "dropped")

    def _before_read(self) -> bool:
        bound, ours = self._read_bound()
        super().settimeout(bound)
        return ours

    def _stalled(self, ours: bool, reason: str | None = None) -> Stalled | None:
        """For a wait that ran out: :class:`Stalled` (counted and logged, the connection
        dropped) when the limit ended it, None when the caller's own timeout did."""
        if not ours:
            return None
        reason = reason or self._phase
        self._phase = "dropped"
        try:
            peer: Any = self.getpeername()
        except OSError:
            peer = "?"
        dropped(reason, peer)
        return Stalled(reason)
