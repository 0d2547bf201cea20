"""The idleness agent: each session pod's GPU, CPU and kernel activity, and its idleness.

Every `gpu_sample_every` the agent reads the utilisation of the node's GPUs (and MIG
instances) and keeps each device's peak. Every `interval` it lists the node's session
pods (a label selector per kind), gives each its readings (the peak utilisation of
the GPUs it holds per pod-resources, the cores its cgroup used, and for notebooks its
Jupyter kernels) and judges it (`agents/idle/evidence.py`). It publishes one
`session.activity.v1` per session and, for a session idle on every signal for at least
`idle_after`, a `session.idle.v1` with the duration and the evidence, again every
interval while it stays idle. It publishes only `session.*.<node>.>`.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from prometheus_client import CollectorRegistry

from agents.idle.evidence import (
    Reading,
    SessionTracker,
    Verdict,
    cpu_reading,
    gpu_reading,
    kernel_reading,
)
from agents.idle.settings import IdleSettings
from agents.sources.activity import (
    CpuUsage,
    DeviceUtilization,
    GpuUtilization,
    KernelSource,
)
from agents.sources.pods import PodSource, StaticPods
from nodeward.bus import Bus
from nodeward.bus.outbox import Outbox
from nodeward.daemon import Daemon
from nodeward.kube.objects import PodView
from nodeward.logs import get_logger
from nodeward.metrics import Declare
from schemas.base import make_event
from schemas.session import ActivityState, SessionKind
from schemas.tokens import subject

MAX_UNSENT = 1_000
Obj = dict[str, Any]


def node_name(settings: IdleSettings) -> str:
    return settings.node or os.environ.get("NODE_NAME") or socket.gethostname()


@dataclass(frozen=True, kw_only=True)
class SessionPod(PodView):
    kind: SessionKind

    @property
    def key(self) -> str:
        """What the agent tracks the session by: its UID (its name when it has none)."""
        return self.uid or f"{self.namespace}/{self.name}"


class SessionPods(Protocol):
    async def sessions(self) -> list[SessionPod]:
        """The node's running session pods, each with its kind."""
        ...


class KubeSessionPods:
    """The node's running session pods from the API server, one label selector per kind."""

    def __init__(self, cluster: Any, node: str, selectors: Mapping[SessionKind, str]) -> None:
        self.cluster = cluster
        self.node = node
        self.selectors = dict(selectors)

    async def sessions(self) -> list[SessionPod]:
        out: list[SessionPod] = []
        seen: set[str] = set()
        for kind, selector in self.selectors.items():
            for pod in await self.cluster.pods.on_node(self.node, label_selector=selector):
                meta = pod.get("metadata") or {}
                key = f"{meta.get('namespace')}/{meta.get('name')}"
                if key in seen or (pod.get("status") or {}).get("phase") != "Running":
                    continue
                seen.add(key)
                out.append(SessionPod(pod, kind=kind))
        return out


class _Metrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        m = Declare(registry)
        self.sessions = m.gauge(
            "nodeward_sessions",
            "Session pods on this node by namespace and their last verdict",
            "namespace",
            "state",
        )
        self.idle_reports = m.counter(
            "nodeward_session_idle_reports", "session.idle events published"
        )
        self.source_failures = m.counter(
            "nodeward_idle_source_failures",
            "Reads of a source that failed (the signal is then unknown)",
            "source",
        )


@dataclass(frozen=True)
class _Inputs:
    """What one judgement reads once for every session."""

    now: datetime
    held: Mapping[tuple[str, str], Sequence[str]]
    peaks: Mapping[str, DeviceUtilization]
    usage: Mapping[str, int]
    cpu_error: str


@dataclass
class _CpuMark:
    usec: int
    at: float
    wall: datetime


class IdleAgent:
    """Judges one node's sessions every interval; see the module docstring."""

    def __init__(
        self,
        bus: Bus,
        settings: IdleSettings,
        *,
        sessions: SessionPods,
        kernels: KernelSource,
        cpu: CpuUsage,
        gpus: GpuUtilization | None = None,
        gpu_pods: PodSource | None = None,
        node: str | None = None,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.bus = bus
        self.settings = settings
        self.node = node or node_name(settings)
        self.source = f"agent/idle/{self.node}"
        self.sessions = sessions
        self.kernels = kernels
        self.cpu = cpu
        self.gpus = gpus
        self.gpu_pods: PodSource = gpu_pods or StaticPods()
        self.clock = clock
        self.metrics = _Metrics(registry or CollectorRegistry())
        self.log: Any = get_logger(agent="idle", node=self.node)
        self.ready = False
        self._trackers: dict[str, SessionTracker] = {}
        self._cpu_marks: dict[str, _CpuMark] = {}
        self._gpu_peak: dict[str, DeviceUtilization] = {}
        prefixes = (
            subject("session.activity", self.node) + ".",
            subject("session.idle", self.node) + ".",
        )
        self._outbox = Outbox(
            bus,
            owner=f"idle agent for {self.node}",
            allowed=lambda s: s.startswith(prefixes),
            max_unsent=MAX_UNSENT,
        )

    def attach(self, daemon: Daemon) -> None:
        daemon.add_task(self.run, name="idle-agent")
        daemon.add_readiness_check("idle", lambda: self.ready)

    # -- running ----------------------------------------------------------------------

    async def run(self) -> None:
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._outbox.run())
                tg.create_task(self._loop())
        finally:
            self.ready = False

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        every = self.settings.gpu_sample_every.total_seconds()
        interval = self.settings.interval.total_seconds()
        await self.sample_gpus()
        await self._judge_safely()  # CPU counters start here: the first CPU verdict is unknown
        self.ready = True
        self.log.info("idle agent started", interval_s=interval, selectors=self.settings.selectors)
        began = next_tick = loop.time()
        while True:
            next_tick += min(every, interval)
            now = loop.time()
            next_tick = max(next_tick, now)  # a slow tick: skip the ones missed
            await asyncio.sleep(next_tick - now)
            await self.sample_gpus()
            if loop.time() - began >= interval - every / 2:
                began = loop.time()
                await self._judge_safely()

    async def _judge_safely(self) -> None:
        try:
            await self.judge()
        except Exception:  # one bad interval never stops the agent
            self.log.exception("sessions not judged")

    async def sample_gpus(self) -> None:
        """Read the GPUs once and keep each device's peak since the last judgement."""
        if self.gpus is None:
            return
        try:
            now = await self.gpus.utilization()
        except Exception as exc:  # noqa: BLE001 - a failed read leaves the GPU signal unknown
            self.metrics.source_failures.labels("gpu").inc()
            self.log.warning("GPU utilisation not read", error=str(exc))
            return
        for device, util in now.items():
            kept = self._gpu_peak.get(device)
            if kept is None or kept.percent is None or (util.percent or 0) > kept.percent:
                self._gpu_peak[device] = util

    async def judge(self) -> list[Verdict]:
        """Judge every session once and queue its events; returns the verdicts (tests)."""
        now = self.clock()
        sessions = await self.sessions.sessions()
        held = await self._held_devices()
        usage, cpu_error = await self._cpu_usage()
        peaks, self._gpu_peak = self._gpu_peak, {}
        inputs = _Inputs(now, held, peaks, usage, cpu_error)
        verdicts: list[Verdict] = []
        counts: Counter[tuple[str, ActivityState]] = Counter()
        live = set()
        for session in sessions:
            live.add(session.key)
            readings = await self._readings(session, inputs)
            tracker = self._trackers.setdefault(session.key, SessionTracker(session.key))
            verdict = tracker.judge(readings, now)
            verdicts.append(verdict)
            counts[(session.namespace, verdict.state)] += 1
            devices = held.get((session.namespace, session.name), [])
            self._publish(session, devices, readings, verdict, now)
        for uid in set(self._trackers) - live:  # the pod is gone
            self._trackers.pop(uid, None)
            self._cpu_marks.pop(uid, None)
        # Rewritten whole, with no await between: a namespace whose sessions left leaves no
        # series behind, a scrape never sees half of it, and a namespace with sessions has
        # every state (0 included: a graph of idle sessions falls to 0, it does not stop).
        self.metrics.sessions.clear()
        for namespace in {ns for ns, _ in counts}:
            for state in ActivityState:
                self.metrics.sessions.labels(namespace, state.value).set(counts[(namespace, state)])
        return verdicts

    async def _held_devices(self) -> dict[tuple[str, str], list[str]]:
        try:
            by_device = await self.gpu_pods.pods_by_device()
        except Exception as exc:  # noqa: BLE001 - then no GPU is known to be held
            self.metrics.source_failures.labels("pod-resources").inc()
            self.log.warning("pod-resources not read", error=str(exc))
            return {}
        held: dict[tuple[str, str], list[str]] = {}
        for device, refs in by_device.items():
            for ref in refs:
                held.setdefault((ref.namespace, ref.name), []).append(device)
        return held

    async def _cpu_usage(self) -> tuple[Mapping[str, int], str]:
        try:
            return await self.cpu.usage_usec(), ""
        except Exception as exc:  # noqa: BLE001 - the CPU signal is then unknown
            self.metrics.source_failures.labels("cgroup").inc()
            return {}, f"cgroup not readable: {exc}"

    async def _readings(self, session: SessionPod, inputs: _Inputs) -> list[Reading]:
        s = self.settings
        readings: list[Reading] = []
        devices = inputs.held.get((session.namespace, session.name), ())
        utils = [
            inputs.peaks.get(d) or DeviceUtilization(d, None, f"{d}: no utilisation read")
            for d in devices
        ]
        gpu = gpu_reading(utils, s.gpu_floor_pct, s.unmeasurable_gpu)
        if gpu is not None:
            readings.append(gpu)
        readings.append(self._cpu(session.key, inputs.usage, inputs.cpu_error, inputs.now))
        if session.kind == SessionKind.NOTEBOOK:
            try:
                kernels = await self.kernels.kernels(session.pod)
            except Exception as exc:  # noqa: BLE001 - a failing source is an unknown signal
                self.metrics.source_failures.labels("jupyter").inc()
                readings.append(
                    Reading("kernel", ActivityState.UNKNOWN, f"Jupyter API: {exc}".strip())
                )
            else:
                readings.append(kernel_reading(kernels, inputs.now))
        return readings

    def _cpu(self, uid: str, usage: Mapping[str, int], error: str, wall: datetime) -> Reading:
        floor = self.settings.cpu_floor_cores
        value = usage.get(uid)
        if value is None:
            return cpu_reading(None, floor, error or "no cgroup found for the pod")
        now = time.monotonic()
        mark = self._cpu_marks.get(uid)
        self._cpu_marks[uid] = _CpuMark(value, now, wall)
        if mark is None or now <= mark.at:
            return cpu_reading(None, floor, "first CPU sample (a rate needs two)")
        cores = max(value - mark.usec, 0) / 1e6 / (now - mark.at)
        return cpu_reading(cores, floor, since=mark.wall)

    def _publish(
        self,
        session: SessionPod,
        devices: Sequence[str],
        readings: Sequence[Reading],
        verdict: Verdict,
        now: datetime,
    ) -> None:
        log = self.log.bind(namespace=session.namespace, pod=session.name)
        which: dict[str, Any] = {  # the session, as both events name it
            "namespace": session.namespace,
            "pod": session.name,
            "node": self.node,
            "kind": session.kind,
            "uid": session.uid,
        }
        activity = verdict.activity(readings, devices, now, **which)
        self._outbox.put(make_event(activity, source=self.source, time=now))
        if verdict.state != ActivityState.IDLE:
            log.debug("session judged", state=verdict.state.value, unknown=verdict.unknown)
        idle = verdict.idle(now, self.settings.idle_after, len(devices), **which)
        if idle is None:
            return
        self._outbox.put(make_event(idle, source=self.source, time=now))
        self.metrics.idle_reports.inc()
        idle_for = max((now - idle.idle_since).total_seconds(), 0.0)
        log.info("session idle", idle_for_s=round(idle_for), since=idle.idle_since.isoformat())
