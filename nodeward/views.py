"""What a service adds to the fleet's picture: `nodeward status`, `status --node`, the console.

A service names a view in its plugin (`nodeward.plugin.ServicePlugin.view`): a function of
the settings returning a `View`. The view says what it reads (`watched`: the streams and
buckets a console mirrors for it) and reads them (`read`) into `Row`s, each about a node or
the fleet, under a section of its own; a row that makes its node need a look carries the
words and the rank for the node's attention list. The runtime assembles the rows of every
registered view with what it reads itself (GPU health, agents, marks, the breaker, the DLQ,
the audit trail) and shows them without knowing whose they are.

Beyond rows a view may give (`Shown`): a word or two in a node's cells (`Cell`: the fleet
table's `marks` and `pods` columns, the console's `badge`s), the kernel marks its owner holds
(`MarkHeld`, read with `marks_held` from the owner's bucket), tables (`Table`: the fleet's,
or one node's), the GPU states it last acted on (shown where no agent reported), the agent
kinds whose silence matters on a node because of what it holds (`expects`), and its data
about each node (`parts`: shown under its own keys in `status --json`'s node, and read by
the console's pages), with the pods on the node it concerns. The runtime ranks every row's
attention with its own and draws all of it without knowing whose it is.

The reads are those of `nodeward.bus.snapshot.Reads`; `records`, `decoded` and `data` read
its messages with the writers' own types.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from nodeward.bus.mirror import Watched
from nodeward.bus.snapshot import Reads, Stored
from nodeward.config import Settings
from nodeward.plugin import services
from schemas import DecodeError, Event, EventData, decode
from schemas.state import Bucket
from schemas.state.breaker import BreakerState
from schemas.state.marks import MarkIntent, intents

Severity = Literal["ok", "info", "warning", "critical"]


class Row(BaseModel):
    """One line a service shows: about `node`, or about the fleet when None."""

    model_config = ConfigDict(frozen=True)

    section: str = Field(description="the heading it is shown under, e.g. `credentials`")
    text: str = Field(default="", description="what is shown; empty: only its attention counts")
    node: str | None = None
    severity: Severity = "info"
    attention: str | None = Field(
        default=None, description="why its node needs a look because of it; None: no need"
    )
    rank: int = Field(default=9, ge=0, le=9, description="the attention's: 0 most serious")


Column = Literal["marks", "pods", "badge"]


class Cell(BaseModel):
    """A word or two about a node in one of its cells: the fleet table's `marks` or `pods`
    column, or a `badge` on its console cell (`quarantined`, `cordoned`...). In a cell the
    most severe come first, else in the views' order."""

    model_config = ConfigDict(frozen=True)

    node: str
    column: Column
    text: str
    severity: Severity = "info"


class MarkHeld(BaseModel):
    """An owner's marks on a node: its kernel intent (`schemas.state.marks`) while held."""

    node: str
    owner: str = Field(description="who holds them, as the kernel's intent names it")
    phase: str
    incident: str
    cordon: bool
    taints: list[str]
    since: datetime | None = None


HELD = frozenset({"applying", "applied", "releasing"})
"""The intent phases in which an owner holds its marks."""


def marks_held(bucket: str, raw: Mapping[str, bytes]) -> list[MarkHeld]:
    """The marks an owner holds, from the intents among its bucket's entries (read with
    `intents(bucket).prefix`, or `.key(node)`): one that an operator took back is not held."""
    out = []
    for node, intent in records(intents(bucket), raw).items():
        if intent.phase in HELD and not intent.operator_released:
            out.append(_held(node, intent))
    return out


def _held(node: str, intent: MarkIntent) -> MarkHeld:
    return MarkHeld(
        node=node,
        owner=intent.owner,
        phase=intent.phase,
        incident=intent.incident,
        cordon=intent.entry.cordon or intent.spec.cordon,
        taints=intent.entry.taints or intent.spec.taints,
        since=datetime.fromtimestamp(intent.updated_at, UTC) if intent.updated_at else None,
    )


class TableRow(BaseModel):
    cells: list[str]
    node: str | None = Field(default=None, description="the node it is about, if one")
    severity: Severity = "info"


class Table(BaseModel):
    """A table a view shows under the fleet, or in one node's detail (its rows' `node`)."""

    section: str
    title: str
    columns: list[str]
    rows: list[TableRow] = Field(default_factory=list)
    empty: str | None = Field(default=None, description="said instead when it has no row")
    more: str | None = Field(default=None, description="said under it (rows left out)")


class Shown(BaseModel):
    """What one view read: its rows, and the streams or buckets it did not find; and what
    else it adds to nodes (see the module)."""

    rows: list[Row] = Field(default_factory=list)
    missing: list[str] = Field(default_factory=list)
    cells: list[Cell] = Field(default_factory=list)
    marks: list[MarkHeld] = Field(default_factory=list)
    tables: list[Table] = Field(default_factory=list)
    gpus: dict[str, dict[str, str]] = Field(
        default_factory=dict,
        description="node -> GPU key -> the state it last acted on (where no agent reported)",
    )
    expects: dict[str, list[str]] = Field(
        default_factory=dict,
        description="node -> agent kinds whose silence matters there because of what it holds",
    )
    parts: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="node -> key -> its data about the node (JSON)"
    )
    defaults: dict[str, Any] = Field(
        default_factory=dict, description="key -> its value on a node it says nothing of"
    )
    pods: dict[str, list[str]] = Field(
        default_factory=dict, description="node -> the pods on it it concerns (namespace/name)"
    )
    breaker: BreakerState | None = Field(
        default=None,
        description="the shared circuit breaker, read from the bucket its settings name in "
        "place of the declared one: the one shown",
    )

    def held(
        self, mark: MarkHeld, section: str, severity: Severity, rank: int, after: str = ""
    ) -> None:
        """A mark its owner holds, said as every view says one: the marks cell (`cordoned by
        OWNER`) and the node's attention (`cordoned by OWNER (PHASE)`)."""
        word = "cordoned" if mark.cordon else "tainted" if mark.taints else "marked"
        self.cells.append(
            Cell(
                node=mark.node,
                column="marks",
                text=f"{word} by {mark.owner}{after}",
                severity=severity,
            )
        )
        what = "cordoned" if mark.cordon else "marked"
        self.needs_look(
            section, mark.node, severity, f"{what} by {mark.owner} ({mark.phase})", rank
        )

    def needs_look(
        self, section: str, node: str, severity: Severity, attention: str, rank: int
    ) -> None:
        """A row that says only why `node` needs a look (`attention`, ranked `rank`)."""
        self.rows.append(
            Row(section=section, node=node, severity=severity, attention=attention, rank=rank)
        )

    breaker_before: BreakerState | None = Field(
        default=None,
        description="an older record of the circuit breaker it keeps: shown when no shared "
        "one is found",
    )


class View(Protocol):
    """A service's part of the picture."""

    def watched(self) -> Sequence[Watched]:
        """The streams and buckets `read` reads (what a console keeps mirrors of)."""
        ...

    async def read(self, reads: Reads, *, node: str | None, now: datetime) -> Shown:
        """Its rows: about every node, or `node` alone (and the fleet's rows may be left
        out then)."""
        ...


def registered(settings: Settings) -> dict[str, View]:
    """Every registered service's view, by service name, made from `settings`."""
    out: dict[str, View] = {}
    for plugin in services():
        if plugin.view is not None:
            make: Callable[[Settings], View] = plugin.load(plugin.view)
            out[plugin.name] = make(settings)
    return out


def configured(settings: Settings, section: str, default: str, key: str = "bucket") -> str:
    """The bucket a service's settings `section` names under `key`, else its `default`."""
    return str((settings.services.get(section) or {}).get(key) or default)


BucketReader = Callable[[Reads, str, str | None, datetime], Awaitable[Shown]]
"""Reads a view's bucket: (reads, the bucket, the node or None, now) -> its part."""


@dataclass(frozen=True)
class BucketView:
    """A view of one bucket (the one its service is configured with), read by `reader`;
    `also` names the other streams and buckets the reader reads."""

    bucket: str
    reader: BucketReader
    also: tuple[Watched, ...] = ()

    @classmethod
    def of(
        cls,
        settings: Settings,
        section: str,
        default: str,
        reader: BucketReader,
        also: tuple[Watched, ...] = (),
    ) -> BucketView:
        """The view of the bucket the service's settings `section` names (else `default`)."""
        return cls(configured(settings, section, default), reader, also)

    def watched(self) -> Sequence[Watched]:
        return [Watched.bucket(self.bucket), *self.also]

    async def read(self, reads: Reads, *, node: str | None, now: datetime) -> Shown:
        return await self.reader(reads, self.bucket, node, now)


M = TypeVar("M", bound=BaseModel)
D = TypeVar("D", bound=EventData)


def records(bucket: Bucket[M], raw: Mapping[str, bytes]) -> dict[str, M]:
    """The records of one kind among a bucket's entries, by key suffix; unreadable ones left
    out (a record a picture cannot read is not worth failing the whole picture for)."""
    out: dict[str, M] = {}
    for key, value in raw.items():
        if not bucket.holds(key) or not value:
            continue
        try:
            out[bucket.suffix(key)] = bucket.load(value)
        except ValidationError:
            continue
    return out


def decoded(stored: Iterable[Stored]) -> list[tuple[Stored, Event[Any]]]:
    """Each message that decodes as an event, with it; the others left out."""
    out = []
    for m in stored:
        try:
            out.append((m, decode(m.subject, m.headers, m.data)))
        except DecodeError:
            continue
    return out


def data(stored: Iterable[Stored], model: type[D]) -> list[tuple[Stored, D]]:
    """The data of each message of type `model`; a binary-mode CloudEvent's body is read
    as the model directly (the envelope is not needed here), any other form decoded."""
    out: list[tuple[Stored, D]] = []
    for m in stored:
        try:
            if (m.headers or {}).get("ce-type") == model.TYPE:
                out.append((m, model.model_validate_json(m.data)))
                continue
            event = decode(m.subject, m.headers, m.data)
        except (DecodeError, ValidationError):
            continue
        if isinstance(event.data, model):
            out.append((m, event.data))
    return out
