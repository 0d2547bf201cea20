"""A simulated fleet in one process: what N nodes' GPU, energy and idle agents publish, at
their rates, for a small part of their cost.

The in-process simulated agents (`launch/sim_agents/gpu.py` and its siblings) run the real
agents on a `SimNvml` each: threads, lanes and a daemon per node, which is what a few nodes
need and what hundreds cannot afford. The fleet keeps each node as a little state and
publishes, for every node, exactly the subjects its agents would, at their intervals,
spread evenly over each interval:

- `gpu.health.<node>.<gpu>` for every GPU, and every MIG instance of a MIG GPU (each its
  own unit, subject and change counter, as the GPU agent's), when the fleet starts (as an
  agent's boot does) and on every change; `gpu.xid.<node>.<gpu>` for every XID;
- `gpu.heartbeat.<node>` each `agents.gpu.heartbeat_interval`, `gpu.telemetry.<node>` each
  `telemetry_interval`;
- `energy.node.<node>` and `energy.pod.<node>.<ns>.<pod>` each `agents.energy.interval`
  (a whole GPU's pods with its energy and utilisation; no CPU share), with the node's
  totals in KV `energy`;
- `session.activity.<node>.<ns>.<pod>` for each notebook or SSH pod each
  `agents.idle.interval`, judged by the idleness agent's own code (`agents.idle.evidence`)
  on what the in-process simulated agents read: the peak load of the GPUs or MIG instances
  it holds, its `sim.nodeward.io/cpu` cores and `sim.nodeward.io/kernel` state; and
  `session.idle.<node>.<ns>.<pod>` for a session idle on every signal for `idle_after`,
  again every interval while it stays idle (a session pod without load is idle from the
  start, as the seed's are, until `--load` on its GPU makes it active).

Faults arrive by injection, as for the in-process agents: the fleet answers
`sim.inject.<node>` for each of its nodes (an XID, `fallen-off-bus`, a recovery, a load),
and with `faults_per_hour` it injects XID 79 at random nodes by itself. A fault's health
change is classified by the GPU agent's own pure code (`agents.gpu.health`), so it reads
as a real agent's. With `nkeys`, each node publishes over its own connection with its
node's nkey (its seed in `<dir>/<node>.nk`), as real nodes do where NATS authorizes.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from agents.energy.settings import EnergySettings
from agents.gpu.detectors import Incident
from agents.gpu.health import Finding, XidSeen, classify, lost_finding, xid_findings
from agents.gpu.settings import GpuAgentSettings
from agents.idle.evidence import Reading, SessionTracker, cpu_reading, gpu_reading, kernel_reading
from agents.idle.settings import IdleSettings
from agents.sources.activity import DeviceUtilization, KernelsReading
from launch.sim_agents.gpu import sim_nvml_for, sim_pod_devices, sim_workload
from launch.sim_agents.idle import KERNEL_ANNOTATION
from launch.sim_agents.pods import CPU_ANNOTATION, IDLE_CORES
from nodeward.aio import within
from nodeward.bus import Bus
from nodeward.bus.server import exit_reason
from nodeward.config import BusSettings, Settings, section
from nodeward.daemon import Daemon
from nodeward.logs import get_logger
from nodeward.nats_auth import agent_inbox
from nodeward.platform import UpContext
from schemas.base import Event, make_event, utcnow
from schemas.common import PodRef
from schemas.energy import (
    CarbonBasis,
    CarbonIntensity,
    EnergyNode,
    EnergyPod,
    EnergyReading,
    Interval,
    PowerSource,
)
from schemas.gpu import (
    GpuHealth,
    GpuHeartbeat,
    GpuSample,
    GpuState,
    GpuTelemetry,
    HealthState,
    MigInstance,
    RecommendedAction,
)
from schemas.session import KernelActivity, SessionKind
from schemas.state.energy import TOTALS, EnergyTotals
from schemas.tokens import token
from schemas.xid import XidCatalog, load_catalog
from sim.cluster.seed import NodeSeed, PodSeed, Seed
from sim.inject import InjectReply, InjectRequest, inject_subject
from sim.nvml import SimNvml

BASE_POWER_W = 650.0  # as the in-process energy agents' simulated BMC
SESSION_ROLES = {"notebook": SessionKind.NOTEBOOK, "ssh": SessionKind.SSH}
TICK_S = 0.25
"""How finely each interval's publishing is spread over the fleet."""


@dataclass
class _Mig:
    """One MIG instance of a GPU: its own health unit (subject, change counter) and load."""

    mig: MigInstance
    pods: list[PodRef]
    load: float
    sequence: int = 0
    changed_at: datetime = field(default_factory=utcnow)


@dataclass
class _Session:
    """A session pod and what the idleness agent remembers of it between intervals."""

    pod: PodSeed
    tracker: SessionTracker
    kernel: str = "idle"
    cores: float = IDLE_CORES


@dataclass
class _Gpu:
    index: int
    uuid: str
    model: str
    memory_total: int
    load: float
    idle_w: float
    max_w: float
    pods: list[PodRef]
    xids: list[XidSeen] = field(default_factory=list)
    lost: Finding | None = None
    state: HealthState = HealthState.HEALTHY
    codes: tuple[str, ...] = ()
    reasons: list[Any] = field(default_factory=list)
    action: RecommendedAction = RecommendedAction.NONE
    sequence: int = 0
    changed_at: datetime = field(default_factory=utcnow)
    migs: list[_Mig] = field(default_factory=list)

    @property
    def power_w(self) -> float:
        return self.idle_w + (self.max_w - self.idle_w) * self.load / 100


@dataclass
class _Node:
    name: str
    gpus: list[_Gpu]
    sessions: list[_Session]
    boot_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    totals: EnergyTotals = field(default_factory=EnergyTotals)
    last_energy: datetime = field(default_factory=utcnow)
    bus: Bus | None = None

    @property
    def gpu_source(self) -> str:
        return f"agent/gpu/{self.name}"


def _node(seed: NodeSeed, pods: Sequence[PodSeed], gpus: int | None) -> _Node:
    if gpus is not None and seed.gpu is not None:
        seed = seed.model_copy(
            deep=True, update={"gpu": seed.gpu.model_copy(update={"count": gpus})}
        )
    sim: SimNvml = sim_workload(sim_nvml_for(seed), pods)
    held = sim_pod_devices(sim, pods)
    out = []
    for g in sim.gpus:
        out.append(
            _Gpu(
                index=g.index,
                uuid=g.uuid,
                model=g.model.name,
                memory_total=g.model.memory_mib * 2**20,
                load=float(g.utilization_gpu),
                idle_w=g.model.idle_power_w,
                max_w=g.model.power_limit_w,
                pods=held.get(g.uuid, []),
                migs=[
                    _Mig(
                        MigInstance(
                            gpu_instance_id=m.gpu_instance_id,
                            compute_instance_id=m.compute_instance_id,
                            profile=m.profile,
                            uuid=m.uuid,
                        ),
                        pods=held.get(m.uuid, []),
                        load=m.load_pct,
                    )
                    for m in g.migs
                ],
            )
        )
    sessions = [_session(p) for p in pods if p.node == seed.name and p.role in SESSION_ROLES]
    return _Node(seed.name, out, sessions)


def _session(pod: PodSeed) -> _Session:
    """A session as the simulated idleness agents read it: its annotations' kernel and CPU."""
    try:
        cores = max(float(pod.annotations.get(CPU_ANNOTATION, IDLE_CORES)), 0.0)
    except ValueError:
        cores = IDLE_CORES
    kernel = pod.annotations.get(KERNEL_ANNOTATION, "idle")
    return _Session(pod, SessionTracker(uid=f"{pod.namespace}/{pod.name}"), kernel, cores)


class Fleet:
    """N simulated nodes' agents as one publisher; see the module docstring."""

    def __init__(
        self,
        bus: Bus,
        nodes: Sequence[NodeSeed],
        pods: Sequence[PodSeed] = (),
        *,
        gpu: GpuAgentSettings | None = None,
        energy: EnergySettings | None = None,
        idle: IdleSettings | None = None,
        gpus: int | None = None,
        faults_per_hour: float = 0.0,
        nkeys: Path | None = None,
        catalog: XidCatalog | None = None,
        rng: random.Random | None = None,
        inject_within: float = 30.0,
    ) -> None:
        self.bus = bus
        self.inject_within = inject_within
        self.gpu = gpu or GpuAgentSettings()
        self.energy = energy or EnergySettings()
        self.idle = idle or IdleSettings()
        self.faults_per_hour = faults_per_hour
        self.nkeys = nkeys
        self.catalog = catalog or load_catalog()
        self.rng = rng or random.Random()  # noqa: S311 - when faults come, not secrets
        self.nodes = {
            n.name: _node(n, pods, gpus) for n in nodes if n.gpu is not None and n.gpu.count > 0
        }
        self._by_token = {token(name): name for name in self.nodes}
        self.ready = asyncio.Event()
        self._writes: set[asyncio.Task[None]] = set()
        self.published = 0
        self.log: Any = get_logger(component="fleet", nodes=len(self.nodes))

    # -- running ------------------------------------------------------------------------

    async def run(self) -> None:
        """Connect the nodes, publish every GPU's state, then every interval until cancelled."""
        await self._connect()
        # One subscription per node, on its own connection: an unknown node has no responder.
        subs = [
            await (n.bus or self.bus).nc.subscribe(inject_subject(n.name), cb=self._on_inject)
            for n in self.nodes.values()
        ]
        try:
            await self._publish(
                [
                    e
                    for n in self.nodes.values()
                    for g in n.gpus
                    for e in self._change(n, g, previous=None)
                ]
            )
            self.ready.set()
            self.log.info("fleet started", gpus=sum(len(n.gpus) for n in self.nodes.values()))
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._spread(self.gpu.heartbeat_interval, self._heartbeat))
                tg.create_task(self._spread(self.gpu.telemetry_interval, self._telemetry))
                tg.create_task(self._spread(self.energy.interval, self._energy))
                tg.create_task(self._spread(self.idle.interval, self._sessions))
                if self.faults_per_hour > 0:
                    tg.create_task(self._storm())
        finally:
            for sub in subs:
                await sub.unsubscribe()
            for node in self.nodes.values():
                if node.bus is not None and node.bus is not self.bus:
                    await node.bus.close(grace=1)

    async def _connect(self) -> None:
        if self.nkeys is None:
            return
        for node in self.nodes.values():
            settings: BusSettings = self.bus.settings.model_copy(
                update={
                    "nkey_seed_file": self.nkeys / f"{token(node.name)}.nk",
                    "inbox_prefix": agent_inbox(node.name),
                    "provision": False,
                    "user": None,
                    "password": None,
                }
            )
            node.bus = await Bus.connect(settings, source=node.gpu_source, wait=True)

    async def _spread(self, interval: timedelta, job: Callable[[_Node], list[Event[Any]]]) -> None:
        """`job` for every node once per `interval`, a slice of the fleet each tick."""
        nodes = list(self.nodes.values())
        slots = max(1, round(interval.total_seconds() / TICK_S))
        loop = asyncio.get_running_loop()
        start = loop.time()
        tick = 0
        while True:
            tick += 1
            await asyncio.sleep(max(0.0, start + tick * TICK_S - loop.time()))
            due = [n for i, n in enumerate(nodes) if i % slots == tick % slots]
            if due:
                await self._publish([e for n in due for e in job(n)])

    async def _publish(self, events: list[Event[Any]]) -> None:
        if not events:
            return
        by_bus: dict[int, tuple[Bus, list[Event[Any]]]] = {}
        for event in events:
            node = self.nodes.get(getattr(event.data, "node", ""))
            bus = (node.bus if node else None) or self.bus
            by_bus.setdefault(id(bus), (bus, []))[1].append(event)
        try:
            await asyncio.gather(*(b.publish_many(evs) for b, evs in by_bus.values()))
            self.published += len(events)
        except Exception as exc:  # noqa: BLE001 - routine samples restate; changes say so
            self.log.warning("fleet publish failed", events=len(events), error=str(exc))

    # -- GPUs ---------------------------------------------------------------------------

    def _change(self, node: _Node, gpu: _Gpu, *, previous: HealthState | None) -> list[Event[Any]]:
        """The GPU's change, and each of its MIG instances' (the agent's units share the
        GPU's verdict, each with its own counter)."""
        gpu.sequence += 1
        gpu.changed_at = utcnow()
        units: list[tuple[MigInstance | None, list[PodRef], int, datetime]] = [
            (None, gpu.pods, gpu.sequence, gpu.changed_at)
        ]
        for m in gpu.migs:
            m.sequence += 1
            m.changed_at = gpu.changed_at
            units.append((m.mig, m.pods, m.sequence, m.changed_at))
        return [
            make_event(
                GpuHealth(
                    node=node.name,
                    gpu_index=gpu.index,
                    gpu_uuid=gpu.uuid,
                    mig=mig,
                    model=gpu.model,
                    state=gpu.state,
                    previous_state=previous,
                    reasons=list(gpu.reasons),
                    recommended_action=gpu.action,
                    pods=pods,
                    observed_at=at,
                    agent_boot_id=node.boot_id,
                    sequence=sequence,
                ),
                source=node.gpu_source,
            )
            for mig, pods, sequence, at in units
        ]

    def _evaluate(self, node: _Node, gpu: _Gpu) -> list[Event[Any]]:
        """Classify the GPU as the GPU agent does; its change, if it changed."""
        hold = self.gpu.xid_hold.total_seconds()
        now = time.monotonic()
        gpu.xids = [x for x in gpu.xids if now - x.at <= hold]
        found = xid_findings(gpu.xids, self.catalog, self.gpu.xid_window.total_seconds())
        if gpu.lost is not None:
            found.append(gpu.lost)
        verdict = classify(found)
        if verdict.state == gpu.state and verdict.codes == gpu.codes:
            return []
        previous = gpu.state
        gpu.state, gpu.codes = verdict.state, verdict.codes
        gpu.reasons, gpu.action = list(verdict.reasons), verdict.action
        return self._change(node, gpu, previous=previous)

    def _xid(
        self, node: _Node, gpu: _Gpu, xid: int, detectors: Sequence[str] = ("nvml",)
    ) -> list[Event[Any]]:
        info = self.catalog.get(xid)
        seen_at = time.monotonic()
        incident = Incident(0, gpu.index, xid, seen_at, list(detectors))
        gpu.xids.append(XidSeen(xid, seen_at, {"event_data": xid}, incident))
        record = info.seen(
            node.name,
            gpu.index,
            gpu.uuid,
            utcnow(),
            pods=gpu.pods,
            detectors=list(detectors),
            agent_boot_id=node.boot_id,
        )
        return [make_event(record, source=node.gpu_source), *self._evaluate(node, gpu)]

    def _heartbeat(self, node: _Node) -> list[Event[Any]]:
        def stated(g: _Gpu, unit: _Gpu | _Mig, mig: MigInstance | None = None) -> GpuState:
            """GPU `g` (or its MIG instance `unit`), as restated: its state since `unit`'s
            last change."""
            return GpuState(
                gpu_index=g.index,
                gpu_uuid=g.uuid,
                mig=mig,
                state=g.state,
                reasons=list(g.reasons),
                recommended_action=g.action,
                sequence=unit.sequence,
                changed_at=unit.changed_at,
            )

        gpus = [stated(g, g) for g in node.gpus]
        gpus += [stated(g, m, m.mig) for g in node.gpus for m in g.migs]
        data = GpuHeartbeat(
            node=node.name,
            gpus=gpus,
            interval_s=self.gpu.heartbeat_interval.total_seconds(),
            observed_at=utcnow(),
            agent_boot_id=node.boot_id,
        )
        return [make_event(data, source=node.gpu_source)]

    def _telemetry(self, node: _Node) -> list[Event[Any]]:
        samples = [
            GpuSample(
                gpu_index=g.index,
                gpu_uuid=g.uuid,
                utilization_gpu_pct=g.load,
                utilization_memory_pct=g.load / 2,
                memory_used_bytes=int(g.memory_total * g.load / 200),
                memory_total_bytes=g.memory_total,
                temperature_c=35 + g.load / 2,
                power_w=g.power_w,
                sm_clock_mhz=1980,
                memory_clock_mhz=2619,
            )
            for g in node.gpus
            if g.lost is None
        ]
        if not samples:
            return []
        data = GpuTelemetry(
            node=node.name,
            interval_s=self.gpu.telemetry_interval.total_seconds(),
            samples=samples,
        )
        return [make_event(data, source=node.gpu_source)]

    # -- energy and sessions ------------------------------------------------------------

    def _energy(self, node: _Node) -> list[Event[Any]]:
        end = utcnow()
        start, node.last_energy = node.last_energy, end
        seconds = max((end - start).total_seconds(), 0.001)
        gpu_w = [g.power_w for g in node.gpus]
        system_w = BASE_POWER_W + sum(gpu_w)
        g_per_kwh = self.energy.carbon.static_g_per_kwh
        carbon = (
            CarbonIntensity(
                g_per_kwh=g_per_kwh,
                zone=self.energy.carbon.zone,
                provider="static",
                basis=CarbonBasis(self.energy.carbon.static_basis),
                observed_at=end,
            )
            if g_per_kwh
            else None
        )
        energy_j = system_w * seconds
        co2e = energy_j / 3.6e6 * g_per_kwh if g_per_kwh else None
        node.totals = EnergyTotals(
            energy_j=node.totals.energy_j + energy_j,
            co2e_g=node.totals.co2e_g + (co2e or 0.0),
            updated_at=end,
        )
        readings = [
            EnergyReading(
                source=PowerSource.IPMI_SDR,
                component="system",
                energy_j=energy_j,
                avg_power_w=system_w,
            ),
            *(
                EnergyReading(
                    source=PowerSource.NVML,
                    component=f"gpu-{g.index}",
                    energy_j=w * seconds,
                    avg_power_w=w,
                )
                for g, w in zip(node.gpus, gpu_w, strict=True)
            ),
        ]
        interval = Interval(start=start, end=end)
        source = f"agent/energy/{node.name}"
        out: list[Event[Any]] = [
            make_event(
                EnergyNode(
                    node=node.name,
                    interval=interval,
                    readings=readings,
                    energy_j=energy_j,
                    avg_power_w=system_w,
                    min_power_w=system_w,
                    max_power_w=system_w,
                    covered_s=seconds,
                    carbon=carbon,
                    co2e_g=co2e,
                    energy_total_j=node.totals.energy_j,
                    co2e_total_g=node.totals.co2e_g if g_per_kwh else None,
                    uncovered_total_s=0.0,
                ),
                source=source,
            )
        ]
        held: dict[tuple[str, str], tuple[float, float, float]] = {}  # (joules, GPUs, busy)
        for g, w in zip(node.gpus, gpu_w, strict=True):
            for pod in g.pods:
                joules, gpus, busy = held.get((pod.namespace, pod.name), (0.0, 0.0, 0.0))
                share = 1 / len(g.pods)  # a GPU shared by k pods counts 1/k
                held[pod.namespace, pod.name] = (
                    joules + w * seconds * share,
                    gpus + share,
                    busy + g.load * share,  # the GPU's utilisation, as NVML reports it
                )
        for (namespace, name), (joules, gpus, busy) in held.items():
            pod_event = EnergyPod(
                namespace=namespace,
                pod=name,
                node=node.name,
                interval=interval,
                gpu_energy_j=joules,
                energy_j=joules,
                gpus=gpus,
                gpu_utilization_pct=min(max(busy / gpus, 0.0), 100.0) if gpus else None,
                attribution="gpu-exclusive",
                carbon=carbon,
            )
            out.append(make_event(pod_event, source=source))
        task = asyncio.get_running_loop().create_task(self._keep_totals(node))
        self._writes.add(task)  # held until done: a task nobody holds may be collected
        task.add_done_callback(self._writes.discard)
        return out

    async def _keep_totals(self, node: _Node) -> None:
        """The node's totals in KV, as its energy agent keeps them (its own key only)."""
        bus = node.bus or self.bus
        try:
            kv = await bus.kv(self.energy.bucket, history=1)
            await kv.put(TOTALS.key(node.name), node.totals.model_dump_json().encode())
        except Exception as exc:  # noqa: BLE001 - the next interval writes them again
            self.log.warning("energy totals not written", node=node.name, error=str(exc))

    def _sessions(self, node: _Node) -> list[Event[Any]]:
        """Each session judged as the idleness agent judges it, and published as it does."""
        now = utcnow()
        source = f"agent/idle/{node.name}"
        out: list[Event[Any]] = []
        for session in node.sessions:
            pod = session.pod
            held = [
                DeviceUtilization(device=uuid, percent=load)
                for uuid, load, pods in self._devices(node)
                if any(p.name == pod.name and p.namespace == pod.namespace for p in pods)
            ]
            readings: list[Reading] = []
            gpu = gpu_reading(held, self.idle.gpu_floor_pct, self.idle.unmeasurable_gpu)
            if gpu is not None:
                readings.append(gpu)
            readings.append(cpu_reading(session.cores, self.idle.cpu_floor_cores))
            kind = SESSION_ROLES[pod.role]
            if kind == SessionKind.NOTEBOOK:
                readings.append(kernel_reading(self._kernels(session, now), now))
            verdict = session.tracker.judge(readings, now)
            which = {"namespace": pod.namespace, "pod": pod.name, "node": node.name, "kind": kind}
            activity = verdict.activity(readings, [d.device for d in held], now, **which)
            out.append(make_event(activity, source=source, time=now))
            idle = verdict.idle(now, self.idle.idle_after, len(held), **which)
            if idle is not None:
                out.append(make_event(idle, source=source, time=now))
        return out

    @staticmethod
    def _devices(node: _Node) -> list[tuple[str, float, list[PodRef]]]:
        """Each device a pod can hold (a GPU, or each MIG instance of a MIG GPU), its load."""
        out: list[tuple[str, float, list[PodRef]]] = []
        for g in node.gpus:
            if g.migs:
                out += [(m.mig.uuid or g.uuid, m.load, m.pods) for m in g.migs]
            else:
                out.append((g.uuid, g.load, g.pods))
        return out

    @staticmethod
    def _kernels(session: _Session, now: datetime) -> KernelsReading:
        """The notebook's Jupyter kernels, as the simulated idleness agents answer."""
        if session.kernel == "unreachable":
            return KernelsReading(None, "sim: connection refused")
        busy = session.kernel == "busy"
        kernel = KernelActivity(
            id="00000000-0000-4000-8000-000000000001",
            name="python3",
            execution_state="busy" if busy else "idle",
            last_activity=now if busy else None,
            connections=1,
        )
        return KernelsReading([kernel])

    # -- faults -------------------------------------------------------------------------

    def inject(
        self, node_name: str, request: InjectRequest
    ) -> tuple[InjectReply, list[Event[Any]]]:
        """Apply one injection to a node's simulated GPU: the reply and what it publishes."""
        node = self.nodes.get(node_name)
        if node is None:
            return InjectReply(ok=False, node=node_name, error="not a node of this fleet"), []
        if not 0 <= request.gpu < len(node.gpus):
            error = f"no GPU {request.gpu} (the node has {len(node.gpus)})"
            return InjectReply(ok=False, node=node_name, gpu=request.gpu, error=error), []
        gpu = node.gpus[request.gpu]
        events: list[Event[Any]] = []
        if request.xid is not None:
            # One incident, as the real agent merges its two detectors' sightings.
            seen_by = {"nvml": ("nvml",), "kmsg": ("kmsg",), "both": ("nvml", "kmsg")}
            events = self._xid(node, gpu, request.xid, seen_by[request.via])
        elif request.fault == "fallen-off-bus":
            gpu.lost = lost_finding("nvmlDeviceGetHandleByIndex")
            events = self._evaluate(node, gpu)
        elif request.fault is not None or request.recovery_action is not None:
            what = request.describe()
            error = (
                f"{what} is not simulated by the fleet (only XIDs, fallen-off-bus, recover, load)"
            )
            return InjectReply(ok=False, node=node_name, gpu=request.gpu, error=error), []
        elif request.load is not None:
            gpu.load = request.load
            for m in gpu.migs:
                m.load = request.load
        else:
            gpu.xids.clear()
            gpu.lost = None
            events = self._evaluate(node, gpu)
        ok = InjectReply(ok=True, node=node_name, gpu=request.gpu, applied=request.describe())
        return ok, events

    async def _on_inject(self, msg: Any) -> None:
        node = self._by_token.get(msg.subject.split(".", 2)[2])
        if node is None:
            return
        try:
            request = InjectRequest.model_validate_json(msg.data)
        except ValueError as exc:
            reply = InjectReply(ok=False, node=node, error=f"bad request: {exc}")
            events: list[Event[Any]] = []
        else:
            reply, events = self.inject(node, request)
        if events:
            stored, error = await self._publish_acked(node, events)
            if error is None:
                reply = reply.model_copy(update={"stored": stored})
            else:
                reply = reply.model_copy(update={"ok": False, "error": error})
        if msg.reply:
            await msg.respond(reply.model_dump_json(exclude_none=True).encode())

    async def _publish_acked(
        self, name: str, events: list[Event[Any]]
    ) -> tuple[list[int], str | None]:
        """An injection's events sent again until acknowledged, as an agent's outbox does
        (each keeps its `Nats-Msg-Id`: stored once): their stream sequences, or why not
        within `inject_within` seconds. An injection is not answered ok unless stored."""
        node = self.nodes[name]
        bus = node.bus or self.bus
        within_s = self.inject_within
        deadline = time.monotonic() + within_s
        while True:
            try:
                acks = await bus.publish_many(events)
            except Exception as exc:  # noqa: BLE001 - a server down or electing: again
                if time.monotonic() >= deadline:
                    return [], f"not acknowledged within {within_s:g} s: {exc}"
                self.log.warning("fleet injection not acknowledged yet", node=name, error=str(exc))
                await asyncio.sleep(0.5)
                continue
            self.published += len(events)
            return [a.seq for a in acks], None

    async def _storm(self) -> None:
        """XID 79 on random healthy GPUs at `faults_per_hour` per node (a Poisson process)."""
        rate = self.faults_per_hour * len(self.nodes) / 3600
        names = list(self.nodes)
        while True:
            await asyncio.sleep(self.rng.expovariate(rate))
            node = self.nodes[self.rng.choice(names)]
            gpu = self.rng.choice(node.gpus)
            if gpu.state == HealthState.HEALTHY:
                await self._publish(self._xid(node, gpu, 79))


async def fleet_daemon(
    settings: Settings,
    nodes: Sequence[NodeSeed],
    pods: Sequence[PodSeed] = (),
    **options: Any,
) -> tuple[Daemon, Fleet]:
    """The fleet as a daemon (not started): `/readyz` once every GPU's state is out.

    `options` go to `Fleet` (`gpus`, `faults_per_hour`, `nkeys`); the agents' intervals
    come from `settings` (`agents.gpu`, `agents.energy`, `agents.idle`)."""
    from nodeward.platform import bus_daemon

    daemon, bus = await bus_daemon("fleet", settings, source="sim/fleet", provision=False)
    fleet = Fleet(
        bus,
        nodes,
        pods,
        gpu=section(settings, "agents", "gpu", GpuAgentSettings),
        energy=section(settings, "agents", "energy", EnergySettings),
        idle=section(settings, "agents", "idle", IdleSettings),
        **options,
    )
    daemon.add_task(fleet.run, name="fleet")
    daemon.add_readiness_check("fleet", fleet.ready.is_set)
    return daemon, fleet


FLEET_ABOVE = 32
"""`nodeward up` runs the in-process simulated agents for at most this many GPU nodes, and
the fleet (its own process) for more."""


async def fleet_process(context: UpContext, seed: Seed) -> list[Daemon]:
    """`nodeward sim fleet` as a child process of `up`, for `seed`'s GPU nodes, watched by a
    daemon of `up` (named `fleet`): ready once the child is, failed when the child exits
    (so `up`'s supervisor starts a new one), the child stopped with it."""
    import sys

    import httpx
    import yaml

    from nodeward.platform import bus_daemon

    settings = context.settings
    state = context.state_dir / "fleet"
    state.mkdir(parents=True, exist_ok=True)
    seed_file, config_file = state / "seed.yaml", state / "config.yaml"
    seed_file.write_text(yaml.safe_dump(seed.model_dump(mode="json", exclude_none=True)))
    # The agents' intervals as `up` has them (its demo profile or --config), no secrets.
    config_file.write_text(yaml.safe_dump({"agents": settings.agents, "log": {"level": "warning"}}))
    daemon, _ = await bus_daemon("fleet", settings, source="nodeward/up-fleet", provision=False)
    log: Any = get_logger(component="fleet")
    ready = False
    proc: asyncio.subprocess.Process | None = None

    async def run() -> None:
        nonlocal proc, ready
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "launch",
            "sim",
            "fleet",
            "--seed",
            str(seed_file),
            "--config",
            str(config_file),
            "--nats",
            settings.bus.url,
            stdout=asyncio.subprocess.PIPE,
            stderr=(state / "fleet.log").open("ab"),
            start_new_session=True,  # `up` stops it; a terminal's Ctrl-C reaches `up` alone
        )
        assert proc.stdout is not None
        line = (await proc.stdout.readline()).decode().strip()
        url = line.rsplit("; ", 1)[-1] if line.startswith("fleet:") else None
        log.info("fleet started", pid=proc.pid, line=line)
        async with httpx.AsyncClient(timeout=2) as http:
            while proc.returncode is None:
                if url is not None and not ready:
                    with contextlib.suppress(httpx.HTTPError):
                        ready = (await http.get(f"{url}/readyz")).status_code == 200
                try:
                    await within(proc.wait(), 0.25)
                except TimeoutError:
                    continue
        raise RuntimeError(f"the fleet process {exit_reason(proc.returncode)}")

    async def stop() -> None:
        if proc is not None and proc.returncode is None:
            proc.terminate()
            try:
                await within(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()

    daemon.add_task(run, name="fleet-process")
    daemon.add_readiness_check("fleet", lambda: ready)
    daemon.add_shutdown_hook(stop)
    return [daemon]
