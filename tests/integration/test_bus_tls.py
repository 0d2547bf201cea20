"""TLS to NATS with a client certificate (`bus.tls_ca_file`, `tls_cert_file`,
`tls_key_file`; the chart's `bus.tls`), against a real nats-server that verifies clients."""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from nodeward.bus import BusError
from nodeward.bus.connection import connect_nats
from nodeward.bus.server import EmbeddedNats
from nodeward.config import BusSettings


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
    ca: Path
    server: tuple[Path, Path]
    client: tuple[Path, Path]


def _pki(tmp: Path) -> Pki:
    ca_key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("nats-ca"))
        .issuer_name(_name("nats-ca"))
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
        cert, key = _issue(f"nodeward-{who}", usage, ca, ca_key)
        (tmp / f"{who}.crt").write_bytes(cert)
        (tmp / f"{who}.key").write_bytes(key)
        (tmp / f"{who}.key").chmod(0o600)
        paths[who] = (tmp / f"{who}.crt", tmp / f"{who}.key")
    return Pki(tmp / "ca.crt", paths["server"], paths["client"])


@pytest.fixture
async def tls_nats(tmp_path: Path) -> AsyncIterator[tuple[EmbeddedNats, Pki]]:
    pki = _pki(tmp_path)
    conf = tmp_path / "nats.conf"
    cert, key = pki.server
    conf.write_text(
        f'tls {{ cert_file: "{cert}", key_file: "{key}", ca_file: "{pki.ca}", verify: true }}\n'
    )
    server = await EmbeddedNats(tmp_path / "nats", config_file=conf).start()
    yield server, pki
    await server.stop()


def _settings(server: EmbeddedNats, **tls: Path) -> BusSettings:
    url = server.url.replace("nats://", "tls://")
    return BusSettings(url=url, connect_timeout="3s", **tls)  # type: ignore[arg-type]


async def test_a_daemon_connects_with_its_client_certificate(
    tls_nats: tuple[EmbeddedNats, Pki],
) -> None:
    server, pki = tls_nats
    cert, key = pki.client
    settings = _settings(server, tls_ca_file=pki.ca, tls_cert_file=cert, tls_key_file=key)
    nc, _ = await connect_nats(settings, name="test", wait=False)
    try:
        await nc.flush(timeout=5)
        assert nc.is_connected
    finally:
        await nc.close()


async def test_without_a_client_certificate_the_server_refuses(
    tls_nats: tuple[EmbeddedNats, Pki],
) -> None:
    server, pki = tls_nats
    with pytest.raises(BusError, match="cannot connect to NATS"):
        nc, _ = await connect_nats(_settings(server, tls_ca_file=pki.ca), name="test", wait=False)
        await nc.close()


async def test_a_certificate_that_is_not_there_is_said_in_one_line(
    tls_nats: tuple[EmbeddedNats, Pki], tmp_path: Path
) -> None:
    server, pki = tls_nats
    missing = tmp_path / "nope.crt"
    with pytest.raises(BusError, match=f"cannot read the TLS certificate {missing}"):
        await connect_nats(
            _settings(server, tls_ca_file=pki.ca, tls_cert_file=missing), name="test", wait=False
        )
