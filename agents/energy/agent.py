"""The energy agent: a node's power sources sampled, integrated and published with CO2e.

Every `sample_every` each source (IPMI, RAPL, NVML, a simulation) is read on its own
`Lane`; the tick waits at most `read_timeout` for it, and a read still running then goes
on (its samples, stamped when read, are integrated at a later tick). A source that raises
`SourceError`, fails otherwise or hangs past its own deadline is listed in the interval's
`degraded` with the reason, logged once when it fails or its reason changes and once when
it recovers. Readings further apart than `max_gap` are not integrated: an interval's
`energy_j` covers `covered_s` of it, and is null (unknown, not zero) when nothing was read. Every `interval` the agent
publishes `energy.node.v1` (readings per source and component, the node's energy and
power, carbon intensity and CO2e, cumulative totals kept in KV `<bucket>/node.<node>` so
they survive restarts) and one `energy.pod.v1` per pod that used energy (with the mean
utilisation of the GPUs it held, where `gpu_util` reads it each tick), and sends a
`notify.v1` on topic `power-limit` when a power cap is crossed or clears. Every
`cpufreq.every` it checks the CPUs' governor and frequency spread (`tuning.py`) and
publishes a `node.finding.v1` when the result changes (and the first one). It publishes
only `energy.node.<node>`, `energy.pod.<node>.>`, `node.finding.<node>.>` and
`notify.*.power-limit`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from prometheus_client import CollectorRegistry

from agents.energy.account import Accumulator, CarbonProvider, IntervalEnergy
from agents.energy.caps import TOPIC, CapWatch, cap_notice, cap_watches
from agents.energy.pods import CpuTime, CpuTimes, GpuBusy, NodePods, StaticPodList, attribute
from agents.energy.settings import EnergySettings
from agents.energy.tuning import judge, sample
from agents.sources.activity import DeviceUtilization, GpuUtilization
from agents.sources.carbon import co2e_grams
from agents.sources.cgroups import CgroupCpu
from agents.sources.pods import PodSource, StaticPods
from agents.sources.power import PowerReader, PowerSample, SourceError
from nodeward.aio import within
from nodeward.bus import Bus
from nodeward.bus.clock import ClockProbe
from nodeward.bus.kv import TypedKV
from nodeward.bus.outbox import Outbox
from nodeward.daemon import Daemon
from nodeward.logs import get_logger
from nodeward.metrics import Declare
from nodeward.watchdog import CallTimeout, Lane, LaneBusy
from schemas.base import Event, make_event
from schemas.energy import CarbonIntensity, EnergyNode, EnergyPod, Interval, PowerSource
from schemas.node import FindingState, NodeFinding
from schemas.state.energy import EnergyTotals, totals_key
from schemas.tokens import subject

MAX_UNSENT = 1_000
PROBE_TIMEOUT_S = 60.0  # finding what a source offers (an IPMI SDR walk) may take a while


def node_name(settings: EnergySettings) -> str:
    return settings.node or os.environ.get("NODE_NAME") or socket.gethostname()


class _Metrics:
    def __init__(self, registry: CollectorRegistry, sources: Sequence[str]) -> None:
        """`sources`: the power sources read, each one's failures counted from 0."""
        m = Declare(registry)
        self.power = m.gauge("nodeward_node_power_watts", "Node mean power over the last interval")
        self.energy = m.counter(
            "nodeward_energy_joules",
            "Energy measured, per source (source=node: the whole node)",
            "source",
        )
        self.co2e = m.counter("nodeward_co2e_grams", "CO2e of the node's energy")
        self.pod_energy = m.counter(
            "nodeward_pod_energy_joules",
            "Energy attributed to a pod (CPU share estimated)",
            "namespace",
            "pod",
        )
        self.pod_co2e = m.counter(
            "nodeward_pod_co2e_grams", "CO2e attributed to a pod", "namespace", "pod"
        )
        self.degraded = m.counter(
            "nodeward_energy_source_failures",
            "Failed or hung source reads",
            "source",
            known={"source": sources},
        )
        self.rack = m.gauge(
            "nodeward_node_rack_info", "1, with the node's rack (empty when unknown)", "rack"
        )
        self.cap = m.gauge(
            "nodeward_power_cap_watts", "The power cap this node is held to, per scope", "scope"
        )


def _samples(name: str, got: object) -> list[PowerSample]:
    """`got` if it is a list of samples; else the source is misbehaving."""
    if not isinstance(got, list) or not all(isinstance(x, PowerSample) for x in got):
        raise SourceError(f"{name}: read returned {type(got).__name__}, not power samples")
    return got


def _cumulative(totals: EnergyTotals | None) -> dict[str, float]:
    """`energy.node.v1`'s running totals: `totals` (none while KV was not read)."""
    if totals is None:
        return {}
    return {
        "energy_total_j": totals.energy_j,
        "co2e_total_g": totals.co2e_g,
        "uncovered_total_s": totals.uncovered_s,
    }


class EnergyAgent:
    """Samples `sources` and publishes one node's energy; see the module docstring."""

    def __init__(
        self,
        bus: Bus,
        settings: EnergySettings,
        sources: Sequence[PowerReader],
        carbon: CarbonProvider,
        *,
        node: str | None = None,
        registry: CollectorRegistry | None = None,
        gpu_pods: PodSource | None = None,
        node_pods: NodePods | None = None,
        gpu_devices: Mapping[str, Sequence[str]] | None = None,
        rack: str | None = None,
        cpu: CpuTime | None = None,
        gpu_util: GpuUtilization | None = None,
    ) -> None:
        """`cpu`: the node's and its pods' CPU time (default: the cgroup tree at
        `cgroup_root`); `gpu_util`: each GPU's utilisation, read every tick (default: none,
        and pods' `gpu_utilization_pct` is null)."""
        self.bus = bus
        self.settings = settings
        self.sources = list(sources)
        self.carbon = carbon
        self.node = node or node_name(settings)
        self.source = f"agent/energy/{self.node}"
        self.gpu_pods: PodSource = gpu_pods or StaticPods()
        self.node_pods: NodePods = node_pods or StaticPodList()
        self.gpu_devices = dict(gpu_devices or {})
        self.cpu: CpuTime = cpu or CgroupCpu(settings.cgroup_root)
        self.gpu_util = gpu_util
        self.caps: list[CapWatch] = cap_watches(
            settings.caps, self.node, rack or settings.caps.rack
        )
        self.metrics = _Metrics(registry or CollectorRegistry(), [s.name for s in self.sources])
        self.metrics.rack.labels(rack or settings.caps.rack or "").set(1)
        for watch in self.caps:
            self.metrics.cap.labels(watch.scope).set(watch.cap.watts)
        self.log: Any = get_logger(agent="energy", node=self.node)
        self.ready = False
        self.totals: EnergyTotals | None = None  # None until read from KV
        self._lanes = {s.name: Lane(f"{self.node}/energy/{s.name}") for s in self.sources}
        self._acc = Accumulator(max_gap_s=settings.max_gap_s())
        self._failures: dict[str, str] = {}  # this interval's, for `degraded`
        self._down: dict[str, tuple[str, float]] = {}  # source -> (why, since), until it reads
        self._reads: dict[str, asyncio.Task[list[PowerSample]]] = {}
        self._util_read: asyncio.Task[Mapping[str, DeviceUtilization]] | None = None
        self._busy = GpuBusy()
        self._read_since: dict[str, float] = {}
        self._components: dict[str, set[tuple[PowerSource, str]]] = {}  # per source
        self._cpu = CpuTimes()
        self._pod_labels: set[tuple[str, str]] = set()
        self._kv: TypedKV[EnergyTotals] | None = None
        self._outbox = Outbox(
            bus,
            owner=f"energy agent for {self.node}",
            allowed=self._may_publish,
            max_unsent=MAX_UNSENT,
        )
        self._node_subject = subject("energy.node", self.node)
        self._pod_prefix = subject("energy.pod", self.node) + "."
        self._finding_prefix = subject("node.finding", self.node) + "."
        self.finding: NodeFinding | None = None  # the last published
        self._key = totals_key(self.node)

    def attach(self, daemon: Daemon) -> None:
        """Run in `daemon`: its task, readiness check `energy`, closing the sources, and the
        clock probe (its own `energy.node` read back: this node's clock against the bus's)."""
        daemon.add_task(self.run, name="energy-agent")
        daemon.add_task(ClockProbe(self.bus, self._node_subject).run, name="clock")
        daemon.add_readiness_check("energy", lambda: self.ready)

    # -- running ----------------------------------------------------------------------

    async def run(self) -> None:
        """Sample and publish until cancelled."""
        try:
            await self._start()
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._outbox.run())
                tg.create_task(self._sample_loop())
                if self.settings.cpufreq.enabled:
                    tg.create_task(self._tuning_loop())
        finally:
            self.ready = False
            for task in self._reads.values():
                task.cancel()
            if self._util_read is not None:
                self._util_read.cancel()
            close = getattr(self.gpu_util, "close", None)  # NvmlUtilization: NVML, its lane
            if callable(close):  # on a lane of its own: a hung driver holds no shutdown
                lane = Lane(f"{self.node}/energy/gpu-utilization-close")
                with contextlib.suppress(Exception):
                    await lane.call(close, 1.0)
                lane.close()
            for s in self.sources:
                with contextlib.suppress(Exception):
                    await self._lanes[s.name].call(s.close, 1.0)
                self._lanes[s.name].close()

    async def _start(self) -> None:
        found = {}
        for s in self.sources:
            lane = self._lanes[s.name]
            probe = getattr(s, "probe", None)  # e.g. IPMI: DCMI or SDR, and the SDR walk
            try:
                if callable(probe):
                    await lane.call(probe, PROBE_TIMEOUT_S)
                found[s.name] = await lane.call(s.describe, self._read_timeout)
            except Exception as exc:  # noqa: BLE001 - a source that cannot describe itself still runs
                found[s.name] = f"unknown ({exc})"
        await self._load_totals()
        try:
            self._cpu.delta(*await self.cpu.cpu_usec())
        except Exception as exc:  # noqa: BLE001 - CPU energy waits for a reading; GPUs' goes on
            self.log.warning("CPU time not readable", error=str(exc))
        self.ready = True
        self.log.info(
            "energy agent started",
            sources=found,
            caps=[f"{c.scope} {c.name}: {c.cap.watts:g} W" for c in self.caps],
            interval_s=self.settings.interval.total_seconds(),
        )

    @property
    def _read_timeout(self) -> float:
        return self.settings.read_timeout.total_seconds()

    async def _sample_loop(self) -> None:
        loop = asyncio.get_running_loop()
        every = self.settings.sample_every.total_seconds()
        interval = self.settings.interval.total_seconds()
        # The first interval starts at the first reading, so energy / duration is the power.
        await self.sample()
        began_wall = datetime.now(UTC)
        began = next_tick = loop.time()
        while True:
            next_tick += every
            now = loop.time()
            if next_tick < now:  # a slow tick: skip the ones missed, keep the phase
                next_tick += (now - next_tick) // every * every + every
            await asyncio.sleep(next_tick - now)
            await self.sample()
            if loop.time() - began >= interval - every / 2:
                end_wall = datetime.now(UTC)
                try:
                    await self.close_interval(began_wall, end_wall, loop.time() - began)
                except Exception:  # one bad interval never stops the agent
                    self.log.exception("interval not published")
                began, began_wall = loop.time(), end_wall

    async def sample(self) -> None:
        """Start a read of every source not already reading (each on its lane), wait for
        them up to `read_timeout` (or most of a tick), and integrate what has arrived."""
        for source in self.sources:
            if source.name not in self._reads:
                self._reads[source.name] = asyncio.create_task(
                    self._read(source), name=f"energy-read-{source.name}"
                )
                self._read_since[source.name] = time.monotonic()
        if self.gpu_util is not None and self._util_read is None:
            self._util_read = asyncio.create_task(
                self.gpu_util.utilization(), name="energy-read-gpu-utilization"
            )
        budget = min(self._read_timeout, 0.8 * self.settings.sample_every.total_seconds())
        waiting: list[asyncio.Future[Any]] = [*self._reads.values()]
        if self._util_read is not None:
            waiting.append(self._util_read)
        await asyncio.wait(waiting, timeout=budget)
        samples: list[PowerSample] = []
        for name, task in list(self._reads.items()):
            if task.done():
                del self._reads[name]
                samples.extend(task.result())
        if self._util_read is not None and self._util_read.done():
            util, self._util_read = self._util_read, None
            try:
                self._busy.add(util.result())
            except Exception as exc:  # noqa: BLE001 - utilisation unknown this tick, not zero
                self.log.warning("GPU utilisation not read", error=str(exc))
        try:
            self._acc.tick(samples, now=time.monotonic())
        except Exception as exc:  # a bad sample never stops the agent
            self.log.exception("samples not integrated", error=str(exc))

    def _deadline(self, source: PowerReader) -> float:
        """How long a read may run before it is called hung: the source's own bound if it
        has one (so its own error is what is reported), at least `read_timeout`."""
        own = getattr(source, "max_read_s", None)
        return (
            max(self._read_timeout, own + 1.0)
            if isinstance(own, int | float)
            else (self._read_timeout)
        )

    async def _read(self, source: PowerReader) -> list[PowerSample]:
        """One read; never raises: a failure is recorded and is an empty list."""
        lane = self._lanes[source.name]
        try:
            got = _samples(source.name, await lane.call(source.read, self._deadline(source)))
        except SourceError as exc:
            why = str(exc)
        except (CallTimeout, LaneBusy) as exc:
            why = f"{source.name}: read hung ({exc})"
        except Exception as exc:  # noqa: BLE001 - any failure of a source is a degraded source
            why = f"{source.name}: {type(exc).__name__}: {exc}"
        else:
            self._recovered(source.name)
            self._components.setdefault(source.name, set()).update(
                (s.source, s.component) for s in got
            )
            return got
        self._failed(source.name, " ".join(why.split()))
        self._acc.interrupt(self._components.get(source.name, ()))
        return []

    def _failed(self, name: str, why: str) -> None:
        self._failures[name] = why
        self.metrics.degraded.labels(name).inc()
        previous = self._down.get(name)
        if previous is None or previous[0] != why:
            self.log.warning("energy source failed", source=name, error=why)
            self._down[name] = (why, previous[1] if previous else time.monotonic())

    def _recovered(self, name: str) -> None:
        down = self._down.pop(name, None)
        if down is not None:
            self.log.info(
                "energy source recovered",
                source=name,
                down_s=round(time.monotonic() - down[1], 1),
                was=down[0],
            )

    async def close_interval(self, start: datetime, end: datetime, duration_s: float) -> None:
        """Publish the interval that ends now: node, pods, caps; update the totals."""
        now = time.monotonic()
        measured = self._acc.close(duration_s, now=now)
        slow = self.settings.sample_every.total_seconds() * 2
        for name in self._reads:  # a read still out: the interval has nothing from it yet
            running = now - self._read_since[name]
            if name not in self._failures and running > slow:
                self._failures[name] = f"{name}: no answer yet (reading for {running:.1f}s)"
        degraded = sorted(self._failures.values())
        self._failures = {}
        carbon = await self._carbon()
        known = measured.energy_j
        co2e = co2e_grams(known, carbon.g_per_kwh) if carbon and known is not None else None
        totals = await self._add_totals(known or 0.0, co2e or 0.0, measured.uncovered_s)
        if end <= start:
            end = start + timedelta(microseconds=1)
        interval = Interval(start=start, end=end)
        data = EnergyNode(
            node=self.node,
            interval=interval,
            **measured.reported(),
            carbon=carbon,
            co2e_g=co2e,
            **_cumulative(totals),
            degraded=degraded,
        )
        self._enqueue(make_event(data, source=self.source))
        self._count(measured, co2e)
        busy = self._busy.close()
        if known is None:
            return  # nothing was read: no pod shares, and nothing to say about caps
        await self._pods(measured, known, interval, carbon, busy)
        if measured.avg_power_w is not None:
            self._check_caps(measured.avg_power_w)

    def _count(self, measured: IntervalEnergy, co2e: float | None) -> None:
        if measured.energy_j is None or measured.avg_power_w is None:
            return
        self.metrics.power.set(measured.avg_power_w)
        self.metrics.energy.labels("node").inc(measured.energy_j)
        for r in measured.readings:
            self.metrics.energy.labels(r.source.value).inc(r.energy_j)
        if co2e:
            self.metrics.co2e.inc(co2e)

    async def _carbon(self) -> CarbonIntensity | None:
        try:
            return await self.carbon.current()
        except Exception as exc:  # noqa: BLE001 - energy is published without carbon rather than not
            self.log.warning("carbon intensity unavailable", error=str(exc))
            return None

    # -- totals in KV -------------------------------------------------------------------

    async def _load_totals(self) -> None:
        try:
            if self._kv is None:
                self._kv = TypedKV(await self.bus.kv(self.settings.bucket), EnergyTotals)
            found = await self._kv.get(self._key)
        except Exception as exc:  # noqa: BLE001 - totals wait; energy is published meanwhile
            self.log.warning("energy totals not readable from KV; will retry", error=str(exc))
            return
        self.totals = found.value if found else EnergyTotals()
        self.log.info(
            "energy totals loaded", energy_j=self.totals.energy_j, co2e_g=self.totals.co2e_g
        )

    async def _add_totals(
        self, energy_j: float, co2e_g: float, uncovered_s: float
    ) -> EnergyTotals | None:
        """Add to the totals and store them; None while they could not be read (never reset)."""
        if self.totals is None:
            await self._load_totals()
            if self.totals is None:
                return None
        totals = self.totals = EnergyTotals(
            energy_j=self.totals.energy_j + energy_j,
            co2e_g=self.totals.co2e_g + co2e_g,
            uncovered_s=self.totals.uncovered_s + uncovered_s,
            updated_at=datetime.now(UTC),
        )
        try:
            assert self._kv is not None
            await self._kv.put(self._key, totals)
        except Exception as exc:  # noqa: BLE001 - kept in memory, stored with the next interval
            self.log.warning("energy totals not stored in KV", error=str(exc))
        return totals

    # -- pods ---------------------------------------------------------------------------

    async def _pods(
        self,
        measured: IntervalEnergy,
        node_energy_j: float,
        interval: Interval,
        carbon: CarbonIntensity | None,
        busy: Mapping[str, float],
    ) -> None:
        try:
            pods = await self.node_pods.pods()
        except Exception as exc:  # noqa: BLE001 - GPU energy is still attributed
            self.log.warning("node's pods unknown; CPU energy not attributed", error=str(exc))
            pods = []
        try:
            node_us, pod_us = self._cpu.delta(*await self.cpu.cpu_usec())
        except Exception as exc:  # noqa: BLE001 - GPU energy is still attributed
            self.log.warning("CPU time unknown; CPU energy not attributed", error=str(exc))
            node_us, pod_us = 0, {}
        try:
            by_device = await self.gpu_pods.pods_by_device()
            shares = attribute(
                measured.readings,
                node_energy_j,
                gpu_devices=self.gpu_devices,
                by_device=by_device,
                node_pods=pods,
                cpu_node_us=node_us,
                cpu_pod_us=pod_us,
                gpu_util=busy,
            )
        except Exception as exc:  # noqa: BLE001 - no pod events this interval; the node's went out
            self.log.warning("pod energy not attributed", error=str(exc))
            return
        present = {(r.namespace, r.name) for refs in by_device.values() for r in refs}
        present |= {(p.namespace, p.name) for p in pods}
        present |= {(s.pod.namespace, s.pod.name) for s in shares}
        for labels in self._pod_labels - present:  # the pod is gone: drop its series
            for metric in (self.metrics.pod_energy, self.metrics.pod_co2e):
                with contextlib.suppress(KeyError):
                    metric.remove(*labels)
        self._pod_labels &= present
        for share in shares:
            co2e = co2e_grams(share.energy_j, carbon.g_per_kwh) if carbon else None
            data = EnergyPod(
                namespace=share.pod.namespace,
                pod=share.pod.name,
                node=self.node,
                interval=interval,
                **share.reported(),
                carbon=carbon,
                co2e_g=co2e,
            )
            self._enqueue(make_event(data, source=self.source))
            labels = (share.pod.namespace, share.pod.name)
            self._pod_labels.add(labels)
            self.metrics.pod_energy.labels(*labels).inc(share.energy_j)
            if co2e:
                self.metrics.pod_co2e.labels(*labels).inc(co2e)

    # -- caps ---------------------------------------------------------------------------

    def _check_caps(self, power_w: float) -> None:
        for watch in self.caps:
            change = watch.check(power_w)
            if change is None:
                continue
            self.log.warning(
                "power cap " + change,
                scope=watch.scope,
                cap=watch.name,
                cap_w=watch.cap.watts,
                power_w=round(power_w, 1),
            )
            notice = cap_notice(watch, change, self.node, power_w)
            self._enqueue(make_event(notice, source=self.source))

    # -- node tuning --------------------------------------------------------------------

    async def check_tuning(self) -> NodeFinding | None:
        """Read and judge the CPUs' cpufreq once; publish the result if it changed."""
        cfg = self.settings.cpufreq
        budget = cfg.samples * cfg.sample_gap.total_seconds() + 10.0
        reads = await within(asyncio.to_thread(sample, cfg), budget)
        finding = judge(self.node, reads, cfg)
        if finding is None:
            return None
        if self.finding is None or self.finding.change_key() != finding.change_key():
            self._enqueue(make_event(finding, source=self.source))
            log = self.log.warning if finding.state == FindingState.FINDING else self.log.info
            log("node tuning " + finding.state.value, summary=finding.summary)
            self.finding = finding
        return finding

    async def _tuning_loop(self) -> None:
        failed: str | None = None
        while True:
            try:
                found = await self.check_tuning()
            except Exception as exc:  # noqa: BLE001 - a failed check never stops the agent
                if str(exc) != failed:
                    self.log.warning("cpufreq not readable", error=str(exc))
                failed = str(exc)
            else:
                failed = None
                if found is None:
                    self.log.info("no cpufreq in sysfs: tuning check off")
                    return
            await asyncio.sleep(self.settings.cpufreq.every.total_seconds())

    # -- publishing ---------------------------------------------------------------------

    def _may_publish(self, subj: str) -> bool:
        """Its node's energy, its pods' energy, and its power-limit notices."""
        notice = subj.startswith("notify.") and subj.endswith("." + TOPIC)
        return (
            subj == self._node_subject
            or subj.startswith((self._pod_prefix, self._finding_prefix))
            or notice
        )

    def _enqueue(self, event: Event[Any]) -> None:
        self._outbox.put(event)

    @property
    def published(self) -> int:
        return self._outbox.published
