"""A nats-server with the chart's authorization, and the console as the chart's console user
(a reader) on it: for the tests that check what that user may read and may not write."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from launch.access import GRANTS
from nodeward.bus import Bus
from nodeward.bus.server import EmbeddedNats
from nodeward.config import BusSettings, Settings
from nodeward.nats_auth import admin, reader, render_authorization, service_inbox


@asynccontextmanager
async def console_user(tmp_path: Path, **bus: Any) -> AsyncIterator[tuple[Bus, Settings]]:
    """The server; yields an admin `Bus` (it provisions the streams) and the console's
    settings as `nodeward-console` (`bus`: more of its bus settings). The admin is closed
    on the way out."""
    conf = tmp_path / "auth.conf"
    conf.write_text(
        render_authorization([admin("admin-pw"), reader("console", "console-pw", GRANTS)])
    )
    async with EmbeddedNats(tmp_path / "nats", config_file=conf) as server:
        url = server.url.replace("nats://", "nats://nodeward-admin:admin-pw@")
        writer = await Bus.connect(BusSettings(url=url), source="test/admin")
        settings = Settings.model_validate(
            {
                "bus": {
                    "url": server.url,
                    "user": "nodeward-console",
                    "password": "console-pw",
                    "inbox_prefix": service_inbox("console"),
                    **bus,
                },
                "services": {"console": {"port": 0}},
            }
        )
        try:
            yield writer, settings
        finally:
            await writer.close(grace=1)
