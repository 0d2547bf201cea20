"""A small PKI for the TLS tests: a CA and a server and a client certificate it signed."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _issue(
    common: str,
    usage: x509.ObjectIdentifier,
    ca: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
) -> tuple[bytes, bytes]:
    """A certificate for `common` (and 127.0.0.1) signed by the CA, for `usage`."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)


@dataclass
class Pki:
    """The CA's certificate file, and the server's and client's (certificate, key) files."""

    ca: Path
    server: tuple[Path, Path]
    client: tuple[Path, Path]


def write_pki(tmp: Path, name: str) -> Pki:
    """A CA (`<name>-ca`), a server certificate and a client certificate (`<name>-server`,
    `<name>-client`, both for localhost and 127.0.0.1) as PEM files in `tmp`."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name(f"{name}-ca"))
        .issuer_name(_name(f"{name}-ca"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    (tmp / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths = {}
    for who, usage in (
        ("server", ExtendedKeyUsageOID.SERVER_AUTH),
        ("client", ExtendedKeyUsageOID.CLIENT_AUTH),
    ):
        cert, key = _issue(f"{name}-{who}", usage, ca, ca_key)
        (tmp / f"{who}.crt").write_bytes(cert)
        (tmp / f"{who}.key").write_bytes(key)
        (tmp / f"{who}.key").chmod(0o600)
        paths[who] = (tmp / f"{who}.crt", tmp / f"{who}.key")
    return Pki(tmp / "ca.crt", paths["server"], paths["client"])
