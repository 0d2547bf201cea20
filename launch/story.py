"""The story `nodeward up` tells on its terminal: one line per step of every remediation.

GPU event (a `gpu.health` change, not a heartbeat) → DECISION (`remediation.v1`) →
CORDON (the node's record in KV `cordon` says the marks are applied) → DELIVERED (a file in
the outbox) → RECOVERY (each step of services.recovery: recover, drain, reset or reboot,
validate, escalate) → RELEASE; NODE (a node unresponsive, or responsive again: `node.health`)
before a hung node's RECOVERY lines (its ladder: reboot, power-off, fence, power-on, unfence,
told by step); IDLE (a session found idle, once per idle period) before the culler's DECISIONs; a Falco alert (FALCO) → its DECISIONs; DLQ when a consumer gives up
on a message; RESTART when `up` restarts a daemon (or its nats-server) that died, or gives
up on one. The notice a decision's audit sends is told on the decision's line; a NOTIFY
line is a notice of its own (an owner's warning, a power limit). Lines use `nodeward tail`'s
format, with the clock's time: when the bus stored the message (the event's own time is
added when it differs by more than `SKEW_S`, as a replayed Falco alert's does).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import MappingProxyType
from typing import Any

import structlog
from nats.aio.msg import Msg
from nats.js import api
from pydantic import ValidationError

from nodeward.aio import within
from nodeward.bus.dlq import one_line
from nodeward.cli.common import fit, line_width
from nodeward.cli.events import echo_line, severity_of
from nodeward.supervisor import ACTOR as RESTART_ACTOR
from schemas import DecodeError, decode
from schemas.dlq import DeadLetter
from schemas.falco import FalcoAlert
from schemas.gpu import GpuHealth, HealthState
from schemas.node import NodeHealth
from schemas.notify import Notification
from schemas.remediation import Remediation
from schemas.session import SessionIdle
from schemas.state.cordon import NODES, TAINT_KEY, NodeRecord

LABEL_WIDTH = 9
OUTBOX_POLL_S = 0.5
TICK_S = 0.1
"""How often waiting lines are looked at again (and lagging sources asked)."""
CATCH_UP_S = 2.0
"""How long the server gets to say where a source's subscription stands."""
SKEW_S = 5.0
"""An event's own time further than this from the clock's is shown beside it."""
_SEVERITY_RANK = MappingProxyType({"info": 0, "warning": 1, "critical": 2})

# stream, filter subject
EVENT_SOURCES = (
    ("GPU", "gpu.health.>"),
    ("NODES", "node.health.>"),
    ("SESSIONS", "session.idle.>"),
    ("SECURITY", "falco.>"),
    ("AUDIT", "remediation.>"),
    ("NOTIFY", "notify.>"),
    ("DLQ", "dlq.>"),
)


def _label(label: str) -> str:
    return f"{label:<{LABEL_WIDTH}} "


_AT = LABEL_WIDTH + 1
"""Where a story line's time starts."""


def _now() -> datetime:
    return datetime.now(UTC)


LEVELS = MappingProxyType({"info": "INFO", "warning": "WARN", "critical": "CRIT"})
MAX_DETAIL = 160
"""A story line's detail is cut here; on a terminal (or with `COLUMNS`) the whole line is
cut to its width, one line each. `nodeward status --node` and `nodeward tail` say the
whole."""
_UUID = re.compile(r"\b([0-9a-f]{8})-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b")
_HEX_ID = re.compile(r"\b([0-9a-f]{8})[0-9a-f]{24}\b")


def short(detail: str) -> str:
    """Ids shortened to their first 8 characters (enough to tell them apart in a story, and
    to find them with `nodeward tail`), and the whole cut at `MAX_DETAIL`."""
    detail = _HEX_ID.sub(r"\1", _UUID.sub(r"\1", detail))
    return detail if len(detail) <= MAX_DETAIL else detail[: MAX_DETAIL - 1] + "…"


def _clock(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%H:%M:%S.%f")[:-3]


def _stamped(event: Any, subject: str, detail: str, at: datetime | None) -> str:
    """A story line's body: the clock's time `at` (None: the event's own), a level (set
    again when the line is told: a decision's is its notice's), and the detail shortened,
    with the event's own time appended when the two differ by more than `SKEW_S`. The
    subject and type, which `nodeward tail` shows, are left out."""
    line = f"{_clock(at or event.time)} {LEVELS[severity_of(event)]} {short(detail)}"
    if at is None or abs((event.time - at).total_seconds()) <= SKEW_S:
        return line
    own = event.time.astimezone(UTC)
    fmt = "%H:%M:%S" if own.date() == at.astimezone(UTC).date() else "%Y-%m-%d %H:%M:%S"
    return f"{line} (event time {own.strftime(fmt)})"


def story_line(label: str, detail: str, severity: str = "info") -> None:
    """Print a line `up` tells of itself (not read from the bus: the demo's credential
    notebook) in the story's format, now."""
    line = _label(label) + f"{_clock(_now())} {LEVELS[severity]} {short(detail)}"
    echo_line(fit(line, line_width()), severity)


def health_line(event: Any, subject: str, at: datetime | None = None) -> str | None:
    """A GPU state change; None for heartbeats and the first `healthy` an agent reports."""
    h: GpuHealth = event.data
    if h.heartbeat or (h.previous_state is None and h.state == HealthState.HEALTHY):
        return None
    why = "; ".join(
        f"XID {r.xid}{' (kernel log)' if r.detectors[:1] == ['kmsg'] else ''}: {r.message}"
        if r.xid is not None
        else f"{r.code}: {r.message}"
        for r in h.reasons
    )
    was = f"{h.previous_state.value} -> " if h.previous_state else ""
    detail = f"{h.node} GPU {h.gpu_key()} {was}{h.state.value}{f' ({why})' if why else ''}"
    return _label("GPU") + _stamped(event, subject, detail, at)


def node_line(event: Any, subject: str, at: datetime | None = None) -> str:
    """A node turned unresponsive (its causes), or responsive again."""
    h: NodeHealth = event.data
    return _label("NODE") + _stamped(event, subject, h.summary, at)


def idle_line(event: Any, subject: str, at: datetime | None = None) -> str:
    s: SessionIdle = event.data
    since = s.idle_since.astimezone(UTC).strftime("%H:%M:%S")
    evidence = "; ".join(f"{e.signal} {e.detail}" for e in s.evidence)
    detail = (
        f"{s.kind.value} {s.namespace}/{s.pod} on {s.node} idle {s.idle_for_s:.0f}s "
        f"(since {since}): {evidence}"
    )
    return _label("IDLE") + _stamped(event, subject, detail, at)


def falco_line(event: Any, subject: str, at: datetime | None = None) -> str:
    """A Falco alert, as the falco service will judge it."""
    a: FalcoAlert = event.data
    where = f"pod {a.namespace}/{a.pod}" if a.namespace and a.pod else f"node {a.hostname}"
    detail = f"{a.priority.value} '{a.rule}' on {where}: {a.message()[:160]}"
    return _label("FALCO") + _stamped(event, subject, detail, at)


RECOVERY_ACTOR = "service/recovery"


def decision_label(r: Remediation) -> str:
    """RELEASE for a release, RECOVERY for a step of services.recovery (drain, reset or
    reboot, validate, escalate), else DECISION."""
    if r.action == "release":
        return "RELEASE"
    return "RECOVERY" if r.actor == RECOVERY_ACTOR else "DECISION"


HANG_PLAN = "hang"
_SAID = re.compile(r" \([^()]*\)")


def hang_told(r: Remediation) -> tuple[str, str] | None:
    """A hung node's recovery (policy `hang`) in fewer words: its rule with the ladder's step
    (`hang, step 3`), and its reason without what the line already says (the node, its
    causes: the NODE line tells them); None for any other record."""
    if r.policy != HANG_PLAN or r.actor != RECOVERY_ACTOR:
        return None
    node, details, reason = r.target.name, r.details, r.reason
    rung = details.get("rung")
    rule = f"{HANG_PLAN}, step {rung + 1}" if isinstance(rung, int) else HANG_PLAN
    ladder = details.get("ladder")
    if r.action == "recover" and ": the ladder " in reason:
        head, _, steps = reason.rpartition(": the ladder ")
        return rule, f"{_SAID.sub('', head)}: the ladder {steps}"
    if ladder is not None and isinstance(rung, int):
        reason = reason.removesuffix(f" (ladder {ladder}, step {rung + 1})")
        reason = reason.partition(f" of {node}, hung: ")[0]
        if r.action == "fence" and details.get("taint"):  # node.kubernetes.io/out-of-service=...
            taint = str(details["taint"]).partition("=")[0].rpartition("/")[2]
            reason = f"{taint} taint on: {reason}"
        elif details.get("bmc"):
            reason = f"{reason} (BMC {details['bmc']})"
    return rule, reason.removeprefix(f"{r.action} of {node} failed: ")


def decision_line(event: Any, subject: str, at: datetime | None = None) -> str:
    r: Remediation = event.data
    label = decision_label(r)
    rule, reason = hang_told(r) or (r.policy, r.reason)
    ruled = f" [{rule}]" if rule else ""
    guard = f" by {r.guard}" if r.guard else ""
    detail = f"{r.action} {r.target.key()}: {r.outcome.value}{guard}{ruled} - {reason}"
    return _label(label) + _stamped(event, subject, detail, at)


def restart_line(event: Any, subject: str, at: datetime | None = None) -> str | None:
    """`up` restarted one of its daemons or its nats-server, or gave up on a daemon; None for
    any other decision."""
    r: Remediation = event.data
    if r.action != "restart" or r.actor != RESTART_ACTOR:
        return None
    result = r.details.get("result")
    detail = f"{r.target.name}: {r.reason}" + (f"; {result}" if result else "")
    return _label("RESTART") + _stamped(event, subject, detail, at)


def notify_line(event: Any, subject: str, at: datetime | None = None) -> str:
    n: Notification = event.data
    detail = f"to {n.audience}: {n.title}"
    return _label("NOTIFY") + _stamped(event, subject, detail, at)


def notice_told(n: Notification) -> str:
    """What a decision's line says of the notice its audit sent."""
    return f"; notice to {n.audience} ({n.severity.value})"


def dlq_line(event: Any, subject: str, at: datetime | None = None) -> str:
    d: DeadLetter = event.data
    detail = f"{d.consumer} could not process {d.original_subject} ({d.reason.value}): {d.error}"
    return _label("DLQ") + _stamped(event, subject, detail, at)


def cordon_line(node: str, record: NodeRecord, at: datetime) -> str:
    """The marks the cordon service recorded as applied to `node`."""
    q = record.quarantine
    assert q is not None
    marks = [f"tainted {TAINT_KEY}:{t}" for t in q.taints] + (["cordoned"] if q.cordoned else [])
    did = ", ".join(marks) or "marked"
    dry = " (dry run: nothing changed)" if q.dry_run else ""
    when = at.astimezone(UTC).strftime("%H:%M:%S.%f")[:-3]
    return _label("CORDON") + f"{when} CRIT {node} {did}{dry}; GPUs {', '.join(q.gpus)}"


# Within one instant the steps sort in the story's order.
_RANK: Mapping[str, int] = MappingProxyType(
    {
        "GPU": 0,
        "NODE": 0,
        "IDLE": 0,
        "FALCO": 0,
        "DECISION": 1,
        "RELEASE": 1,
        "RECOVERY": 1,
        "CORDON": 2,
        "NOTIFY": 3,
        "DELIVERED": 4,
        "DLQ": 5,
        "RESTART": 5,
    }
)


@dataclass(order=True)
class _Pending:
    at: datetime
    rank: int
    arrived: float = field(compare=False)
    line: str = field(compare=False)
    severity: str = field(compare=False)
    incident: str | None = field(default=None, compare=False)
    decision: str | None = field(default=None, compare=False)  # a decision's event id
    notice: Notification | None = field(default=None, compare=False)  # a NOTIFY line's

    @property
    def audit(self) -> str | None:
        """The event id of the decision whose audit sent this line's notice."""
        return self.notice.audit_event_id if self.notice is not None else None

    def fold(self, notice: Notification) -> None:
        """Tell `notice` (sent for this decision) on this line, at the notice's level."""
        self.line += notice_told(notice)
        if _SEVERITY_RANK[notice.severity.value] > _SEVERITY_RANK.get(self.severity, 0):
            self.severity = notice.severity.value

    def told(self) -> str:
        """The line as it is told: at its place in time (a CORDON line moved after its
        decision shows the decision's time) and at its level, which may have risen since
        it was made (a decision's notice)."""
        head, when, level = self.line[:_AT], self.line[_AT : _AT + 12], self.line[_AT + 13 :]
        if len(when) != 12 or level[:4] not in LEVELS.values():
            return self.line  # not a stamped line
        return f"{head}{_clock(self.at)} {LEVELS.get(self.severity, 'INFO')}{level[4:]}"


@dataclass
class Story:
    """Turns bus messages, KV updates and outbox files into story lines.

    Lines go out sorted by when the bus stored what they tell (`at`; the wall clock `now()`
    when not given). Each source has its own subscription, so what one tells may arrive
    before what caused it on another: a line waits until every source the story `follow`s
    is known to have delivered all it stored up to the line's `at` (`seen`, `caught_up`).
    A node's CORDON line goes right after the DECISION that names its incident (the
    service writes its record just before it publishes the audit), so it waits for that
    decision. A line waits `patience` seconds at most, for a source that cannot be asked
    (the bus is away) or a decision that never comes, and `hold` seconds at least. The
    notice a decision's audit sends (`audit_event_id`) is folded into the decision's line,
    not told again.
    """

    emit: Callable[[str, str], None] = echo_line
    width: Callable[[], int | None] | None = None
    """How wide a told line may be (`line_width`: the terminal's); None: whole lines."""
    hold: float = 0.0
    patience: float = 10.0
    clock: Callable[[], float] = time.monotonic
    now: Callable[[], datetime] = _now
    applied: dict[str, str] = field(default_factory=dict)  # node -> incident already shown
    decided: dict[str, datetime] = field(default_factory=dict)  # incident -> decision time
    idle_told: set[tuple[str, str, datetime]] = field(default_factory=set)  # periods shown
    pending: list[_Pending] = field(default_factory=list)
    decisions_told: set[str] = field(default_factory=set)  # decisions' event ids emitted
    # followed source -> the stored time up to which it has delivered everything (None:
    # not known yet); lines wait for the least of these.
    marks: dict[str, datetime | None] = field(default_factory=dict)
    latest: datetime | None = None  # the newest stored time seen from any source

    def follow(self, source: str) -> None:
        """Lines wait for `source` from now on (a subscription to it is in place)."""
        self.marks.setdefault(source, None)

    def unfollow(self, source: str) -> None:
        """Lines no longer wait for `source` (it is missing: nothing will come from it)."""
        self.marks.pop(source, None)

    def seen(self, source: str, at: datetime) -> None:
        """`source` delivered a message the bus stored at `at`: in order, so everything it
        stored before is in too."""
        at = at.astimezone(UTC)
        self.latest = at if self.latest is None else max(self.latest, at)
        if source in self.marks:
            self.caught_up(source, at)

    def caught_up(self, source: str, as_of: datetime) -> None:
        """`source` has delivered everything it stored up to `as_of`."""
        mark = self.marks.get(source)
        if source in self.marks and (mark is None or mark < as_of):
            self.marks[source] = as_of.astimezone(UTC)

    def behind(self) -> list[str]:
        """The followed sources not known to be caught up to the oldest line waiting."""
        if not self.pending:
            return []
        oldest = min(p.at for p in self.pending)
        return [s for s, mark in self.marks.items() if mark is None or mark < oldest]

    def _due(self, p: _Pending, now: float) -> bool:
        if now - p.arrived < self.hold:
            return False
        if now - p.arrived >= self.patience:
            return True
        if p.rank == _RANK["CORDON"] and p.incident not in self.decided:
            return False  # its decision is on its way
        marks = list(self.marks.values())
        return all(mark is not None and p.at <= mark for mark in marks)

    def _add(
        self,
        at: datetime,
        label: str,
        line: str,
        severity: str,
        incident: str | None = None,
        *,
        decision: str | None = None,
        notice: Notification | None = None,
    ) -> _Pending:
        pending = _Pending(
            at.astimezone(UTC),
            _RANK[label],
            self.clock(),
            line,
            severity,
            incident,
            decision,
            notice,
        )
        self.pending.append(pending)
        return pending

    def flush(self, *, everything: bool = False) -> None:
        """Emit the lines that are due (all of them with `everything`), oldest first."""
        for p in self.pending:
            if p.incident is not None and p.incident in self.decided:
                p.at = max(p.at, self.decided[p.incident])
        now = self.clock()
        ready = [everything or self._due(p, now) for p in self.pending]
        due = sorted(p for p, r in zip(self.pending, ready, strict=True) if r)
        if not due:
            return
        self.pending = [p for p, r in zip(self.pending, ready, strict=True) if not r]
        if len(self.decisions_told) > 4096:
            self.decisions_told.clear()
        for p in due:
            if p.decision is not None:
                self.decisions_told.add(p.decision)
            self.emit(fit(p.told(), self.width() if self.width else None), p.severity)
        if len(self.decided) > 1024:
            self.decided.clear()

    def on_event(self, msg: Msg, at: datetime | None = None) -> None:
        """A message from the bus; `at`: when the bus stored it (now if not given)."""
        try:
            event = decode(msg.subject, msg.headers, msg.data)
        except DecodeError:
            return  # the consumers dead-letter it; the story has nothing to say
        at = (at or self.now()).astimezone(UTC)
        data = event.data
        severity = severity_of(event)
        if isinstance(data, GpuHealth):
            line = health_line(event, msg.subject, at)
            if line is not None:
                self._add(at, "GPU", line, severity)
        elif isinstance(data, NodeHealth):
            self._add(at, "NODE", node_line(event, msg.subject, at), severity)
        elif isinstance(data, SessionIdle):
            period = (data.namespace, data.pod, data.idle_since)
            if period not in self.idle_told:  # the agent restates it every interval
                if len(self.idle_told) > 4096:
                    self.idle_told.clear()
                self.idle_told.add(period)
                self._add(at, "IDLE", idle_line(event, msg.subject, at), severity)
        elif isinstance(data, FalcoAlert):
            if not data.is_test:
                self._add(at, "FALCO", falco_line(event, msg.subject, at), severity)
        elif isinstance(data, Remediation) and (restart := restart_line(event, msg.subject, at)):
            self._add(at, "RESTART", restart, severity)
        elif isinstance(data, Remediation):
            self._on_decision(event, msg.subject, at, severity)
        elif isinstance(data, Notification):
            self._on_notice(event, msg.subject, at, severity)
        elif isinstance(data, DeadLetter):
            self._add(at, "DLQ", dlq_line(event, msg.subject, at), severity)

    def _on_decision(self, event: Any, subject: str, at: datetime, severity: str) -> None:
        data: Remediation = event.data
        label = decision_label(data)
        # What went wrong is a warning; the rest is told at its notice's level (`fold`).
        severity = "warning" if data.outcome.value in ("failed", "refused") else "info"
        if data.trigger_event_id and data.action == "quarantine":
            self.decided[data.trigger_event_id] = at
        line = self._add(at, label, decision_line(event, subject, at), severity, decision=event.id)
        # Its notice may have come first (another subscription): told here, not on its own.
        for told in [p for p in self.pending if p.audit == event.id]:
            self.pending.remove(told)
            if told.notice is not None:
                line.fold(told.notice)

    def _on_notice(self, event: Any, subject: str, at: datetime, severity: str) -> None:
        data: Notification = event.data
        audit = data.audit_event_id
        if audit is not None:
            if audit in self.decisions_told:
                return  # its decision's line is out already; it said what this would
            decision = next((p for p in self.pending if p.decision == audit), None)
            if decision is not None:
                decision.fold(data)
                return
        self._add(at, "NOTIFY", notify_line(event, subject, at), severity, notice=data)

    def on_record(self, key: str, value: bytes, at: datetime) -> None:
        if not NODES.holds(key) or not value:
            return
        node = NODES.suffix(key)
        try:
            record = NODES.load(value)
        except ValidationError:
            return
        q = record.quarantine
        if q is None:
            self.applied.pop(node, None)
        elif self.applied.get(node) != q.incident:  # recorded once applied
            self.applied[node] = q.incident
            self._add(at, "CORDON", cordon_line(node, record, at), "critical", q.incident)

    def on_file(self, name: str, title: str | None = None) -> None:
        """A file `name` (relative to the outbox) appeared: a notice was delivered."""
        at = self.now()
        when = at.strftime("%H:%M:%S.%f")[:-3]
        about = f": {title}" if title else ""
        line = _label("DELIVERED") + f"{when} INFO outbox/{name}{short(about)}"
        self._add(at, "DELIVERED", line, "info")


def outbox_title(path: Path) -> str | None:
    """The `Subject:` header of an outbox notice (the notifier writes mail-like text files)."""
    try:
        with path.open(encoding="utf-8", errors="replace") as f:
            head = f.read(16384)
    except OSError:
        return None
    for line in head.split("\n\n", 1)[0].splitlines():
        name, _, value = line.partition(":")
        if name.strip().lower() == "subject" and value.strip():
            return value.strip()
    return None


def _listing(outbox: Path) -> set[Path]:
    try:
        return {p for p in outbox.rglob("*") if p.is_file() and not p.name.startswith(".")}
    except OSError:
        return set()


async def watch_outbox(
    outbox: Path, story: Story, stop: asyncio.Event, listed: asyncio.Event | None = None
) -> None:
    """Report each file that appears in the outbox (files there before are not news).

    `listed` is set once the files already there have been noted.
    """
    seen = await asyncio.to_thread(_listing, outbox)
    if listed is not None:
        listed.set()
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await within(stop.wait(), OUTBOX_POLL_S)  # poll period, not a sync
        now = await asyncio.to_thread(_listing, outbox)
        for path in sorted(now - seen):
            name = path.relative_to(outbox).as_posix()
            story.on_file(name, await asyncio.to_thread(outbox_title, path))
        seen |= now


async def tell(nc: Any, outbox: Path | None, story: Story | None = None) -> None:
    """Follow the bus, KV `cordon` and the outbox until cancelled, telling `story`.

    After the connection comes back (`nc` reconnected: a restarted server may have lost the
    ordered consumers) every source is subscribed again from the message after the last one
    seen, so nothing is told twice and nothing published meanwhile is missed.
    """
    story = story or Story(width=line_width)
    log = structlog.get_logger().bind(component="story")
    js = nc.jetstream()
    queue: asyncio.Queue[Msg] = asyncio.Queue()

    async def on_msg(msg: Msg) -> None:
        await queue.put(msg)

    sources = [*EVENT_SOURCES, (f"KV_{NODES.name}", f"$KV.{NODES.name}.{NODES.prefix}>")]
    since = datetime.now(UTC)
    last: dict[str, int] = {}  # stream -> the last stream sequence told
    subs: dict[str, Any] = {}  # stream -> its ordered subscription

    missing: set[str] = set()

    def config_for(stream: str) -> api.ConsumerConfig:
        """Where a replacing subscription starts: after the last message told, else at the
        start of the story (nothing was told from this source, so nothing since is old)."""
        if stream in last:
            return api.ConsumerConfig(
                deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=last[stream] + 1
            )
        return api.ConsumerConfig(
            deliver_policy=api.DeliverPolicy.BY_START_TIME, opt_start_time=since
        )

    async def subscribe(first: bool) -> bool:
        """(Re)subscribe every source; False while one is still missing."""
        for sub in subs.values():
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        subs.clear()
        ok = True
        for stream, subject in sources:
            config = (
                api.ConsumerConfig(deliver_policy=api.DeliverPolicy.NEW)
                if first
                else config_for(stream)
            )
            try:
                subs[stream] = await js.subscribe(
                    subject, stream=stream, ordered_consumer=True, cb=on_msg, config=config
                )
            except Exception as exc:  # noqa: BLE001 - a missing stream leaves a gap, not a crash
                ok = False
                if first or stream not in missing:
                    log.warning("story.sourcemissing", stream=stream, error=one_line(exc))
                missing.add(stream)
            else:
                missing.discard(stream)
                story.follow(stream)
        for stream in missing:
            story.unfollow(stream)  # nothing comes from it until it is there
        return ok

    async def catch_up(stream: str) -> None:
        """Ask the server whether `stream`'s subscription has delivered everything: then
        everything stored in it before the question is told (or waiting to be)."""
        sub = subs.get(stream)
        if sub is None:
            return
        # What the bus stored before now is in the answer (`up` runs the bus on this clock).
        as_of = max(story.latest or since, datetime.now(UTC))
        try:
            info = await within(sub.consumer_info(), CATCH_UP_S)
        except Exception:  # noqa: BLE001 - a consumer being replaced; asked again next tick
            return
        delivered = info.delivered
        if (
            info.num_pending == 0
            and sub.pending_msgs == 0
            and queue.empty()
            and (not delivered.consumer_seq or (delivered.stream_seq or 0) <= last.get(stream, 0))
        ):
            story.caught_up(stream, as_of)

    await subscribe(first=True)
    reconnects = nc.stats.get("reconnects", 0)
    resubscribe_at: float | None = None  # when to try again (after a reconnect)
    stop = asyncio.Event()
    outbox_task = asyncio.create_task(watch_outbox(outbox, story, stop)) if outbox else None
    try:
        while True:
            try:
                msg: Msg | None = await within(queue.get(), TICK_S)
            except TimeoutError:
                msg = None  # time to flush what has waited long enough
            if nc.stats.get("reconnects", 0) != reconnects and nc.is_connected:
                reconnects = nc.stats.get("reconnects", 0)
                resubscribe_at = time.monotonic()
            if resubscribe_at is not None and time.monotonic() >= resubscribe_at:
                if await subscribe(first=False):
                    resubscribe_at = None
                    log.info("story.resubscribed", sources=len(subs))
                else:
                    resubscribe_at = time.monotonic() + 1.0
            try:
                if msg is not None and msg.metadata is not None:
                    meta = msg.metadata
                    seq = meta.sequence.stream
                    story.seen(meta.stream, meta.timestamp)
                    if seq <= last.get(meta.stream, 0):
                        msg = None  # already told (a subscription that was replaced)
                    else:
                        last[meta.stream] = seq
                stored = msg.metadata.timestamp if msg is not None and msg.metadata else None
                if msg is not None and msg.subject.startswith("$KV."):
                    key = msg.subject.split(".", 2)[2]
                    story.on_record(key, msg.data, stored or datetime.now(UTC))
                elif msg is not None:
                    story.on_event(msg, stored)
                if queue.empty() and (behind := story.behind()):
                    await asyncio.gather(*(catch_up(stream) for stream in behind))
                story.flush()
                sys.stdout.flush()
            except Exception as exc:  # noqa: BLE001 - the story never takes `up` down
                log.warning("story.line_failed", error=str(exc))
    finally:
        with contextlib.suppress(Exception):
            story.flush(everything=True)
        stop.set()
        if outbox_task is not None:
            with contextlib.suppress(Exception):
                await outbox_task
        for sub in subs.values():
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
