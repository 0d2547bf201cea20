"""TLS to NATS with a client certificate (`bus.tls_ca_file`, `tls_cert_file`,
`tls_key_file`; the chart's `bus.tls`), against a real nats-server that verifies clients."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from nodeward.bus import BusError
from nodeward.bus.connection import connect_nats
from nodeward.bus.server import EmbeddedNats
from nodeward.config import BusSettings
from tests.helpers.pki import Pki, write_pki


@pytest.fixture
async def tls_nats(tmp_path: Path) -> AsyncIterator[tuple[EmbeddedNats, Pki]]:
    pki = write_pki(tmp_path, "nodeward")
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
