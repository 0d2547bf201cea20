"""`nodeward agent energy`: the energy agent on this node's real sources.

IPMI (in-band, or over the LAN with `ipmi.host`), RAPL and NVML are each opened if
enabled; one that cannot be opened is logged and left out, and the agent refuses to start
only when none can. Carbon intensity comes from `carbon.provider`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import suppress
from typing import Any

from agents.energy.access import ACCESS, GRANTS
from agents.energy.account import CarbonProvider, StaticCarbon
from agents.energy.agent import EnergyAgent, node_name
from agents.energy.pods import KubeNodePods, NodePods
from agents.energy.settings import EnergySettings
from agents.sources.activity import GpuUtilization
from agents.sources.cgroups import CgroupCpu
from agents.sources.podresources import KubeletPods
from agents.sources.power import PowerReader
from nodeward.config import Settings, section
from nodeward.daemon import Daemon, DaemonError
from nodeward.logs import get_logger
from nodeward.nats_auth import agent_inbox
from nodeward.platform import Standalone
from schemas.energy import CarbonBasis
from schemas.tokens import token


def gpu_device_ids(nvml: Any) -> dict[str, list[str]]:
    """GPU index -> the IDs pod-resources may name it by: its UUID, its MIG UUIDs, the index."""
    nvml.nvmlInit()
    try:
        out: dict[str, list[str]] = {}
        for i in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            ids = [str(nvml.nvmlDeviceGetUUID(handle)), str(i)]
            with suppress(Exception):  # no MIG support: the GPU's own IDs are enough
                for m in range(nvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
                    try:
                        mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, m)
                    except Exception:  # noqa: BLE001 - NOT_FOUND past the last instance
                        break
                    ids.append(str(nvml.nvmlDeviceGetUUID(mig)))
            out[str(i)] = ids
        return out
    finally:
        with suppress(Exception):
            nvml.nvmlShutdown()


def _real_sources(settings: EnergySettings) -> tuple[list[PowerReader], list[str]]:
    """The node's sources that could be opened, and one line per source that could not."""
    # Parts A and B of issue 6: imported here so the agent imports without them.
    from agents.sources.ipmi import IpmiReader
    from agents.sources.nvml_compat import pynvml
    from agents.sources.nvml_energy import (
        NvmlEnergyReader,
    )
    from agents.sources.rapl import RaplReader

    sources: list[PowerReader] = []
    skipped: list[str] = []
    makers: list[tuple[str, bool, Any]] = [
        ("ipmi", settings.ipmi.enabled, lambda: IpmiReader(settings.ipmi)),
        ("rapl", settings.rapl.enabled, lambda: RaplReader(settings.rapl)),
        ("nvml", settings.nvml.enabled, lambda: NvmlEnergyReader(pynvml)),
    ]
    for name, enabled, make in makers:
        if not enabled:
            continue
        try:
            sources.append(make())
        except Exception as exc:  # noqa: BLE001 - a node lacks some sources; say which and why
            skipped.append(f"{name}: {' '.join(str(exc).split())}")
    return sources, skipped


async def rack_of(settings: Settings, config: EnergySettings, node: str) -> str | None:
    """The node's rack: from config, else its `rack_label` read once through the kube port."""
    caps = config.caps
    if caps.rack is not None or not caps.racks:
        return caps.rack
    from nodeward.kube import Cluster

    log: Any = get_logger(agent="energy", node=node)
    try:
        async with Cluster.connect(settings.cluster, access=ACCESS) as cluster:
            labels = (await cluster.nodes.get(node)).get("metadata", {}).get("labels") or {}
    except Exception as exc:  # noqa: BLE001 - the rack cap is skipped, the node cap still holds
        log.warning("rack unknown: node labels not readable", error=str(exc))
        return None
    rack = labels.get(caps.rack_label)
    if rack is None:
        log.warning("rack unknown: node has no rack label", label=caps.rack_label)
    return str(rack) if rack is not None else None


async def build_energy_agent(
    settings: Settings,
    *,
    sources: Sequence[PowerReader] | None = None,
    carbon: CarbonProvider | None = None,
) -> Daemon:
    """The energy agent daemon of this node (not started), on its real sources unless
    `sources` is given; carbon from `carbon.provider` unless `carbon` is given."""
    import httpx

    from nodeward.platform import bus_daemon

    config: EnergySettings = section(settings, "agents", "energy", EnergySettings)
    node = node_name(config)
    log: Any = get_logger(agent="energy", node=node)
    skipped: list[str] = []
    if sources is None:
        sources, skipped = _real_sources(config)
    for line in skipped:
        log.warning("energy source unavailable", reason=line)
    if not sources:
        raise DaemonError(f"energy agent: no power source could be opened ({'; '.join(skipped)})")
    if settings.bus.inbox_prefix is None:
        bus_settings = settings.bus.model_copy(update={"inbox_prefix": agent_inbox(node)})
        settings = settings.model_copy(update={"bus": bus_settings})
    daemon, bus = await bus_daemon(
        f"agent-energy-{node}",
        settings,
        source=f"agent/energy/{node}",
        provision=False,
        publishes=GRANTS.publish_for(token(node)),
    )
    http = httpx.AsyncClient()
    daemon.add_shutdown_hook(http.aclose)
    if carbon is None and config.carbon.provider == "static":
        c = config.carbon
        carbon = StaticCarbon(c.static_g_per_kwh, zone=c.zone, basis=CarbonBasis(c.static_basis))
    elif carbon is None:
        from agents.sources.carbon import (
            CarbonSource,
        )

        carbon = CarbonSource(config.carbon, http)
    assert carbon is not None
    pods = KubeletPods(config.pod_resources_socket)
    devices: Mapping[str, list[str]] = {}
    utilization: GpuUtilization | None = None
    if config.nvml.enabled:
        from agents.sources.gpu_activity import NvmlUtilization
        from agents.sources.nvml_compat import pynvml

        try:
            devices = gpu_device_ids(pynvml)
        except Exception as exc:  # noqa: BLE001 - GPU energy then goes to pods by index only
            log.warning("GPU UUIDs unknown", error=str(exc))
        else:  # NVML answers: the pods' GPU utilisation is read beside their energy
            utilization = NvmlUtilization(pynvml, timeout=config.read_timeout.total_seconds())
    from nodeward.kube import Cluster, KubeError

    node_pods: NodePods | None = None
    cluster: Cluster | None = None
    try:
        cluster = Cluster.connect(settings.cluster, access=ACCESS)
        node_pods = KubeNodePods(cluster, node)
    except KubeError as exc:
        log.warning("no cluster: CPU energy is not attributed to pods", error=str(exc))
    agent = EnergyAgent(
        bus,
        config,
        sources,
        carbon,
        node=node,
        registry=daemon.metrics.registry,
        gpu_pods=pods,
        node_pods=node_pods,
        gpu_devices=devices,
        rack=await rack_of(settings, config, node),
        cpu=CgroupCpu(config.cgroup_root),
        gpu_util=utilization,
    )
    agent.attach(daemon)
    daemon.add_shutdown_hook(pods.close)
    if cluster is not None:
        daemon.add_shutdown_hook(cluster.close)
    return daemon


standalone = Standalone(build_energy_agent)
