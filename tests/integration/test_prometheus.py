"""A real Prometheus (Debian `prometheus`) scrapes a running daemon's /metrics."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
import yaml

from nodeward.config import BusSettings, DaemonSettings, Settings
from nodeward.platform import bus_daemon
from tests.conftest import wait_for
from tests.helpers.prometheus import PROMETHEUS
from tests.helpers.prometheus import prometheus as running

pytestmark = pytest.mark.skipif(
    PROMETHEUS is None, reason="Debian `prometheus` is not installed (scripts/system-deps.sh)"
)


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """Prometheus on a free port; yields its URL and the scrape file targets are written to."""
    targets = tmp_path / "targets.yml"
    targets.write_text("[]\n")
    config = {
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
    with running(tmp_path / "prometheus", config) as url:
        yield url, targets


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
