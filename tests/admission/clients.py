"""Clients that stall the served webhook: raw TCP and real TLS, as a broken or hostile peer would.

Each returns its open socket; the caller holds it (or closes it) and can wait for the
server to drop it with :func:`dropped_by_server`.
"""

from __future__ import annotations

import contextlib
import select
import socket
import ssl

Address = tuple[str, int]


def address(url: str) -> Address:
    return "127.0.0.1", int(url.rsplit(":", 1)[1])


def client_context(ca: str) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=ca)


def client_hello(ca: str) -> bytes:
    """The first flight of a real TLS client (its ClientHello), as it goes on the wire."""
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = client_context(ca).wrap_bio(incoming, outgoing, server_hostname="localhost")
    with contextlib.suppress(ssl.SSLWantReadError):
        tls.do_handshake()
    hello = outgoing.read()
    assert hello[:1] == b"\x16"  # a handshake record
    return hello


def silent(addr: Address) -> socket.socket:
    """Connected, and never a byte sent."""
    return socket.create_connection(addr, timeout=60)


def half_hello(addr: Address, ca: str) -> socket.socket:
    """Connected, the first half of a ClientHello sent, and then nothing."""
    hello = client_hello(ca)
    sock = socket.create_connection(addr, timeout=60)
    sock.sendall(hello[: len(hello) // 2])
    return sock


def tls(addr: Address, ca: str) -> ssl.SSLSocket:
    """A TLS connection with its handshake done."""
    return client_context(ca).wrap_socket(socket.create_connection(addr, timeout=60), server_hostname="localhost")


def partial_request(addr: Address, ca: str, data: bytes) -> ssl.SSLSocket:
    """After a complete handshake, ``data`` (part of a request) sent, and then nothing."""
    sock = tls(addr, ca)
    sock.sendall(data)
    return sock


def read_answer(sock: socket.socket) -> tuple[bytes, bytes]:
    """One HTTP/1.1 answer (with a Content-Length): its head and its body."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed before the answer's head: {data!r}"
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    length = next(
        int(line.split(b":", 1)[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "connection closed in the answer's body"
        body += chunk
    return head, body


def closed_by_server(sock: socket.socket) -> bool:
    """Without waiting: whether the server has closed this connection (end of stream or reset)."""
    if isinstance(sock, ssl.SSLSocket) and sock.pending():
        return False
    if not select.select([sock], [], [], 0)[0]:
        return False
    try:
        return sock.recv(4096) == b""
    except (ConnectionError, ssl.SSLError):
        return True
    except (BlockingIOError, ssl.SSLWantReadError, TimeoutError):
        return False


def dropped_by_server(sock: socket.socket, timeout: float = 60.0) -> bool:
    """Wait (up to ``timeout``) for the server to close the connection; False if it has not,
    or if it sent anything instead (an answer is not a drop)."""
    sock.settimeout(timeout)
    try:
        return sock.recv(4096) == b""
    except (ConnectionError, ssl.SSLError):
        return True
    except TimeoutError:
        return False
