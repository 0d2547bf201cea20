"""The GPU agent: health and telemetry of one node's GPUs onto the bus.

It reads the GPUs through a backend (`agents/gpu/backends.py`): NVML for NVIDIA, AMD SMI
for AMD; what follows says NVML, and AMD SMI's calls and KFD events are treated alike.

XIDs arrive event-driven (one thread blocks in `nvmlEventSetWait`); counters are polled.
Every NVML call runs on its GPU's `Lane` with a deadline, so a hung driver call becomes
an `nvml_hang` finding for that GPU while the other GPUs carry on. The agent publishes
`gpu.health.v1` on every change of state or reasons (with `previous_state`, its boot id
and a per-GPU `sequence`), restates every GPU in one `gpu.heartbeat.v1` per heartbeat
interval (apart from the changes, so a change never queues behind heartbeats), and
publishes `gpu.telemetry.v1` at its own interval. It builds subjects from its own node
name only: the NATS user it runs as needs publish rights on `gpu.health.<node>.>`,
`gpu.xid.<node>.>`, `gpu.heartbeat.<node>` and `gpu.telemetry.<node>` and subscribe
rights on its reply inbox (`_INBOX_<node>.>` with `bus.inbox_prefix`), and nothing else
(`bus.provision: false`).

A second detector reads the kernel log (`/dev/kmsg`, or a file tail) for the driver's XID
lines, on the event loop and apart from NVML, so an XID still fails its GPU while NVML hangs.
Both detectors' sightings merge into one incident per GPU and XID (`agents.gpu.detectors`):
the first opens it (the health change, one `gpu.xid.v1`), the other confirms it (its
`detectors`).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from prometheus_client import CollectorRegistry

from agents.gpu.amd_health import EventSeen
from agents.gpu.backends import GpuBackend, NvmlBackend
from agents.gpu.detectors import KMSG, NVML, Incident, IncidentMerger
from agents.gpu.health import (
    Classification,
    Finding,
    XidSeen,
    classify,
    hang_finding,
    lost_finding,
    recovery_finding,
    xid_findings,
)
from agents.gpu.settings import GpuAgentSettings
from agents.sources.kmsg import (
    DriverLineParser,
    DriverXid,
    FileTail,
    KernelLogError,
    KmsgReader,
    open_kernel_log,
    pci_key,
)
from agents.sources.nvml import GpuIdentity, NvmlEvent
from agents.sources.nvml_compat import pynvml
from agents.sources.pods import PodSource, StaticPods
from nodeward.aio import within
from nodeward.bus import Bus
from nodeward.bus.clock import ClockProbe
from nodeward.bus.outbox import Outbox
from nodeward.daemon import Daemon
from nodeward.logs import get_logger
from nodeward.metrics import Declare
from nodeward.watchdog import CallTimeout, Lane, LaneBusy
from schemas.base import Event, make_event, utcnow
from schemas.common import PodRef
from schemas.gpu import (
    GpuHealth,
    GpuHeartbeat,
    GpuProcess,
    GpuSample,
    GpuState,
    GpuTelemetry,
    GpuXid,
    HealthState,
    MigInstance,
    RecommendedAction,
)
from schemas.tokens import subject
from schemas.xid import XidCatalog, load_catalog

_STATE_VALUE = {
    HealthState.HEALTHY: 0,
    HealthState.DEGRADED: 1,
    HealthState.FAILED: 2,
    HealthState.UNKNOWN: 3,
}
_REFRESH_EVENTS = (
    pynvml.nvmlEventTypeDoubleBitEccError
    | pynvml.nvmlEventTypeDramRetirementEvent
    | pynvml.nvmlEventTypeDramRetirementFailure
    | pynvml.nvmlEventTypeGpuRecoveryAction
)


@dataclass
class _Unit:
    """One published health record: a GPU, or one MIG instance of it."""

    uuid: str
    mig: MigInstance | None = None
    state: HealthState | None = None
    codes: tuple[str, ...] = ()
    sequence: int = 0
    changed_at: datetime | None = None
    last: Classification | None = None


@dataclass
class _Watch:
    """Everything the agent knows about one physical GPU."""

    index: int
    lane: Lane
    ident: GpuIdentity | None = None
    polled: list[Finding] = field(default_factory=list)
    lost: Finding | None = None
    hang: Finding | None = None
    kmsg_recovery: Finding | None = None
    """XID 154's recovery action as the kernel log said, while NVML does not answer."""
    xids: list[XidSeen] = field(default_factory=list)
    notices: list[EventSeen] = field(default_factory=list)
    """The backend's own events (AMD's KFD events), judged by `GpuBackend.event_findings`."""
    units: list[_Unit] = field(default_factory=list)
    poll_now: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class _XidReport:
    """An incident's first sighting, waiting to be published as `gpu.xid.v1`."""

    watch: _Watch
    xid: int
    at: datetime
    seen_at: float
    incident: Incident
    gpu_instance_id: int | None = None
    driver_message: str | None = None
    confirmed: asyncio.Event = field(default_factory=asyncio.Event)


class _Metrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        m = Declare(registry)
        self.state = m.gauge(
            "nodeward_gpu_health_state", "0 healthy, 1 degraded, 2 failed, 3 unknown", "gpu", "uuid"
        )
        self.xids = m.counter("nodeward_gpu_xid_events", "XID events seen", "gpu", "xid")
        self.hangs = m.counter(
            "nodeward_gpu_nvml_hangs", "NVML calls that missed their deadline", "gpu"
        )
        self.temperature = m.gauge("nodeward_gpu_temperature_celsius", "GPU temperature", "gpu")
        self.power = m.gauge("nodeward_gpu_power_watts", "GPU power draw", "gpu")
        self.energy = m.gauge("nodeward_gpu_energy_millijoules", "NVML energy counter", "gpu")
        self.util = m.gauge("nodeward_gpu_utilization_ratio", "GPU utilisation", "gpu")
        self.memory = m.gauge("nodeward_gpu_memory_used_bytes", "GPU memory in use", "gpu")
        self.ecc = m.gauge("nodeward_gpu_ecc_errors", "ECC error counts", "gpu", "kind")
        self.info = m.gauge(
            "nodeward_gpu_info", "1 per GPU, with its model (for joins by model)", "gpu", "model"
        )
        self.sightings = m.counter(
            "nodeward_gpu_xid_sightings",
            "XID reports per detector (an incident seen by two detectors counts twice)",
            "gpu",
            "detector",
        )
        self.unattributed = m.counter(
            "nodeward_gpu_kernel_log_unattributed",
            "driver XID lines for a PCI address no known GPU has",
        )
        self.kmsg_lost = m.counter(
            "nodeward_gpu_kernel_log_overruns",
            "times kernel-log records were overwritten before the agent read them",
        )


class GpuAgent:
    """Watches one node's GPUs through `nvml`: a `GpuBackend`, or the pynvml module or a
    SimNvml (read through an `NvmlBackend`)."""

    def __init__(
        self,
        nvml: Any,
        bus: Bus,
        settings: GpuAgentSettings,
        *,
        node: str | None = None,
        registry: CollectorRegistry | None = None,
        pods: PodSource | None = None,
        catalog: XidCatalog | None = None,
    ) -> None:
        self.bus = bus
        self.settings = settings
        self.node = node or settings.node_name()
        self.source = f"agent/gpu/{self.node}"
        self.boot_id = uuid.uuid4().hex[:12]
        self.catalog = catalog or load_catalog()
        self.limits = settings.limits()
        self.backend: GpuBackend = (
            nvml if isinstance(nvml, GpuBackend) else NvmlBackend(nvml, self.limits)
        )
        self.pods: PodSource = pods or StaticPods()
        self.metrics = _Metrics(registry or CollectorRegistry())
        self.log: Any = get_logger(agent="gpu", node=self.node, boot=self.boot_id)
        self.ready = False
        self.watches: list[_Watch] = []
        self._by_handle: dict[int, _Watch] = {}
        self._control = Lane(f"{self.node}/nvml")
        # While NATS is unreachable, state changes are kept and sent again; heartbeats and
        # telemetry are let go, as the next ones restate them.
        self._outbox = Outbox(
            bus,
            owner=f"agent for {self.node}",
            allowed=lambda s: (
                s.startswith((self._health_prefix, self._xid_prefix))
                or s in (self._telemetry_subject, self._heartbeat_subject)
            ),
            max_unsent=MAX_UNSENT,
            keep=_is_state_change,
        )
        self._pods_now: Mapping[str, list[PodRef]] = {}
        self._pods_known = False  # `_pods_now` names every GPU's pods (`PodSource.answered`)
        self._stop_events = threading.Event()
        self._event_set: Any = None
        self._event_thread: threading.Thread | None = None
        self._health_prefix = subject("gpu", "health", self.node) + "."
        self._xid_prefix = subject("gpu", "xid", self.node) + "."
        self._xids: asyncio.Queue[_XidReport] = asyncio.Queue()
        self._merger = IncidentMerger(settings.detector_window.total_seconds())
        self._pending: dict[int, _XidReport] = {}  # incident id -> its unpublished gpu.xid
        self._kernel_log: KmsgReader | FileTail | None = None
        self._driver_lines = DriverLineParser()
        self._telemetry_subject = subject("gpu", "telemetry", self.node)
        self._heartbeat_subject = subject("gpu", "heartbeat", self.node)

    def attach(self, daemon: Daemon) -> None:
        """Run in `daemon`: its task, readiness check `gpus`, shutdown, and the clock probe
        (its own heartbeat read back: this node's clock against the bus's)."""
        daemon.add_task(self.run, name="gpu-agent")
        daemon.add_task(ClockProbe(self.bus, self._heartbeat_subject).run, name="clock")
        daemon.add_readiness_check("gpus", lambda: self.ready)

    # -- running ----------------------------------------------------------------------

    @property
    def _timeout(self) -> float:
        return self.settings.call_timeout.total_seconds()

    async def run(self) -> None:
        """Discover the GPUs, then watch them until cancelled."""
        try:
            await self._start()
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._outbox.run())
                tg.create_task(self._xid_loop())
                tg.create_task(self._kernel_log_loop())
                for watch in self.watches:
                    tg.create_task(self._poll_loop(watch))
                tg.create_task(self._every(self.settings.heartbeat_interval, self._heartbeat))
                tg.create_task(self._every(self.settings.heartbeat_interval, self._refresh_pods))
                tg.create_task(self._every(self.settings.telemetry_interval, self._telemetry))
        finally:
            await self._close()

    async def _start(self) -> None:
        backend = self.backend
        init = self.settings.init_timeout.total_seconds()
        await self._control.call(backend.init, init)
        count = await self._control.call(backend.device_count, init)
        self._event_set = await self._control.call(backend.open_events, init)
        self.watches = [_Watch(i, Lane(f"{self.node}/gpu{i}")) for i in range(count)]
        await self._refresh_pods()
        await asyncio.gather(*(self._poll(w) for w in self.watches))
        loop = asyncio.get_running_loop()
        self._event_thread = threading.Thread(
            target=backend.wait_events,
            args=(
                self._event_set,
                lambda ev: loop.call_soon_threadsafe(self._on_event, ev),
                lambda err: loop.call_soon_threadsafe(self._on_event_error, err),
                self._stop_events,
            ),
            kwargs={"timeout_ms": 250},
            name=f"{backend.name}-events:{self.node}",
            daemon=True,
        )
        self._event_thread.start()
        self.ready = True
        self.log.info("gpu agent started", gpus=count, boot_id=self.boot_id, backend=backend.name)

    async def _close(self) -> None:
        self.ready = False
        self._stop_events.set()
        thread = self._event_thread
        if thread is not None:
            # The waiter wakes within its 250 ms timeout; never free a set it still waits on.
            await asyncio.to_thread(thread.join, 2.0)
        with contextlib.suppress(Exception):
            if self._event_set is not None and not (thread and thread.is_alive()):
                await self._control.call(partial(self.backend.close_events, self._event_set), 1.0)
            await self._control.call(self.backend.shutdown, 1.0)
        for lane in [self._control, *(w.lane for w in self.watches)]:
            lane.close()

    async def _every(self, interval: timedelta, job: Callable[[], Any]) -> None:
        seconds = interval.total_seconds()
        while True:
            await asyncio.sleep(seconds)
            await job()

    # -- health -------------------------------------------------------------------------

    async def _poll_loop(self, watch: _Watch) -> None:
        interval = self.settings.poll_interval.total_seconds()
        while True:
            with contextlib.suppress(TimeoutError):
                await within(watch.poll_now.wait(), interval)
            watch.poll_now.clear()
            await self._poll(watch)

    async def _poll(self, watch: _Watch) -> None:
        """One health poll of one GPU through its lane; hangs and loss become findings."""
        lane = watch.lane
        try:
            if watch.ident is None:
                ident = await lane.call(
                    partial(self.backend.identify, lane, watch.index), self._timeout
                )
                await lane.call(
                    partial(self.backend.register_events, lane, ident, self._event_set),
                    self._timeout,
                )
                self._adopt(watch, ident)
            assert watch.ident is not None
            sample = await lane.call(
                partial(self.backend.sample_health, lane, watch.ident), self._timeout
            )
        except LaneBusy:
            watch.hang = hang_finding(lane.current, lane.busy_for)
        except CallTimeout as exc:
            self.metrics.hangs.labels(str(watch.index)).inc()
            self.log.warning(
                "nvml call hung", gpu=watch.index, call=exc.what, timeout_s=exc.timeout
            )
            watch.hang = hang_finding(exc.what, exc.timeout)
        except self.backend.errors as exc:
            watch.hang = None
            if not self.backend.is_lost(exc):
                self.log.warning(
                    "nvml call failed", gpu=watch.index, call=lane.last, error=str(exc)
                )
                if watch.ident is not None:
                    return
                # Not even identified: say so rather than stay silent about this GPU.
                watch.lost = Finding(
                    "nvml_error",
                    HealthState.UNKNOWN,
                    RecommendedAction.NONE,
                    f"cannot identify the GPU: {exc}",
                    evidence={"call": lane.last},
                )
            else:
                watch.lost = lost_finding(lane.last)
        else:
            watch.hang = watch.lost = watch.kmsg_recovery = None  # the GPU answers: it says
            watch.polled = self.backend.findings(sample)
            for kind, value in sample.ecc.items():
                self.metrics.ecc.labels(str(watch.index), kind).set(value)
        self._evaluate(watch)

    def _adopt(self, watch: _Watch, ident: GpuIdentity) -> None:
        watch.ident = ident
        # The model as the node's product label spells it: joins with the capacity series.
        self.metrics.info.labels(str(watch.index), ident.product or "unknown").set(1)
        first = _Unit(ident.uuid)
        if watch.units:  # published before it could be identified: keep its state and sequence
            old = watch.units[0]
            first.state, first.codes, first.sequence = old.state, old.codes, old.sequence
            if old.uuid != ident.uuid and old.state is not None:  # its series goes with it
                with contextlib.suppress(KeyError):
                    self.metrics.state.remove(str(watch.index), old.uuid)
                self.metrics.state.labels(str(watch.index), ident.uuid).set(_STATE_VALUE[old.state])
        watch.units = [first] + [
            _Unit(
                m.uuid,
                MigInstance(
                    gpu_instance_id=m.gpu_instance_id,
                    compute_instance_id=m.compute_instance_id,
                    profile=m.profile,
                    uuid=m.uuid,
                ),
            )
            for m in ident.migs
        ]
        self._by_handle[self.backend.device_key(ident.handle)] = watch

    def _on_event(self, ev: Any) -> None:
        watch = self._by_handle.get(ev.device_key)
        if watch is None:
            self.log.warning("event for an unknown device", gpu_event=repr(ev))
            return
        if not isinstance(ev, NvmlEvent):
            self._on_notice(watch, ev)
            return
        log = self.log.bind(gpu=watch.index, event_type=hex(ev.event_type), data=ev.data)
        if ev.event_type & pynvml.nvmlEventTypeXidCriticalError:
            log.info("xid", xid=ev.data, gpu_instance=ev.gpu_instance_id)
            evidence: dict[str, Any] = {"event_data": ev.data}
            if ev.gpu_instance_id is not None:
                evidence |= {
                    "gpu_instance_id": ev.gpu_instance_id,
                    "compute_instance_id": ev.compute_instance_id,
                }
            self._on_xid(watch, ev.data, NVML, evidence, gpu_instance_id=ev.gpu_instance_id)
        if (
            ev.event_type & pynvml.nvmlEventTypeGpuRecoveryAction
            and ev.data == pynvml.NVML_GPU_RECOVERY_ACTION_NONE
        ):
            log.info("driver reports no recovery action needed: XID history cleared")
            watch.xids.clear()
        if ev.event_type & _REFRESH_EVENTS:
            watch.poll_now.set()

    def _on_notice(self, watch: _Watch, ev: Any) -> None:
        """A backend's own event (AMD: ring hang, GPU reset, thermal throttle)."""
        self.log.info("gpu event", gpu=watch.index, gpu_event=ev.event, message=ev.message)
        watch.notices.append(EventSeen(ev.event, ev.message, time.monotonic()))
        if self.backend.refresh(ev):
            watch.poll_now.set()
        self._evaluate(watch)

    def _on_xid(
        self,
        watch: _Watch,
        xid: int,
        detector: str,
        evidence: dict[str, Any],
        *,
        gpu_instance_id: int | None = None,
        driver_message: str | None = None,
    ) -> None:
        """One detector's sighting of an XID: a new incident fails/records it, a second
        detector's sighting of an open incident confirms it."""
        now = time.monotonic()
        self.metrics.sightings.labels(str(watch.index), detector).inc()
        sighting = self._merger.observe(watch.index, xid, detector, now)
        incident = sighting.incident
        if not sighting.new:
            self.log.info(
                "xid confirmed", gpu=watch.index, xid=xid, by=detector, detectors=incident.detectors
            )
            report = self._pending.get(incident.id)
            if report is not None:
                report.driver_message = report.driver_message or driver_message
                report.confirmed.set()
            for seen in watch.xids:
                if seen.incident is incident:  # the second detector's evidence joins the first's
                    for key, value in evidence.items():
                        seen.data.setdefault(key, value)
            self._evaluate(watch)  # the reasons now name both detectors
            return
        self.metrics.xids.labels(str(watch.index), str(xid)).inc()
        watch.xids.append(XidSeen(xid, now, {**evidence, "detector": detector}, incident))
        report = _XidReport(
            watch, xid, utcnow(), now, incident, gpu_instance_id, driver_message=driver_message
        )
        self._pending[incident.id] = report
        self._xids.put_nowait(report)
        if xid == 154:
            watch.poll_now.set()
        self._evaluate(watch)

    # -- the kernel log -----------------------------------------------------------------

    async def _kernel_log_loop(self) -> None:
        """Read the driver's lines from the kernel log until cancelled (never touches NVML)."""
        s = self.settings
        try:
            self._kernel_log = open_kernel_log(s.kernel_log, s.kmsg_path, s.kernel_log_file)
        except KernelLogError as exc:
            self.log.warning("kernel log not read: only NVML detects XIDs", error=str(exc))
            return
        source = self._kernel_log
        if source is None:
            return
        self.log.info("reading the kernel log", path=str(source.path), kind=type(source).__name__)
        interval = s.kernel_log_interval.total_seconds()
        lost = 0
        # /dev/kmsg polls readable when a record arrives: read then, and only then; a file
        # (a syslog tail, the simulator's kmsg) is read every `kernel_log_interval`.
        wake = asyncio.Event()
        device = source.fileno() if isinstance(source, KmsgReader) and source.is_device else None
        if device is not None:
            asyncio.get_running_loop().add_reader(device, wake.set)
        try:
            while True:
                wake.clear()
                try:
                    messages = source.messages()
                except KernelLogError as exc:
                    self.log.warning("kernel log read failed", error=str(exc))
                    messages = []
                if source.stats.lost > lost:
                    self.metrics.kmsg_lost.inc(source.stats.lost - lost)
                    self.log.warning("kernel log records overwritten before read")
                    lost = source.stats.lost
                for message in messages:
                    try:
                        for found in self._driver_lines.feed(message):
                            self._on_driver_xid(found)
                    except Exception:  # one line never stops the detector
                        self.log.exception("kernel log line not handled", line=message[:500])
                with contextlib.suppress(TimeoutError):
                    await within(wake.wait(), None if device is not None else interval)
        finally:
            if device is not None:
                asyncio.get_running_loop().remove_reader(device)
            self._kernel_log = None
            source.close()

    def _watch_at(self, found: DriverXid) -> _Watch | None:
        """The GPU a driver line names: by PCI address (NVML's bus id), else by UUID."""
        key = found.pci_key
        for watch in self.watches:
            ident = watch.ident
            if ident is None:
                continue
            if (key is not None and pci_key(ident.pci_bus_id) == key) or (
                found.uuid is not None and found.uuid == ident.uuid
            ):
                return watch
        return None

    def _on_driver_xid(self, found: DriverXid) -> None:
        watch = self._watch_at(found)
        if watch is None:
            self.metrics.unattributed.inc()
            self.log.warning(
                "driver xid for an unknown gpu", pci=found.pci, xid=found.xid, line=found.text
            )
            return
        self.log.info("xid in the kernel log", gpu=watch.index, xid=found.xid, form=found.form)
        evidence: dict[str, Any] = {"driver_message": found.text, "pci": found.pci}
        if found.gpu_instance_id is not None:
            evidence["gpu_instance_id"] = found.gpu_instance_id
        if found.compute_instance_id is not None:
            evidence["compute_instance_id"] = found.compute_instance_id
        if found.pid is not None:
            evidence["pid"] = found.pid
        if found.xid == 154 and found.recovery_action is not None:
            # The new recovery action is in the line: followed even while NVML hangs (a
            # successful poll replaces it with NVML's reading).
            watch.kmsg_recovery = recovery_finding(found.recovery_action)
            if found.recovery_action == pynvml.NVML_GPU_RECOVERY_ACTION_NONE:
                watch.xids.clear()
        self._on_xid(
            watch,
            found.xid,
            KMSG,
            evidence,
            gpu_instance_id=found.gpu_instance_id,
            driver_message=found.text,
        )

    def _on_event_error(self, error: str) -> None:
        self.log.warning("nvml event wait failed", error=error)

    def _findings(self, watch: _Watch) -> list[Finding]:
        hold = self.settings.xid_hold.total_seconds()
        now = time.monotonic()
        watch.xids = [x for x in watch.xids if now - x.at <= hold]
        watch.notices = [n for n in watch.notices if now - n.at <= hold]
        found = list(watch.polled)
        found += self.backend.event_findings(watch.notices)
        found += [f for f in (watch.lost, watch.hang) if f is not None]
        if watch.kmsg_recovery is not None and not any(f.code == "recovery_action" for f in found):
            found.append(watch.kmsg_recovery)
        found += xid_findings(watch.xids, self.catalog, self.settings.xid_window.total_seconds())
        return found

    def _evaluate(self, watch: _Watch) -> None:
        """Classify the GPU; publish a change for every unit whose state or reasons changed."""
        if not watch.units:
            watch.units = [_Unit(f"unknown-{self.node}-gpu{watch.index}")]
        verdict = classify(self._findings(watch))
        for unit in watch.units:
            unit.last = verdict
            if unit.state == verdict.state and unit.codes == verdict.codes:
                continue
            previous, unit.state, unit.codes = unit.state, verdict.state, verdict.codes
            self.metrics.state.labels(str(watch.index), unit.uuid).set(_STATE_VALUE[verdict.state])
            self.log.info(
                "gpu health changed",
                gpu=watch.index,
                mig=unit.mig.gpu_instance_id if unit.mig else None,
                state=verdict.state.value,
                previous=previous.value if previous else None,
                action=verdict.action.value,
                reasons=list(verdict.codes),
            )
            self._enqueue(self._health_event(watch, unit, previous=previous))

    def _health_event(
        self, watch: _Watch, unit: _Unit, *, previous: HealthState | None
    ) -> Event[GpuHealth]:
        verdict = unit.last
        assert verdict is not None and unit.state is not None
        unit.sequence += 1
        unit.changed_at = utcnow()
        ident = watch.ident
        data = GpuHealth(
            node=self.node,
            gpu_index=watch.index,
            gpu_uuid=ident.uuid if ident else unit.uuid,
            mig=unit.mig,
            model=ident.name if ident else None,
            pci_bus_id=ident.pci_bus_id if ident else None,
            state=unit.state,
            previous_state=previous,
            reasons=list(verdict.reasons),
            recommended_action=verdict.action,
            pods=self._pods_now.get(unit.uuid)
            or ([] if unit.mig else self._pods_now.get(str(watch.index), []))
            or (self._pods_now.get(ident.pci_bus_id or "", []) if ident and not unit.mig else []),
            holders=self._holders(watch),
            observed_at=unit.changed_at,
            agent_boot_id=self.boot_id,
            sequence=unit.sequence,
        )
        return make_event(data, source=self.source)

    def _holders(self, watch: _Watch) -> list[PodRef] | None:
        """Every pod holding any part of the physical GPU: under its UUID, index or bus ID
        (whole, or time-sliced: several pods on one ID), or one of its MIG instances'.
        None when that is not known: no full pod-resources answer, the GPU not identified."""
        ident = watch.ident
        if not self._pods_known or ident is None:
            return None
        keys = {ident.uuid, str(watch.index), *(m.uuid for m in ident.migs)}
        keys |= {u.uuid for u in watch.units} | ({ident.pci_bus_id} if ident.pci_bus_id else set())
        keys |= {k for k in self._pods_now if k.startswith(f"{watch.index}:")}  # index:MIG
        held = {(p.namespace, p.name) for key in keys for p in self._pods_now.get(key, [])}
        return [PodRef(namespace=ns, name=name) for ns, name in sorted(held)]

    async def _refresh_pods(self) -> None:
        """Apart from the heartbeat, so a slow kubelet never delays one."""
        self._pods_now = await self.pods.pods_by_device()
        self._pods_known = self.pods.answered

    async def _heartbeat(self) -> None:
        """Every GPU's state since its last change, in one `gpu.heartbeat.v1` for the node."""
        gpus = []
        for watch in self.watches:
            if watch.lane.busy and watch.hang is not None:
                watch.hang = hang_finding(watch.lane.current, watch.lane.busy_for)
            for unit in watch.units:
                if unit.state is None or unit.last is None or unit.changed_at is None:
                    continue
                gpus.append(
                    GpuState(
                        gpu_index=watch.index,
                        gpu_uuid=watch.ident.uuid if watch.ident else unit.uuid,
                        mig=unit.mig,
                        state=unit.state,
                        reasons=list(unit.last.reasons),
                        recommended_action=unit.last.action,
                        sequence=unit.sequence,
                        changed_at=unit.changed_at,
                    )
                )
        if gpus:
            data = GpuHeartbeat(
                node=self.node,
                gpus=gpus,
                interval_s=self.settings.heartbeat_interval.total_seconds(),
                observed_at=utcnow(),
                agent_boot_id=self.boot_id,
            )
            self._enqueue(make_event(data, source=self.source))

    # -- telemetry ----------------------------------------------------------------------

    async def _telemetry(self) -> None:
        async def one(watch: _Watch) -> GpuSample | None:
            ident = watch.ident
            if ident is None or watch.lane.busy:
                return None
            try:
                t = await watch.lane.call(
                    partial(self.backend.sample_telemetry, watch.lane, ident), self._timeout
                )
            except (CallTimeout, LaneBusy, *self.backend.errors):  # type: ignore[misc]
                watch.poll_now.set()  # the health poll reports what is wrong
                return None
            g = str(watch.index)
            self.metrics.util.labels(g).set(t.utilization_gpu_pct / 100)
            self.metrics.memory.labels(g).set(t.memory_used_bytes)
            if t.temperature_c is not None:
                self.metrics.temperature.labels(g).set(t.temperature_c)
            if t.power_w is not None:
                self.metrics.power.labels(g).set(t.power_w)
            if t.energy_mj is not None:
                self.metrics.energy.labels(g).set(t.energy_mj)
            return GpuSample(gpu_index=watch.index, gpu_uuid=ident.uuid, **vars(t))

        samples = [
            s for s in await asyncio.gather(*(one(w) for w in self.watches)) if s is not None
        ]
        if samples:
            data = GpuTelemetry(
                node=self.node,
                interval_s=self.settings.telemetry_interval.total_seconds(),
                samples=samples,
            )
            self._enqueue(make_event(data, source=self.source))

    # -- XIDs ---------------------------------------------------------------------------

    async def _xid_loop(self) -> None:
        """Every incident as one `gpu.xid.v1`, in the order they opened; each waits (up to
        `confirm_wait` from its first sighting) for the other detector to confirm it."""
        while True:
            report = await self._xids.get()
            try:
                await self._await_confirmation(report)
                self._enqueue(await self._xid_event(report))
            except Exception:  # one XID not published never stops the agent
                self.log.exception("xid not published", gpu=report.watch.index, xid=report.xid)
            finally:
                self._pending.pop(report.incident.id, None)

    async def _await_confirmation(self, report: _XidReport) -> None:
        detectors = {NVML} | ({KMSG} if self._kernel_log is not None else set())
        if detectors <= set(report.incident.detectors):
            return
        left = report.seen_at + self.settings.confirm_wait.total_seconds() - time.monotonic()
        if left > 0:
            with contextlib.suppress(TimeoutError):
                await within(report.confirmed.wait(), left)

    async def _xid_event(self, report: _XidReport) -> Event[GpuXid]:
        watch, at = report.watch, report.at
        info = self.catalog.get(report.xid)
        ident = watch.ident
        uuid_ = ident.uuid if ident else f"unknown-{self.node}-gpu{watch.index}"
        instance = report.gpu_instance_id
        unit = next((u for u in watch.units if u.mig and u.mig.gpu_instance_id == instance), None)
        pods = (
            (unit and self._pods_now.get(unit.uuid))
            or self._pods_now.get(uuid_)
            or (self._pods_now.get(str(watch.index), []))
        )
        data = info.seen(
            self.node,
            watch.index,
            uuid_,
            at,
            gpu_instance_id=instance,
            pods=list(pods),
            processes=await self._processes(watch, instance),
            detectors=list(report.incident.detectors),
            driver_message=report.driver_message,
            agent_boot_id=self.boot_id,
        )
        return make_event(data, source=self.source)

    async def _processes(self, watch: _Watch, instance: int | None) -> list[GpuProcess]:
        """What ran on the GPU (that MIG instance), if NVML answers at once; else nothing."""
        ident = watch.ident
        if ident is None or watch.lane.busy:
            return []
        try:
            found = await watch.lane.call(partial(self.backend.processes, ident), self._timeout)
        except (CallTimeout, LaneBusy, *self.backend.errors):  # type: ignore[misc]
            return []
        out = []
        for p in found or []:
            gi = getattr(p, "gpuInstanceId", None)
            gi = None if gi is None or gi >= 0xFFFFFFFF else int(gi)
            if instance is not None and gi is not None and gi != instance:
                continue
            used = getattr(p, "usedGpuMemory", None)
            out.append(
                GpuProcess(
                    pid=int(p.pid),
                    used_memory_bytes=int(used) if isinstance(used, int) and used >= 0 else None,
                    gpu_instance_id=gi,
                )
            )
        return out

    # -- publishing ---------------------------------------------------------------------

    def _enqueue(self, event: Event[Any]) -> None:
        self._outbox.put(event)


MAX_UNSENT = 10_000


def _is_state_change(event: Event[Any]) -> bool:
    """Kept while NATS is away: state changes and XIDs (heartbeats and telemetry restate)."""
    return isinstance(event.data, GpuXid) or (
        isinstance(event.data, GpuHealth) and not event.data.heartbeat
    )
