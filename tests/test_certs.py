"""GIVEN ``spotguard certs``, THEN a TLS client that trusts only ca.crt accepts the serving cert
for its names (hostname checked), as kube-apiserver does with a webhook's caBundle."""

from __future__ import annotations

import base64
import contextlib
import logging
import socket
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID
from spotguard import certs, cli


@pytest.fixture(autouse=True)
def _drop_cli_log_handler() -> Iterator[None]:
    """cli.main installs a JSON log handler on the (captured) stderr; do not leave it behind."""
    before = list(logging.getLogger().handlers)
    yield
    for handler in logging.getLogger().handlers:
        if handler not in before:
            logging.getLogger().removeHandler(handler)


@contextlib.contextmanager
def tls_server(paths: certs.Paths) -> Iterator[int]:
    """A TLS 1.2+ server on loopback with tls.crt/tls.key that answers b"ok" to each client."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(str(paths.cert), str(paths.key))
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                raw, _ = listener.accept()
            except TimeoutError:
                continue
            with raw:
                raw.settimeout(5)
                try:
                    with context.wrap_socket(raw, server_side=True) as conn:
                        conn.sendall(b"ok")
                except (ssl.SSLError, OSError):
                    pass  # the client refused us: that is what some tests check

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join()
        listener.close()


def connect(port: int, ca: Path, server_hostname: str) -> bytes:
    context = ssl.create_default_context(cafile=str(ca))  # check_hostname and CERT_REQUIRED
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname=server_hostname) as conn,
    ):
        return conn.recv(2)


def test_the_chain_verifies_for_every_name(tmp_path: Path) -> None:
    paths = certs.make(tmp_path, ["localhost", "spotguard-admission.spotguard.svc"], ["127.0.0.1"])
    with tls_server(paths) as port:
        assert connect(port, paths.ca_cert, "localhost") == b"ok"
        assert connect(port, paths.ca_cert, "spotguard-admission.spotguard.svc") == b"ok"
        assert connect(port, paths.ca_cert, "127.0.0.1") == b"ok"
        with pytest.raises(ssl.SSLCertVerificationError, match="match"):
            connect(port, paths.ca_cert, "other.example.com")


def test_another_ca_is_not_trusted(tmp_path: Path) -> None:
    paths = certs.make(tmp_path / "a", ["localhost"])
    other = certs.make(tmp_path / "b", ["localhost"])
    with tls_server(paths) as port, pytest.raises(ssl.SSLCertVerificationError):
        connect(port, other.ca_cert, "localhost")


def test_certificate_contents(tmp_path: Path) -> None:
    paths = certs.make(tmp_path, ["a.example", "b.example"], ["127.0.0.1", "::1"], days=30)
    ca = x509.load_pem_x509_certificate(paths.ca_cert.read_bytes())
    cert = x509.load_pem_x509_certificate(paths.cert.read_bytes())
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is True
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["a.example", "b.example"]
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1", "::1"]
    key = cert.public_key()
    assert isinstance(key, ec.EllipticCurvePublicKey) and key.curve.name == "secp256r1"
    assert cert.issuer == ca.subject
    lifetime = cert.not_valid_after_utc - cert.not_valid_before_utc
    assert 30 <= lifetime.days <= 31
    assert paths.key.stat().st_mode & 0o777 == 0o600
    assert paths.ca_key.stat().st_mode & 0o777 == 0o600


def test_cli_prints_the_ca_bundle_and_refuses_to_overwrite(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "certs"
    assert cli.main(["certs", "--out", str(out), "--dns-name", "a.svc,b.svc", "--ip", "127.0.0.1"]) == 0
    bundle = capsys.readouterr().out.strip()
    assert base64.b64decode(bundle) == (out / "ca.crt").read_bytes()
    assert sorted(p.name for p in out.iterdir()) == sorted(certs.FILES)
    before = {name: (out / name).read_bytes() for name in certs.FILES}

    assert cli.main(["certs", "--out", str(out), "--dns-name", "a.svc"]) == 2
    assert "--force" in capsys.readouterr().err
    assert {name: (out / name).read_bytes() for name in certs.FILES} == before

    assert cli.main(["certs", "--out", str(out), "--dns-name", "a.svc", "--force"]) == 0
    assert (out / "ca.crt").read_bytes() != before["ca.crt"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--dns-name", ""], "at least one"),
        (["--ip", "not-an-ip"], "not an IP"),
        (["--dns-name", "a", "--days", "0"], "--days"),
    ],
)
def test_cli_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    assert cli.main(["certs", "--out", str(tmp_path / "x"), *argv]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
