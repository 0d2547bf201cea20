"""What a service adds to the fleet's picture: `nodeward status`, `status --node`, the console.

A service names a view in its plugin (`nodeward.plugin.ServicePlugin.view`): a function of
the settings returning a `View`. The view says what it reads (`watched`: the streams and
buckets a console mirrors for it) and reads them (`read`) into `Row`s, each about a node or
the fleet, under a section of its own; a row that makes its node need a look carries the
words and the rank for the node's attention list. The runtime assembles the rows of every
registered view with what it reads itself (GPU health, agents, marks, the breaker, the DLQ,
the audit trail) and shows them without knowing whose they are.

The reads are those of `nodeward.bus.snapshot.Reads`; `records`, `decoded` and `data` read
its messages with the writers' own types.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Literal, Protocol, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from nodeward.bus.mirror import Watched
from nodeward.bus.snapshot import Reads, Stored
from nodeward.config import Settings
from nodeward.plugin import services
from schemas import DecodeError, Event, EventData, decode
from schemas.state import Bucket

Severity = Literal["ok", "info", "warning", "critical"]


class Row(BaseModel):
    """One line a service shows: about `node`, or about the fleet when None."""

    model_config = ConfigDict(frozen=True)

    section: str = Field(description="the heading it is shown under, e.g. `credentials`")
    text: str
    node: str | None = None
    severity: Severity = "info"
    attention: str | None = Field(
        default=None, description="why its node needs a look because of it; None: no need"
    )
    rank: int = Field(default=9, ge=0, le=9, description="the attention's: 0 most serious")


class Shown(BaseModel):
    """What one view read: its rows, and the streams or buckets it did not find."""

    rows: list[Row] = Field(default_factory=list)
    missing: list[str] = Field(default_factory=list)


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
