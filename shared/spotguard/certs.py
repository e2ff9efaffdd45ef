"""Write a CA and a serving certificate for the admission webhook, and print the caBundle.

    spotguard certs --out DIR --dns-name spotguard-admission.spotguard.svc [--ip 127.0.0.1]

writes ``DIR/ca.crt``, ``DIR/ca.key``, ``DIR/tls.crt`` and ``DIR/tls.key``
(EC P-256 keys; the serving certificate carries the names as subjectAltNames
and the serverAuth extended key usage) and prints base64 of ``ca.crt`` on
stdout: the ``caBundle`` of the MutatingWebhookConfiguration. Existing files
are kept unless ``--force`` is given. For a cluster with cert-manager, use the
manifests' cert-manager option instead.
"""

from __future__ import annotations

import argparse
import base64
import datetime
import ipaddress
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from spotguard.logs import UserError

DEFAULT_DAYS = 365
FILES = ("ca.crt", "ca.key", "tls.crt", "tls.key")


@dataclass(frozen=True)
class Paths:
    ca_cert: Path
    ca_key: Path
    cert: Path
    key: Path

    @property
    def ca_bundle(self) -> str:
        """base64 of the CA certificate PEM: a webhook's ``clientConfig.caBundle``."""
        return base64.b64encode(self.ca_cert.read_bytes()).decode()


def make(
    out_dir: str | os.PathLike[str],
    dns_names: Sequence[str],
    ips: Sequence[str] = (),
    days: int = DEFAULT_DAYS,
    force: bool = True,
) -> Paths:
    """Write a fresh CA and a serving certificate for ``dns_names`` and ``ips`` into ``out_dir``."""
    names = [n.strip() for n in dns_names if n.strip()]
    addresses = [_ip(a) for a in ips]
    if not names and not addresses:
        raise UserError("give at least one --dns-name or --ip for the serving certificate")
    if days < 1:
        raise UserError("--days must be at least 1")
    out = Path(out_dir)
    paths = Paths(out / "ca.crt", out / "ca.key", out / "tls.crt", out / "tls.key")
    existing = [p for p in (paths.ca_cert, paths.ca_key, paths.cert, paths.key) if p.exists()]
    if existing and not force:
        shown = ", ".join(str(p) for p in existing)
        raise UserError(f"{shown} already exist; use --force to replace them")
    out.mkdir(parents=True, exist_ok=True)

    now = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=5)
    until = now + datetime.timedelta(days=days)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "spotguard webhook CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(until)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(signs_certificates=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, (names or [str(addresses[0])])[0][:64])])
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in names]
    sans += [x509.IPAddress(a) for a in addresses]
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(until)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(signs_certificates=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    _write(paths.ca_key, _key_pem(ca_key), private=True)
    _write(paths.ca_cert, ca_cert.public_bytes(serialization.Encoding.PEM))
    _write(paths.key, _key_pem(key), private=True)
    _write(paths.cert, cert.public_bytes(serialization.Encoding.PEM))
    return paths


def _key_usage(*, signs_certificates: bool) -> x509.KeyUsage:
    """ECDSA signing; a CA also signs certificates and revocation lists."""
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=signs_certificates,
        crl_sign=signs_certificates,
        encipher_only=False,
        decipher_only=False,
    )


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    try:
        return ipaddress.ip_address(text.strip())
    except ValueError:
        raise UserError(f"--ip {text!r} is not an IP address") from None


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _write(path: Path, data: bytes, private: bool = False) -> None:
    """Write via a temporary file and rename, so a failure never leaves half a key."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    os.replace(tmp, path)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, help="directory to write ca.crt, ca.key, tls.crt, tls.key into")
    parser.add_argument(
        "--dns-name",
        action="append",
        default=[],
        metavar="NAME",
        help="a DNS name of the webhook (repeatable), e.g. spotguard-admission.spotguard.svc",
    )
    parser.add_argument("--ip", action="append", default=[], metavar="ADDR", help="an IP address (repeatable)")
    parser.add_argument("--days", type=int, default=DEFAULT_DAYS, help=f"validity in days (default {DEFAULT_DAYS})")
    parser.add_argument("--force", action="store_true", help="replace existing files")


def run(args: argparse.Namespace) -> int:
    paths = make(args.out, _flat(args.dns_name), _flat(args.ip), days=args.days, force=args.force)
    print(
        f"wrote {paths.ca_cert}, {paths.ca_key}, {paths.cert}, {paths.key}; caBundle on stdout",
        file=sys.stderr,
    )
    print(paths.ca_bundle)
    return 0


def _flat(values: Iterable[str]) -> list[str]:
    """Accept ``--dns-name a --dns-name b`` and ``--dns-name a,b``."""
    return [part.strip() for value in values for part in value.split(",") if part.strip()]
