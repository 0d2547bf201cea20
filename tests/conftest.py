"""Shared fixtures: a real nats-server per test session (per xdist worker), helpers to wait."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from nodeward.bus import Bus
from nodeward.bus.server import EmbeddedNats
from nodeward.config import BusSettings
from nodeward.logs import configure_logging
from tests.helpers.nats_cluster import NatsCluster, start_cluster

# pytest imports readline (its capture workaround) and GNU readline exports LINES and
# COLUMNS into this process's environment, not into os.environ: every command a test runs
# would inherit COLUMNS=80 and lay its piped tables out at 80 columns. A user's pipe has no
# COLUMNS unless they set it.
for _name in ("COLUMNS", "LINES"):
    os.unsetenv(_name)

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


def pytest_configure(config: pytest.Config) -> None:
    configure_logging("info", "console")
    # A field a real API server would drop with a warning fails the test that wrote it
    # (docs/sim-cluster.md); the sims `up` and the CLI start inherit it.
    os.environ.setdefault("NODEWARD_SIM_UNKNOWN_FIELDS", "fail")
    if not hasattr(config, "workerinput"):  # once, before the workers: the sims' schemas
        from sim.cluster.decoding import Fields

        Fields.load()


@pytest.fixture(autouse=True)
def _logging_as_configured() -> Iterator[None]:
    """A test that runs the CLI in-process (which sets the log level) leaves logging as the
    suite configured it, so tests that capture info lines do not depend on test order."""
    yield
    configure_logging("info", "console")


async def wait_for(
    condition: Callable[[], Awaitable[Any] | Any],
    timeout: float = 10.0,
    interval: float = 0.02,
    what: str = "",
) -> Any:
    """Poll `condition` until it returns something truthy; fail after `timeout` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        result = condition()
        if asyncio.iscoroutine(result) or isinstance(result, asyncio.Future):
            result = await result
        if result:
            return result
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or condition}")
        await asyncio.sleep(interval)


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNats]:
    """One nats-server with JetStream for the whole session, on a random port, temp store.

    Started and stopped in short-lived loops of its own: no session-wide event loop.
    """
    server = EmbeddedNats(tmp_path_factory.mktemp("nats"))
    asyncio.run(server.start())
    yield server
    asyncio.run(server.stop())


@pytest_asyncio.fixture
async def nats_cluster(tmp_path: Path) -> AsyncIterator[NatsCluster]:
    """Three nats-servers with routes and JetStream on loopback, as the chart's NATS runs
    (streams R3 with `bus.stream_replicas: 3`); `nats_cluster.url` lists all three."""
    cluster = await start_cluster(tmp_path / "nats-cluster")
    yield cluster
    await cluster.stop()


@pytest.fixture
def nats_url(nats_server: EmbeddedNats) -> str:
    return nats_server.url


@pytest.fixture
def bus_settings(nats_url: str) -> BusSettings:
    return BusSettings(url=nats_url, publish_timeout="2s")  # type: ignore[arg-type]


@pytest_asyncio.fixture
async def bus(bus_settings: BusSettings) -> AsyncIterator[Bus]:
    b = await Bus.connect(bus_settings, source="test/bus")
    yield b
    await b.close(grace=2)


@pytest.fixture
def node() -> str:
    """A node name no other test uses, so subjects (and stream contents) don't collide."""
    return f"node-{uuid.uuid4().hex[:10]}"


@pytest_asyncio.fixture
async def own_nats(tmp_path: Path) -> AsyncIterator[EmbeddedNats]:
    """A nats-server for one test (for tests that kill or restart it)."""
    server = EmbeddedNats(tmp_path / "nats")
    await server.start()
    yield server
    await server.stop()


@pytest_asyncio.fixture
async def own_bus(own_nats: EmbeddedNats) -> AsyncIterator[Bus]:
    """A bus on a server of its own: its buckets and streams hold only this test's data."""
    b = await Bus.connect(BusSettings(url=own_nats.url), source="test/own-bus")
    yield b
    await b.close(grace=2)
