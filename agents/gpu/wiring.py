"""`nodeward agent gpu`: the GPU agent daemon of this node, built from the config."""

from __future__ import annotations

import asyncio
from functools import partial
from typing import Any

from agents.gpu.access import GRANTS
from agents.gpu.agent import GpuAgent
from agents.gpu.backends import select
from agents.gpu.settings import GpuAgentSettings
from agents.gpu.validate import Validator
from agents.sources.podresources import KubeletPods
from nodeward.config import Settings, section
from nodeward.daemon import Daemon
from nodeward.nats_auth import agent_inbox
from nodeward.platform import Standalone, bus_daemon
from schemas.tokens import token


async def build_gpu_agent(settings: Settings, *, nvml: Any = None) -> Daemon:
    """The GPU agent daemon of this node (not started), on the real library unless `nvml`
    (a `GpuBackend`, or a pynvml-like module) is given.

    The library is `agents.gpu.backend` (`nvml`, `amdsmi`, or `auto`). The node name comes
    from `agents.gpu.node`, else `NODE_NAME` (downward API), else the host name.
    """
    config: GpuAgentSettings = section(settings, "agents", "gpu", GpuAgentSettings)
    node = config.node_name()
    if nvml is None:  # before connecting: a backend that cannot be had is a config error
        nvml = await asyncio.to_thread(
            partial(
                select, config.backend, nvml_limits=config.limits(), amd_limits=config.amd_limits()
            )
        )
    if settings.bus.inbox_prefix is None:
        # The node's NATS user may receive only on its own inbox (nodeward.nats_auth).
        bus_settings = settings.bus.model_copy(update={"inbox_prefix": agent_inbox(node)})
        settings = settings.model_copy(update={"bus": bus_settings})
    daemon, bus = await bus_daemon(
        f"agent-gpu-{node}",
        settings,
        source=f"agent/gpu/{node}",
        provision=False,
        publishes=GRANTS.publish_for(token(node)),
    )
    pods = KubeletPods(
        config.pod_resources_socket, timeout=config.pod_resources_timeout.total_seconds()
    )
    agent = GpuAgent(
        nvml,
        bus,
        config,
        node=node,
        registry=daemon.metrics.registry,
        pods=pods,
    )
    agent.attach(daemon)
    await Validator(agent).serve(bus.nc)  # services.recovery's reset and validation
    daemon.add_shutdown_hook(pods.close)
    return daemon


standalone = Standalone(build_gpu_agent)
