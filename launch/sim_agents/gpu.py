"""Simulated GPU agents for `nodeward up`: one agent per sim-cluster node, on a SimNvml
(NVIDIA nodes) or a SimAmdSmi through the AMD SMI backend (AMD nodes, `gpu.vendor: amd`).

Each agent runs in its own `Daemon` with its own bus connection and answers fault
injections for its node on `sim.inject.<node>`. Several run in one process. Each reads a
fake kernel log (`sim.kmsg`, a file in `/dev/kmsg`'s record format: `<state dir>/kmsg/<node>`
under `nodeward up`, else in a temp directory) as its second XID detector, so an injection can go through NVML, the kernel log, or both.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from agents.gpu.access import GRANTS
from agents.gpu.agent import GpuAgent
from agents.gpu.backends import AmdSmiBackend
from agents.gpu.settings import GpuAgentSettings
from agents.gpu.validate import Validator
from agents.sources.pods import PodSource, StaticPods
from launch.sim_agents.pods import KUBELET_VIEW, LivePods
from nodeward.config import ClusterSettings, Settings, section
from nodeward.daemon import Daemon
from nodeward.kube import Cluster
from nodeward.logs import get_logger
from nodeward.platform import UpContext
from schemas.cloudevents import DecodeError, decode
from schemas.common import PodRef
from schemas.gpu import GpuSample, GpuTelemetry
from schemas.tokens import subject, token
from sim.amdsmi import SimAmdSmi
from sim.cluster.seed import NodeSeed, PodSeed, Seed
from sim.inject import serve_injections
from sim.kmsg import SimKmsg
from sim.nvml import SimNvml

_Sim = TypeVar("_Sim", SimNvml, SimAmdSmi)
MIG_RESOURCE = "nvidia.com/mig-"
GPU_LOAD_ANNOTATION = "sim.nodeward.io/gpu"  # a pod's GPU utilisation %, e.g. '85'
ROLE_LOAD = {"training": 30.0}  # else 0: sessions at rest, free GPUs


def sim_nvml_for(node: NodeSeed) -> SimNvml:
    """The simulated driver of a seed node: its GPU model, family, count and MIG layout."""
    gpu = node.gpu
    if gpu is None:
        return SimNvml(node.name, [])
    return SimNvml.build(
        node.name,
        product=gpu.product,
        count=gpu.count,
        mig=node.mig.devices if node.mig else None,
        family=gpu.family,
    )


def sim_amdsmi_for(node: NodeSeed) -> SimAmdSmi:
    """The simulated AMD SMI of an AMD seed node: its model and GPU count."""
    gpu = node.gpu
    if gpu is None:
        return SimAmdSmi(node.name, [])
    return SimAmdSmi.build(node.name, product=gpu.product, count=gpu.count)


def is_amd(node: NodeSeed) -> bool:
    return node.gpu is not None and node.gpu.vendor == "amd"


def sim_pod_devices(
    sim: SimNvml | SimAmdSmi, pods: Sequence[PodSeed]
) -> Mapping[str, list[PodRef]]:
    """Hand the node's GPUs (or MIG instances) to its pods in order, as a device plugin would."""
    free_gpus = [g.uuid for g in sim.gpus if not getattr(g, "migs", None)]
    free_migs = [(m.profile, m.uuid) for g in sim.gpus for m in getattr(g, "migs", [])]
    out: dict[str, list[PodRef]] = {}
    for pod in pods:
        if pod.node != sim.node or pod.gpus <= 0:
            continue
        ref = PodRef(namespace=pod.namespace, name=pod.name)
        for _ in range(pod.gpus):
            if pod.gpu_resource.startswith(MIG_RESOURCE):
                profile = pod.gpu_resource.removeprefix(MIG_RESOURCE)
                match = next((m for m in free_migs if m[0] == profile), None)
                if match is None:
                    break
                free_migs.remove(match)
                out.setdefault(match[1], []).append(ref)
            elif free_gpus:
                out.setdefault(free_gpus.pop(0), []).append(ref)
    return out


def sim_workload(sim: _Sim, pods: Sequence[PodSeed]) -> _Sim:
    """Load the GPUs the way their pods use them: a pod's `sim.nodeward.io/gpu` annotation,
    else 30 % for training pods and 0 for sessions; free GPUs idle. Returns `sim`."""
    by_name = {(p.namespace, p.name): p for p in pods}
    held = sim_pod_devices(sim, pods)
    for gpu in sim.gpus:
        migs = getattr(gpu, "migs", [])
        devices = [m.uuid for m in migs] if migs else [gpu.uuid]
        loads = []
        for device in devices:
            refs = held.get(device, [])
            pod = by_name.get((refs[0].namespace, refs[0].name)) if refs else None
            load = _load_of(pod)
            loads.append(load)
            mig = next((m for m in migs if m.uuid == device), None)
            if mig is not None and isinstance(sim, SimNvml):
                sim.set_mig_load(gpu.index, mig.gpu_instance_id, load)
        if not migs:
            sim.set_load(gpu.index, loads[0])
    return sim


def _load_of(pod: PodSeed | None) -> float:
    if pod is None:
        return 0.0
    raw = pod.annotations.get(GPU_LOAD_ANNOTATION)
    try:
        return min(max(float(raw), 0.0), 100.0) if raw is not None else ROLE_LOAD.get(pod.role, 0.0)
    except ValueError:
        return ROLE_LOAD.get(pod.role, 0.0)


async def follow_telemetry(
    nc: Any, node: str, nvml: SimNvml, apply: Callable[[GpuSample], None], *, who: str
) -> Any:
    """Apply each GPU sample of the node's `gpu.telemetry` events (the sim GPU agent's) to a
    copy of its simulated GPUs (`nvml`), so other simulated agents of the node follow it."""
    log: Any = get_logger(agent=who, node=node)

    async def on_message(msg: Any) -> None:
        try:
            event = decode(msg.subject, msg.headers, msg.data)
        except DecodeError as exc:
            log.warning("telemetry not understood", error=str(exc))
            return
        if not isinstance(event.data, GpuTelemetry):
            return
        for sample in event.data.samples:
            if 0 <= sample.gpu_index < len(nvml.gpus):
                apply(sample)

    return await nc.subscribe(subject("gpu", "telemetry", node), cb=on_message)


async def build_sim_gpu_agent(
    settings: Settings,
    node: NodeSeed,
    pods: Sequence[PodSeed] = (),
    kmsg_dir: Path | None = None,
    live: ClusterSettings | None = None,
) -> tuple[Daemon, GpuAgent, SimNvml | SimAmdSmi]:
    """One simulated node's GPU agent daemon (not started), its agent and its driver.

    The streams must exist already (`nodeward up`'s own bus provisions them first). With
    `live`, a GPU's pods follow the API as the kubelet's would (`LivePods`).
    """
    from nodeward.platform import bus_daemon

    config: GpuAgentSettings = section(settings, "agents", "gpu", GpuAgentSettings)
    sim: SimNvml | SimAmdSmi
    backend: Any
    temp = None
    kmsg: SimKmsg | None = None
    if is_amd(node):
        sim = sim_workload(sim_amdsmi_for(node), pods)
        backend = AmdSmiBackend(sim, config.amd_limits())
        config = config.model_copy(update={"kernel_log": "off"})  # NVRM lines are NVIDIA's
    else:
        sim = backend = sim_workload(sim_nvml_for(node), pods)
        if kmsg_dir is None:
            kmsg_dir = temp = Path(tempfile.mkdtemp(prefix=f"nodeward-kmsg-{node.name}-"))
        kmsg_dir.mkdir(parents=True, exist_ok=True)
        kmsg = SimKmsg(kmsg_dir / node.name, sim)
        config = config.model_copy(update={"kernel_log": "kmsg", "kmsg_path": kmsg.path})
    daemon, bus = await bus_daemon(
        f"agent-gpu-{node.name}",
        settings,
        source=f"agent/gpu/{node.name}",
        provision=False,
        publishes=GRANTS.publish_for(token(node.name)),
    )
    gpu_pods: PodSource = StaticPods(sim_pod_devices(sim, pods))
    if live is not None:
        cluster = Cluster.connect(live, access=KUBELET_VIEW)
        gpu_pods = LivePods(sim_pod_devices(sim, pods), cluster, node.name)
        daemon.add_shutdown_hook(cluster.close)
    agent = GpuAgent(
        backend,
        bus,
        config,
        node=node.name,
        registry=daemon.metrics.registry,
        pods=gpu_pods,
    )
    agent.attach(daemon)
    await serve_injections(bus.nc, sim, kmsg)

    async def sim_reset(index: int, bus_id: str | None) -> None:
        sim.recover(index)  # what `nvidia-smi -r` does to the simulated GPU

    await Validator(agent, reset=sim_reset, dcgmi="").serve(bus.nc)

    async def release_hung_calls() -> None:
        sim.close()
        if temp is not None:
            shutil.rmtree(temp, ignore_errors=True)

    daemon.add_shutdown_hook(release_hung_calls)
    return daemon, agent, sim


async def build_sim_gpu_agents(
    settings: Settings,
    nodes: Sequence[NodeSeed],
    pods: Sequence[PodSeed] = (),
    kmsg_dir: Path | None = None,
    live: ClusterSettings | None = None,
) -> list[Daemon]:
    """A GPU agent daemon (not started) for every node that has GPUs."""
    daemons = []
    for node in nodes:
        if node.gpu is not None and node.gpu.count > 0:
            daemon, _, _ = await build_sim_gpu_agent(settings, node, pods, kmsg_dir, live)
            daemons.append(daemon)
    return daemons


async def build_for_up(context: UpContext, seed: Seed) -> list[Daemon]:
    """One simulated GPU agent per GPU node of the seeded sim cluster."""
    return await build_sim_gpu_agents(
        context.settings,
        seed.nodes,
        seed.pods,
        context.state_dir / "kmsg",
        live=context.settings_for("agent").cluster,
    )
