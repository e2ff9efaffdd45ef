"""A self-signed serving certificate for the simulated API server (loopback only)."""

from __future__ import annotations

import base64
import datetime
import http.server
import ipaddress
import os
import ssl
import tempfile
import threading
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class ServingCert:
    cert_pem: bytes
    key_pem: bytes

    def server_context(self) -> ssl.SSLContext:
        """An SSLContext serving this certificate (TLS 1.2+)."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.set_alpn_protocols(["http/1.1"])
        with tempfile.TemporaryDirectory() as tmp:
            cert_path = os.path.join(tmp, "tls.crt")
            key_path = os.path.join(tmp, "tls.key")
            with open(cert_path, "wb") as fh:
                fh.write(self.cert_pem)
            with open(key_path, "wb") as fh:
                fh.write(self.key_pem)
            ctx.load_cert_chain(cert_path, key_path)
        return ctx


def self_signed(hosts: tuple[str, ...] = ("127.0.0.1", "localhost", "::1"), days: int = 30) -> ServingCert:
    """An EC P-256 certificate that is its own CA, valid for the given names and IPs."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "spotguard-sim-apiserver")])
    now = datetime.datetime.now(datetime.UTC)
    alt: list[x509.GeneralName] = []
    for host in hosts:
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            alt.append(x509.DNSName(host))
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=False,
                content_commitment=False, key_encipherment=False, data_encipherment=False,
                key_agreement=False, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(alt), critical=False)
        .sign(key, hashes.SHA256())
    )
    return ServingCert(
        cert_pem=cert.public_bytes(serialization.Encoding.PEM),
        key_pem=key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )


def serve_https(
    handler: type[http.server.BaseHTTPRequestHandler], cert: ServingCert | None = None
) -> tuple[http.server.ThreadingHTTPServer, str, str]:
    """Serve ``handler`` over HTTPS on 127.0.0.1 in a daemon thread (test webhooks, benchmarks).

    Returns the server (stop it with ``shutdown()``), its base URL and the caBundle
    (base64 PEM) a webhook configuration needs to trust it.
    """
    cert = cert or self_signed()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    server.socket = cert.server_context().wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, name="https-" + handler.__name__, daemon=True).start()
    url = f"https://127.0.0.1:{server.server_address[1]}"
    return server, url, base64.b64encode(cert.cert_pem).decode()
