"""A real Prometheus (Debian `prometheus`) scrapes a running daemon's /metrics."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
import pytest_asyncio
import yaml

from nodeward.bus.server import free_port
from nodeward.config import BusSettings, DaemonSettings, Settings
from nodeward.platform import bus_daemon
from tests.conftest import wait_for
from tests.helpers.net import terminate

PROMETHEUS = shutil.which("prometheus")
pytestmark = pytest.mark.skipif(
    PROMETHEUS is None, reason="Debian `prometheus` is not installed (scripts/system-deps.sh)"
)


@pytest_asyncio.fixture
async def prometheus(tmp_path: Path) -> AsyncIterator[tuple[str, Path]]:
    """Prometheus on a free port; yields its URL and the scrape file targets are written to."""
    targets = tmp_path / "targets.yml"
    targets.write_text("[]\n")
    config = tmp_path / "prometheus.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "scrape_configs": [
                    {
                        "job_name": "nodeward",
                        "scrape_interval": "1s",
                        "scrape_timeout": "1s",
                        "file_sd_configs": [{"files": [str(targets)], "refresh_interval": "1s"}],
                    }
                ],
            }
        )
    )
    port = free_port()
    proc = subprocess.Popen(
        [
            str(PROMETHEUS),
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(base_url=url, timeout=2) as http:

            async def ready() -> bool:
                if proc.poll() is not None:
                    raise AssertionError(
                        f"prometheus exited: {proc.stderr.read() if proc.stderr else ''}"
                    )
                with contextlib.suppress(httpx.HTTPError):
                    return (await http.get("/-/ready")).status_code == 200
                return False

            await wait_for(ready, timeout=30, interval=0.1, what="prometheus /-/ready")
        yield url, targets
    finally:
        await terminate(proc, 15)


async def test_prometheus_scrapes_a_daemons_bus_metric(
    prometheus: tuple[str, Path], bus_settings: BusSettings
) -> None:
    url, targets = prometheus
    settings = Settings(bus=bus_settings, daemon=DaemonSettings(port=0))
    daemon, _bus = await bus_daemon("probe", settings, source="test/prometheus")
    async with daemon:
        where = urlsplit(daemon.url).netloc
        targets.write_text(yaml.safe_dump([{"targets": [where], "labels": {"daemon": "probe"}}]))
        async with httpx.AsyncClient(base_url=url, timeout=5) as http:

            async def scraped() -> list[dict[str, object]]:
                r = await http.get(
                    "/api/v1/query", params={"query": 'nodeward_bus_connected{daemon="probe"}'}
                )
                assert r.status_code == 200, r.text
                return list(r.json()["data"]["result"])

            result = await wait_for(scraped, timeout=30, interval=0.25, what="the scraped metric")
    assert result[0]["metric"]["instance"] == where  # type: ignore[index]
    assert result[0]["value"][1] == "1"  # type: ignore[index]
