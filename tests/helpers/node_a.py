"""A nats-server whose users are the admin and node `gpu-node-a`'s agent, as the bus tests of
the agents' rights run it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from launch.access import AGENT_GRANTS
from nodeward.bus import Bus
from nodeward.bus.server import EmbeddedNats
from nodeward.config import BusSettings
from nodeward.nats_auth import NatsUser, admin, agent_inbox, node_agent, render_authorization

NODE_A = "gpu-node-a"


def auth_conf(tmp: Path, *more: NatsUser) -> Path:
    """auth.conf with the admin (password `admin-pw`), node A's agent (`a-pw`) and `more`."""
    conf = tmp / "auth.conf"
    users = [admin("admin-pw"), node_agent(NODE_A, "a-pw", AGENT_GRANTS), *more]
    conf.write_text(render_authorization(users))
    return conf


async def admin_bus(server: EmbeddedNats) -> Bus:
    """The admin on the bus (it provisions the streams)."""
    url = server.url.replace("nats://", "nats://nodeward-admin:admin-pw@")
    return await Bus.connect(BusSettings(url=url), source="test/admin")


def agent_a(url: str, **more: Any) -> BusSettings:
    """Node A's agent's bus settings (`more`: its publish timeout, retries...)."""
    return BusSettings(
        url=url,
        user=f"agent-{NODE_A}",
        password="a-pw",
        inbox_prefix=agent_inbox(NODE_A),
        provision=False,
        **more,
    )
