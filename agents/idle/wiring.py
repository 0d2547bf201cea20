"""`nodeward agent idle`: the idleness agent on this node's real sources.

Session pods from the API server (the agent's ServiceAccount lists its node's pods), the
GPUs they hold from the kubelet's pod-resources socket, utilisation from NVML, CPU time
from the host's cgroup tree, kernels from each notebook's Jupyter server. A node without
NVML (or without GPUs) runs without the GPU signal; every other source that fails makes
its signal unknown for that interval, never idle.
"""

from __future__ import annotations

from typing import Any

from agents.idle.access import ACCESS, GRANTS
from agents.idle.agent import IdleAgent, KubeSessionPods, node_name
from agents.idle.settings import IdleSettings
from agents.sources.activity import GpuUtilization
from agents.sources.cgroups import CgroupCpu
from agents.sources.jupyter import JupyterKernels
from agents.sources.podresources import KubeletPods
from nodeward.config import Settings, section
from nodeward.daemon import Daemon
from nodeward.kube import Cluster
from nodeward.logs import get_logger
from nodeward.nats_auth import agent_inbox
from nodeward.platform import Standalone, bus_daemon
from schemas.tokens import token


def _nvml(log: Any) -> GpuUtilization | None:
    try:
        from agents.sources.gpu_activity import NvmlUtilization
        from agents.sources.nvml_compat import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
    except Exception as exc:  # noqa: BLE001 - no driver here: sessions are judged without GPUs
        log.warning("NVML unavailable: the GPU signal is left out", error=str(exc))
        return None
    return NvmlUtilization(pynvml)


async def build_idle_agent(settings: Settings) -> Daemon:
    """The idleness agent daemon of this node (not started)."""
    config: IdleSettings = section(settings, "agents", "idle", IdleSettings)
    node = node_name(config)
    log: Any = get_logger(agent="idle", node=node)
    if settings.bus.inbox_prefix is None:
        bus_settings = settings.bus.model_copy(update={"inbox_prefix": agent_inbox(node)})
        settings = settings.model_copy(update={"bus": bus_settings})
    daemon, bus = await bus_daemon(
        f"agent-idle-{node}",
        settings,
        source=f"agent/idle/{node}",
        provision=False,
        publishes=GRANTS.publish_for(token(node)),
    )
    cluster = Cluster.connect(settings.cluster, access=ACCESS)
    pods = KubeletPods(config.pod_resources_socket)
    kernels = JupyterKernels(config.jupyter)
    agent = IdleAgent(
        bus,
        config,
        sessions=KubeSessionPods(cluster, node, config.selectors),
        kernels=kernels,
        cpu=CgroupCpu(config.cgroup_root),
        gpus=_nvml(log),
        gpu_pods=pods,
        node=node,
        registry=daemon.metrics.registry,
    )
    agent.attach(daemon)
    daemon.add_shutdown_hook(pods.close)
    daemon.add_shutdown_hook(kernels.aclose)
    daemon.add_shutdown_hook(cluster.close)
    return daemon


standalone = Standalone(build_idle_agent)
