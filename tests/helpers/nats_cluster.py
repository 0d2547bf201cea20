"""Three nats-servers on loopback with routes and JetStream, as the chart's NATS runs: each
the runtime's `EmbeddedNats` with a config file naming the cluster and its routes."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from pathlib import Path

import nats
from nats.js.errors import APIError, ServiceUnavailableError

from nodeward.bus.server import EmbeddedNats, free_port


@dataclass
class NatsCluster:
    servers: list[EmbeddedNats]

    @property
    def url(self) -> str:
        """Every server's URL, comma-separated (`bus.url`): clients fail over among them."""
        return ",".join(s.url for s in self.servers)

    def named(self, name: str) -> EmbeddedNats:
        return next(s for s in self.servers if s.name == name)

    async def wait_jetstream(self, timeout: float = 60.0) -> None:
        """Until JetStream answers (a meta leader is elected: ~10 s on 2 cores)."""
        nc = await nats.connect(servers=[s.url for s in self.servers])
        try:
            async with asyncio.timeout(timeout):
                while True:
                    with contextlib.suppress(APIError, ServiceUnavailableError, TimeoutError):
                        await nc.jetstream().account_info()
                        return
                    await asyncio.sleep(0.2)
        finally:
            await nc.close()

    async def stop(self) -> None:
        await asyncio.gather(*(s.stop() for s in self.servers))


async def start_cluster(root: Path, size: int = 3) -> NatsCluster:
    """`size` servers `n1`..`nN` in `root`, routed to each other, JetStream ready."""
    root.mkdir(parents=True, exist_ok=True)
    routes = [free_port() for _ in range(size)]
    servers = []
    for i in range(size):
        name = f"n{i + 1}"
        config = root / f"{name}.conf"
        others = ", ".join(f"nats-route://127.0.0.1:{p}" for p in routes)
        config.write_text(
            f"cluster {{ name: c1, listen: 127.0.0.1:{routes[i]}, routes: [{others}] }}\n"
        )
        servers.append(EmbeddedNats(root / name, config_file=config, name=name, port=free_port()))
    cluster = NatsCluster(servers)
    try:
        await asyncio.gather(*(s.start() for s in servers))
        await cluster.wait_jetstream()
    except BaseException:
        await cluster.stop()
        raise
    return cluster
