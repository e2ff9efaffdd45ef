"""Every HTTPS server spotguard ships or tests with speaks TLS 1.2 and 1.3 only.

A client limited to TLS 1.0/1.1 (with every cipher allowed) must fail the
handshake. A control server that does allow TLS 1.0/1.1 proves that this
client and this OpenSSL can speak them at all, so a refusal means the server
refused.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import tempfile
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
from spotguard_sim import testing, tls

from tests.fuzz import processes

OLD = (ssl.TLSVersion.TLSv1, ssl.TLSVersion.TLSv1_1)
CURRENT = (ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3)
pytestmark = pytest.mark.filterwarnings("ignore:ssl.TLSVersion.TLSv1:DeprecationWarning")


def handshake(port: int, version: ssl.TLSVersion) -> str:
    """The protocol agreed with a client that offers only ``version`` (no certificate check)."""
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.check_hostname = False
    client.verify_mode = ssl.CERT_NONE
    client.set_ciphers("ALL:@SECLEVEL=0")
    client.minimum_version = client.maximum_version = version
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, client.wrap_socket(raw) as conn:
        return str(conn.version())


@contextlib.contextmanager
def control_server() -> Iterator[int]:
    """A server that accepts TLS 1.0 to 1.3 (what the servers under test must not do)."""
    cert = tls.self_signed()
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1
    context.set_ciphers("ALL:@SECLEVEL=0")
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "c").write_bytes(cert.cert_pem)
        Path(tmp, "k").write_bytes(cert.key_pem)
        context.load_cert_chain(Path(tmp, "c"), Path(tmp, "k"))
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with contextlib.suppress(OSError), context.wrap_socket(conn, server_side=True):
                pass

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield int(listener.getsockname()[1])
    finally:
        stop.set()
        listener.close()


def test_the_client_can_speak_tls_1_0_and_1_1() -> None:
    with control_server() as port:
        for version in OLD:
            assert (
                handshake(port, version) == {ssl.TLSVersion.TLSv1: "TLSv1", ssl.TLSVersion.TLSv1_1: "TLSv1.1"}[version]
            )


class Ok(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()


@contextlib.contextmanager
def admission_server(tmp_path: Path) -> Iterator[int]:
    with processes.admission(tmp_path, None) as served:
        yield int(served.url.rsplit(":", 1)[1])


@contextlib.contextmanager
def simulated_api_server(tmp_path: Path) -> Iterator[int]:
    with testing.running_cluster([], controllers=False) as sim:
        yield int(sim.url.rsplit(":", 1)[1])


@contextlib.contextmanager
def webhook_helper_server(tmp_path: Path) -> Iterator[int]:
    server, url, _ = tls.serve_https(Ok)
    try:
        yield int(url.rsplit(":", 1)[1])
    finally:
        server.shutdown()


SERVERS = {
    "spotguard serve admission (gunicorn)": admission_server,
    "the simulated API server": simulated_api_server,
    "sim.tls.serve_https (test and bench webhooks)": webhook_helper_server,
}


@pytest.mark.parametrize("name", sorted(SERVERS))
def test_only_tls_1_2_and_1_3_are_served(name: str, tmp_path: Path) -> None:
    with SERVERS[name](tmp_path) as port:
        assert [handshake(port, v) for v in CURRENT] == ["TLSv1.2", "TLSv1.3"]
        for version in OLD:
            with pytest.raises(ssl.SSLError):
                handshake(port, version)
