"""The console's one picture of the fleet, shared by every viewer.

Drawn as `nodeward status` draws it (`nodeward.fleet_status.read_fleet` and `assemble`,
with every registered service's view),
with the capacity snapshot and the newest audit records, Falco alerts and dead letters; but
what it reads comes from mirrors (`nodeward.bus.mirror`): one long-lived ordered consumer
per stream and bucket it reads, which hold each subject's newest message. Watched, not
polled: drawing the picture again reads memory, and no consumer is made per drawing.

A feed of core subscriptions (GPU health, the audit trail, Falco, the DLQ) brings what
viewers see at once: a GPU's health is applied to its cell; a change to a bucket or the
audit trail (a mirror tells) has the picture drawn again (settled, and never more than half
the time), and only what differs is sent to the viewers. Nothing is written anywhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import structlog
from prometheus_client import CollectorRegistry, Counter, Gauge
from pydantic import ValidationError

from nodeward.aio import within
from nodeward.bus.mirror import Mirrors, Watched
from nodeward.bus.snapshot import newest
from nodeward.fleet_status import (
    Buckets,
    FleetStatus,
    GpuSeen,
    NodeStatus,
    assemble,
    read_fleet,
    watched,
    worst,
)
from nodeward.views import View
from schemas import DecodeError, decode
from schemas.dlq import DeadLetter
from schemas.energy import EnergyPod
from schemas.falco import FalcoAlert
from schemas.gpu import GpuHealth
from schemas.remediation import Remediation
from schemas.state.capacity import SNAPSHOT, CapacitySnapshot
from services.console.settings import ConsoleSettings

Message = dict[str, Any]


@dataclass(eq=False)
class Viewer:
    """One open event stream: what is waiting to be sent to it, and whether it fell behind."""

    queue: asyncio.Queue[str]
    dropped: asyncio.Event = field(default_factory=asyncio.Event)


def marks_of(node: NodeStatus) -> list[str]:
    """The marks a node's cell shows: the services' views' badges (quarantined, falco,
    maintenance), and cordoned."""
    return node.badges()


def row_of(node: NodeStatus, model: str) -> Message:
    """What a viewer's cell of `node` shows (sent again whenever it differs)."""
    return {
        "t": "node",
        "node": node.name,
        "model": model,
        "health": node.health,
        "gpus": node.gpus,
        "marks": marks_of(node),
        "attention": node.attention,
    }


def action_row(at: datetime, r: Remediation) -> Message:
    return {
        "t": "action",
        "time": at.astimezone(UTC).isoformat(timespec="seconds"),
        "action": r.action,
        "target": r.target.key(),
        "outcome": r.outcome.value,
        "reason": r.reason,
        "actor": r.actor,
        "dry_run": r.dry_run,
    }


def alert_row(at: datetime, a: FalcoAlert) -> Message:
    return {
        "t": "alert",
        "time": a.time.astimezone(UTC).isoformat(timespec="seconds"),
        "priority": a.priority.value,
        "rule": a.rule,
        "hostname": a.hostname or "",
        "output": a.output,
    }


def isolated_row(i: Any) -> Message:
    """A pod Falco isolated (a node's `isolated` part), as the Security page lists it (sent
    when it appears)."""
    return {
        "t": "isolated",
        "pod": i.pod + (" (dry run)" if i.dry_run else ""),
        "node": i.node or "",
        "since": i.since.astimezone(UTC).isoformat(timespec="seconds"),
        "rule": i.rule or "",
        "reason": i.reason,
    }


def dead_row(at: datetime, d: DeadLetter) -> Message:
    return {
        "t": "dead",
        "time": at.astimezone(UTC).isoformat(timespec="seconds"),
        "stream": d.stream,
        "consumer": d.consumer,
        "subject": d.original_subject,
        "reason": d.reason.value,
        "error": d.error,
    }


def _decoded(subject: str, headers: dict[str, str] | None, data: bytes) -> Any:
    """An event's data, or None when it is not one (the console shows what it can read)."""
    try:
        return decode(subject, headers, data).data
    except (DecodeError, ValidationError, ValueError):
        return None


class Live:
    """The picture every page is drawn from, and the viewers it is streamed to."""

    def __init__(
        self,
        nc: Any,
        settings: ConsoleSettings,
        *,
        buckets: Buckets | None = None,
        views: Mapping[str, View] | None = None,
        capacity_bucket: str = SNAPSHOT.name,
        agent_timeout: timedelta = timedelta(seconds=90),
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.nc = nc
        self.settings = settings
        self.buckets = buckets or Buckets()
        self.views: Mapping[str, View] = views or {}
        """The services' views (`nodeward.views`): their rows on the fleet and node pages."""
        self.capacity_bucket = capacity_bucket
        self.agent_timeout = agent_timeout
        self.log = structlog.get_logger().bind(component="console")
        self.fleet: FleetStatus | None = None
        self.nodes: dict[str, NodeStatus] = {}
        self.capacity: CapacitySnapshot | None = None
        self.models: dict[str, str] = {}
        self.health: dict[tuple[str, str], GpuHealth | GpuSeen] = {}
        """Each GPU's newest state: from the feed, or status's read (its heartbeat's)."""
        self.actions: deque[tuple[datetime, Remediation]] = deque(maxlen=settings.actions)
        """Newest first."""
        self.alerts: deque[tuple[datetime, FalcoAlert]] = deque(maxlen=settings.alerts)
        self.dead: deque[tuple[datetime, DeadLetter]] = deque(maxlen=settings.dead_letters)
        self.pods_energy: list[EnergyPod] = []
        """Each pod's last `energy.pod` interval."""
        self.read_at: datetime | None = None
        self.read_s = 0.0
        self.ready = asyncio.Event()
        self._rows: dict[str, Message] = {}
        self._isolated: dict[str, Message] = {}
        self._said: list[Message] = []
        """The fleet's rows from the services' views, as last sent."""
        # Core subscriptions see every publish, also those JetStream drops as duplicates
        # (an alert from Falcosidekick and the ingest, an audit published again): one each.
        self._heard: deque[str] = deque(maxlen=4096)
        self._viewers: set[Viewer] = set()
        self._changed = asyncio.Event()
        self._subs: list[Any] = []
        self.mirrors = Mirrors(
            nc,
            [*watched(self.buckets, self.views), Watched.bucket(capacity_bucket)],
            on_change=self._changed.set,
        )
        Gauge("nodeward_console_viewers", "Open event streams", registry=registry).set_function(
            lambda: len(self._viewers)
        )
        self._read_seconds = Gauge(
            "nodeward_console_read_seconds",
            "How long the last whole read of the fleet took",
            registry=registry,
        )
        self._sent = Counter(
            "nodeward_console_updates",
            "Updates queued for viewers, by kind",
            ["kind"],
            registry=registry,
        )
        self._dropped = Counter(
            "nodeward_console_viewers_dropped",
            "Viewers dropped for falling behind",
            registry=registry,
        )

    # -- the feed ------------------------------------------------------------------------

    def subjects(self) -> dict[str, Callable[[Any], Awaitable[None]]]:
        """What the feed subscribes to, and what each message does."""
        return {
            "gpu.health.>": self._on_health,
            "remediation.>": self._on_action,
            "falco.>": self._on_alert,
            "dlq.>": self._on_dead,
        }

    async def start(self) -> None:
        """Subscribe first (nothing published during the read is missed), start the mirrors,
        then draw the picture."""
        for subject, handler in self.subjects().items():
            self._subs.append(
                await self.nc.subscribe(
                    subject, cb=handler, pending_msgs_limit=1 << 20, pending_bytes_limit=-1
                )
            )
        await self.mirrors.start()
        self._changed.clear()  # what the mirrors told while catching up, this drawing shows
        try:
            await self.refresh()
        except Exception as exc:  # noqa: BLE001 - not ready yet; keep() reads again at once
            self.log.warning("console.read_failed", error=" ".join(str(exc).split()))
            self._changed.set()

    async def stop(self) -> None:
        for sub in self._subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        self._subs.clear()
        await self.mirrors.stop()
        for viewer in list(self._viewers):
            self._drop(viewer)

    async def keep(self) -> None:
        """Draw the picture again after changes (settled), and at least every `refresh_s`
        (ages and staleness move on with the clock)."""
        while True:
            with contextlib.suppress(TimeoutError):
                await within(self._changed.wait(), self.settings.refresh_s)
            await asyncio.sleep(self.settings.settle_s)
            self._changed.clear()
            try:
                await self.refresh()
            except Exception as exc:  # noqa: BLE001 - a failed read keeps the last picture; the next retries
                self.log.warning("console.read_failed", error=" ".join(str(exc).split()))
            await asyncio.sleep(min(self.read_s, 5.0))  # reading never takes most of the time

    async def _on_health(self, msg: Any) -> None:
        data = _decoded(msg.subject, msg.headers, msg.data)
        if isinstance(data, GpuHealth):
            self.apply_health(data)

    def _again(self, msg: Any) -> bool:
        """Whether this message (by its id) was heard already."""
        headers = msg.headers or {}
        ident = headers.get("Nats-Msg-Id") or headers.get("ce-id")
        if not ident:
            return False
        if ident in self._heard:
            return True
        self._heard.append(ident)
        return False

    async def _on_action(self, msg: Any) -> None:
        if self._again(msg):
            return
        data = _decoded(msg.subject, msg.headers, msg.data)
        if isinstance(data, Remediation):
            at = datetime.now(UTC)
            self.actions.appendleft((at, data))
            self.broadcast(action_row(at, data))
            self._changed.set()

    async def _on_alert(self, msg: Any) -> None:
        if self._again(msg):
            return
        data = _decoded(msg.subject, msg.headers, msg.data)
        if isinstance(data, FalcoAlert):
            at = datetime.now(UTC)
            self.alerts.appendleft((at, data))
            self.broadcast(alert_row(at, data))

    async def _on_dead(self, msg: Any) -> None:
        if self._again(msg):
            return
        data = _decoded(msg.subject, msg.headers, msg.data)
        if isinstance(data, DeadLetter):
            at = datetime.now(UTC)
            self.dead.appendleft((at, data))
            self.broadcast(dead_row(at, data))
            self._changed.set()

    def apply_health(self, h: GpuHealth) -> None:
        """A GPU's newest health, at once: its cell changes for every viewer."""
        key = (h.node, h.gpu_key())
        known = self.health.get(key)
        if known is not None and known.observed_at > h.observed_at:
            return
        self.health[key] = h
        if h.model and h.node not in self.models:
            self.models[h.node] = h.model
        node = self.nodes.get(h.node)
        if node is None:
            self._changed.set()  # a node not seen yet: the next read brings it
            return
        if node.gpus.get(key[1]) == h.state.value:
            return
        node.gpus[key[1]] = h.state.value
        node.health = worst(node.gpus.values())
        self.broadcast(
            {
                "t": "gpu",
                "node": h.node,
                "gpu": key[1],
                "state": h.state.value,
                "health": node.health,
            }
        )
        self._changed.set()  # marks and attention follow on the next read

    # -- reading whole -------------------------------------------------------------------

    async def refresh(self) -> None:
        """Draw the whole picture and send viewers the rows that changed (the first drawing
        also takes the newest audit records, alerts and dead letters; the feed brings the
        rest)."""
        first = not self.ready.is_set()
        began = time.monotonic()
        reads = self.mirrors
        seen, raw_capacity, pods, alerts, dead = await asyncio.gather(
            read_fleet(
                self.nc,
                actions=self.settings.actions if first else 1,
                buckets=self.buckets,
                reads=reads,
                views=self.views,
            ),
            reads.kv(self.capacity_bucket, [SNAPSHOT.prefix]),
            reads.last("ENERGY", ["energy.pod.>"]),
            newest(self.nc, "SECURITY", self.settings.alerts) if first else _none(),
            newest(self.nc, "DLQ", self.settings.dead_letters) if first else _none(),
        )
        now = datetime.now(UTC)
        fleet = assemble(
            nats_url="",
            now=now,
            breaker=None,
            health=seen.health,
            telemetry={},
            dlq=seen.dlq,
            actions=seen.actions,
            agent_timeout=self.agent_timeout,
            missing=seen.missing,
            notes=seen.notes,
            seen=seen,
        )
        for h in seen.health:
            key = (h.node, h.gpu_key())
            known = self.health.get(key)
            if known is None or known.observed_at <= h.observed_at:
                self.health[key] = h
        for node in fleet.nodes:  # what the feed saw after the read started wins
            for gpu in node.gpus:
                live = self.health.get((node.name, gpu))
                if live is not None:
                    node.gpus[gpu] = live.state.value
            node.health = worst(node.gpus.values()) if node.gpus else node.health
        snapshot = raw_capacity.get(SNAPSHOT.prefix) if raw_capacity else None
        if snapshot:
            with contextlib.suppress(ValidationError):
                self.capacity = SNAPSHOT.load(snapshot)
        models = {h.node: h.model for h in self.health.values() if h.model}
        if self.capacity is not None:
            models |= {n.node: n.model for n in self.capacity.nodes if n.model != "unknown"}
        if first:  # what the feed brought during the read is stored too: once is enough
            fed = {_same(r) for _, r in self.actions}
            self.actions.extend((at, r) for at, r in seen.actions if _same(r) not in fed)
            self._take(alerts, FalcoAlert, self.alerts)
            self._take(dead, DeadLetter, self.dead)
        self.pods_energy = [
            d
            for m in pods or []
            if isinstance(d := _decoded(m.subject, m.headers, m.data), EnergyPod)
        ]
        self.fleet = fleet
        self.nodes = {n.name: n for n in fleet.nodes}
        self.models = models
        self.read_at = now
        self.read_s = time.monotonic() - began
        self._read_seconds.set(self.read_s)
        rows = {n.name: row_of(n, self.model(n.name)) for n in fleet.nodes}
        isolated = {i.pod: isolated_row(i) for n in fleet.nodes for i in n.part("isolated") or []}
        said = [r.model_dump(include={"section", "text", "severity"}) for r in fleet.rows]
        if not first:
            if said != self._said:
                self.broadcast({"t": "rows", "rows": said})
            for name, row in rows.items():
                if self._rows.get(name) != row:
                    self.broadcast(row)
            if set(rows) != set(self._rows):
                self.broadcast({"t": "fleet", "nodes": len(rows)})
            for pod, row in isolated.items():
                if pod not in self._isolated:
                    self.broadcast(row)
            for pod in self._isolated.keys() - isolated.keys():
                self.broadcast({"t": "released", "pod": pod})
        self._rows = rows
        self._isolated = isolated
        self._said = said
        if first:
            self.log.info("console.read", nodes=len(rows), seconds=round(self.read_s, 3))
        self.ready.set()

    @staticmethod
    def _take(stored: Iterable[Any] | None, model: type[Any], into: deque[Any]) -> None:
        for m in reversed(list(stored or [])):
            data = _decoded(m.subject, m.headers, m.data)
            if isinstance(data, model):
                into.append((m.time, data))

    def model(self, node: str) -> str:
        return self.models.get(node, "unknown")

    # -- viewers -------------------------------------------------------------------------

    def join(self) -> Viewer:
        viewer = Viewer(asyncio.Queue(maxsize=self.settings.viewer_queue))
        self._viewers.add(viewer)
        return viewer

    def leave(self, viewer: Viewer) -> None:
        self._viewers.discard(viewer)

    @property
    def viewers(self) -> int:
        return len(self._viewers)

    def broadcast(self, message: Message) -> None:
        """Queue one update for every viewer; one that has fallen this far behind is dropped
        (its page reconnects and is drawn afresh)."""
        if not self._viewers:
            return
        self._sent.labels(str(message.get("t"))).inc()
        text = json.dumps(message, separators=(",", ":"), default=str)
        for viewer in list(self._viewers):
            try:
                viewer.queue.put_nowait(text)
            except asyncio.QueueFull:
                self._dropped.inc()
                self._drop(viewer)

    def _drop(self, viewer: Viewer) -> None:
        self._viewers.discard(viewer)
        viewer.dropped.set()


def _same(r: Remediation) -> tuple[str, ...]:
    return (r.action, r.target.key(), r.outcome.value, r.reason, r.trigger_event_id or "")


async def _none() -> None:
    return None
