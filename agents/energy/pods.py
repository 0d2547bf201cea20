"""Sharing a node's energy among its pods: GPUs by who holds them, CPU by cgroup CPU time.

GPU energy goes to the pods holding the GPU (pod-resources); a GPU held by several pods
(MIG instances, shared replicas) is split equally among them. CPU energy (RAPL package
energy, else the node's energy less its GPUs') is split by each pod's share of the node's
CPU time over the interval, as Kepler does: an estimate, and labelled so. A pod's CPU time
is `usage_usec` of `cpu.stat` in its cgroup v2 directory (`agents.sources.cgroups`).
A pod's GPU utilisation is the mean, over the interval, of the utilisation NVML reported
for each device it holds (a GPU or MIG instance; a GPU shared by pods is the whole GPU's),
weighted by its share of each GPU.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from agents.sources.activity import DeviceUtilization
from schemas.common import PodRef
from schemas.energy import EnergyReading, PowerSource

GPU_ATTRIBUTION = "gpu-exclusive"
GPU_SHARED = "gpu-equal-share"
CPU_ATTRIBUTION = "cpu-time-ratio-estimate"


class NodePods(Protocol):
    async def pods(self) -> list[PodRef]:
        """The pods on this node now, each with its UID."""
        ...


class CpuTime(Protocol):
    async def cpu_usec(self) -> tuple[int | None, Mapping[str, int]]:
        """(the node's CPU µs, each pod UID's CPU µs): counters that only grow (the node's
        None when unknown)."""
        ...


class StaticPodList:
    """A fixed list of pods (tests, the simulated nodes)."""

    def __init__(self, pods: Iterable[PodRef] = ()) -> None:
        self._pods = list(pods)

    async def pods(self) -> list[PodRef]:
        return self._pods


class KubeNodePods:
    """The node's pods from the API server (the agent's ServiceAccount may list pods)."""

    def __init__(self, cluster: Any, node: str) -> None:
        self.cluster = cluster
        self.node = node

    async def pods(self) -> list[PodRef]:
        items = await self.cluster.pods.on_node(self.node)
        out = []
        for item in items:
            meta = item.get("metadata") or {}
            if meta.get("name") and meta.get("namespace") and meta.get("uid"):
                out.append(PodRef(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"]))
        return out


# The fields of `energy.pod.v1` a `PodEnergy` fills, by their names.
_SAID = ("cpu_energy_j", "gpu_energy_j", "energy_j", "gpus", "gpu_utilization_pct", "attribution")


@dataclass
class PodEnergy:
    pod: PodRef
    cpu_energy_j: float = 0.0
    gpu_energy_j: float = 0.0
    gpus: float = 0.0
    """GPUs held (a GPU shared by k pods: 1/k each)."""
    methods: set[str] = field(default_factory=set)
    util_gpus: float = 0.0
    """GPUs held (as `gpus`) whose utilisation was read."""
    util_weighted: float = 0.0
    """Sum over those GPUs of share x mean utilisation (%)."""

    @property
    def energy_j(self) -> float:
        return self.cpu_energy_j + self.gpu_energy_j

    @property
    def gpu_utilization_pct(self) -> float | None:
        """Mean utilisation of the GPUs held whose utilisation was read; None if none was."""
        if self.util_gpus <= 0:
            return None
        return min(max(self.util_weighted / self.util_gpus, 0.0), 100.0)

    @property
    def attribution(self) -> str:
        return "+".join(sorted(self.methods))

    def reported(self) -> dict[str, Any]:
        """What `energy.pod.v1` says of the share (`_SAID`, by the same names)."""
        return {name: getattr(self, name) for name in _SAID}


@dataclass
class CpuTimes:
    """CPU time counters between intervals: the deltas of the last one."""

    last_node: int | None = None
    last_pods: dict[str, int] = field(default_factory=dict)

    def delta(self, node: int | None, pods: Mapping[str, int]) -> tuple[int, dict[str, int]]:
        """(node CPU µs, per pod CPU µs) since the last call; a pod first seen adds nothing."""
        deltas = {
            uid: max(v - self.last_pods[uid], 0) for uid, v in pods.items() if uid in self.last_pods
        }
        pod_sum = sum(deltas.values())
        if node is not None and self.last_node is not None and node >= self.last_node:
            node_delta = max(node - self.last_node, pod_sum)
        else:
            node_delta = pod_sum
        self.last_node, self.last_pods = node, dict(pods)
        return node_delta, deltas


@dataclass
class GpuBusy:
    """Each device's utilisation readings over an interval; their means at its close."""

    sums: dict[str, float] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)

    def add(self, readings: Mapping[str, DeviceUtilization]) -> None:
        """One reading of the node's devices (by every ID); unknown ones are left out."""
        for device, reading in readings.items():
            if reading.percent is None:
                continue
            self.sums[device] = self.sums.get(device, 0.0) + reading.percent
            self.counts[device] = self.counts.get(device, 0) + 1

    def close(self) -> dict[str, float]:
        """Device ID -> mean utilisation (%) since the last close; the sums restart."""
        means = {d: self.sums[d] / n for d, n in self.counts.items() if n}
        self.sums, self.counts = {}, {}
        return means


def gpu_index(component: str) -> str | None:
    """`gpu-3` -> `3`."""
    return component.removeprefix("gpu-") if component.startswith("gpu-") else None


def cpu_energy(readings: Sequence[EnergyReading], node_energy_j: float) -> float:
    """RAPL package energy if measured, else the node's energy less the GPUs'."""
    packages = [
        r.energy_j
        for r in readings
        if r.source == PowerSource.RAPL and r.component.startswith("package")
    ]
    if packages:
        return sum(packages)
    gpus = sum(r.energy_j for r in readings if gpu_index(r.component) is not None)
    return max(node_energy_j - gpus, 0.0)


def attribute(
    readings: Sequence[EnergyReading],
    node_energy_j: float,
    *,
    gpu_devices: Mapping[str, Sequence[str]],
    by_device: Mapping[str, Sequence[PodRef]],
    node_pods: Sequence[PodRef],
    cpu_node_us: int,
    cpu_pod_us: Mapping[str, int],
    gpu_util: Mapping[str, float] | None = None,
) -> list[PodEnergy]:
    """Each pod's share of the interval's energy.

    `gpu_devices`: GPU index -> the device IDs pod-resources may name it by (its UUID,
    its MIG UUIDs, the index itself). `gpu_util`: device ID -> its mean utilisation (%)
    over the interval (`GpuBusy.close`), where read.
    """
    util = gpu_util or {}
    out: dict[tuple[str, str], PodEnergy] = {}

    def entry(ref: PodRef) -> PodEnergy:
        key = (ref.namespace, ref.name)
        if key not in out:
            out[key] = PodEnergy(PodRef(namespace=ref.namespace, name=ref.name, uid=ref.uid))
        return out[key]

    for r in readings:
        index = gpu_index(r.component)
        if index is None or r.source != PowerSource.NVML:
            continue
        ids = list(gpu_devices.get(index, ())) or [index]
        holders: dict[tuple[str, str], tuple[PodRef, list[str]]] = {}
        for device in ids:
            for ref in by_device.get(device, ()):
                holders.setdefault((ref.namespace, ref.name), (ref, []))[1].append(device)
        for ref, devices in holders.values():
            share = 1 / len(holders)
            pe = entry(ref)
            pe.gpu_energy_j += r.energy_j * share
            pe.gpus += share
            pe.methods.add(GPU_ATTRIBUTION if len(holders) == 1 else GPU_SHARED)
            read = [util[d] for d in devices if d in util]
            if read:
                pe.util_gpus += share
                pe.util_weighted += share * sum(read) / len(read)
    cpu_j = cpu_energy(readings, node_energy_j)
    if cpu_node_us > 0 and cpu_j > 0:
        for ref in node_pods:
            used = cpu_pod_us.get(ref.uid or "", 0)
            if used <= 0:
                continue
            pe = entry(ref)
            pe.cpu_energy_j += cpu_j * used / cpu_node_us
            pe.methods.add(CPU_ATTRIBUTION)
    return [pe for pe in out.values() if pe.energy_j > 0]
