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

    def server_context(self, client_ca_pem: bytes | None = None) -> ssl.SSLContext:
        """An SSLContext serving this certificate (TLS 1.2+); with ``client_ca_pem``, it asks
        for an optional client certificate signed by that CA."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.set_alpn_protocols(["http/1.1"])
        if client_ca_pem is not None:
            ctx.verify_mode = ssl.CERT_OPTIONAL
            ctx.load_verify_locations(cadata=client_ca_pem.decode())
        with tempfile.TemporaryDirectory() as tmp:
            cert_path = os.path.join(tmp, "tls.crt")
            key_path = os.path.join(tmp, "tls.key")
            with open(cert_path, "wb") as fh:
                fh.write(self.cert_pem)
            with open(key_path, "wb") as fh:
                fh.write(self.key_pem)
            ctx.load_cert_chain(cert_path, key_path)
        return ctx


def _ca_builder(name: x509.Name, key: ec.EllipticCurvePrivateKey, days: int) -> x509.CertificateBuilder:
    """A self-signed CA certificate's builder (it signs certificates), valid ``days``."""
    now = datetime.datetime.now(datetime.UTC)
    return (
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
    )


def self_signed(hosts: tuple[str, ...] = ("127.0.0.1", "localhost", "::1"), days: int = 30) -> ServingCert:
    """An EC P-256 certificate that is its own CA, valid for the given names and IPs."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "spotguard-sim-apiserver")])
    alt: list[x509.GeneralName] = []
    for host in hosts:
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            alt.append(x509.DNSName(host))
    cert = (
        _ca_builder(name, key, days)
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


@dataclass(frozen=True)
class ClientCA:
    """The CA kube-apiserver's ``--client-ca-file`` names: it signs client certificates
    whose CN is the user and whose O values are the groups."""

    cert_pem: bytes
    key_pem: bytes

    def issue(self, user: str, groups: tuple[str, ...] = (), days: int = 30) -> tuple[bytes, bytes]:
        """A client certificate and its key (PEM) for ``user`` in ``groups``."""
        ca_key = serialization.load_pem_private_key(self.key_pem, password=None)
        assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
        ca_cert = x509.load_pem_x509_certificate(self.cert_pem)
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([
            *(x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups),
            x509.NameAttribute(NameOID.COMMON_NAME, user),
        ])
        now = datetime.datetime.now(datetime.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def client_ca(days: int = 30) -> ClientCA:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "spotguard-sim-client-ca")])
    cert = _ca_builder(name, key, days).sign(key, hashes.SHA256())
    return ClientCA(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


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
