"""`nodeward publish` and `nodeward tail`: put events on the bus and watch them."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import nats
import typer
from nats.aio.msg import Msg
from nats.js import api
from pydantic import ValidationError

from nodeward.aio import within
from nodeward.bus import Bus, BusError, PublishError
from nodeward.cli.common import connect_nats, echo_json, fail, read_data
from nodeward.config import Settings
from schemas import DecodeError, decode, from_structured, lookup, make_event, to_structured
from schemas.cloudevents import one_line
from schemas.streams import STREAMS, StreamSpec, pattern_within, patterns_overlap


def build_event(type_name: str, payload: Any) -> Any:
    """A full structured CloudEvent keeps its id; bare data gets a fresh envelope."""
    try:
        et = lookup(type_name)
    except KeyError as exc:
        fail(str(exc))
    if isinstance(payload, dict) and "specversion" in payload and "data" in payload:
        try:
            return from_structured(payload, type_name=type_name, forbid_extra=True)
        except DecodeError as exc:
            fail(f"invalid {type_name} event: {exc}")
    try:
        data = et.model.model_validate(payload, context={"forbid_extra": True})
    except ValidationError as exc:
        fail(f"invalid {type_name} data: {one_line(exc)}")
    return make_event(data, source="cli/nodeward")


async def publish(settings: Settings, type_name: str, data_spec: str, as_json: bool) -> None:
    event = build_event(type_name, read_data(data_spec))
    settings.bus.provision = False
    try:
        bus = await Bus.connect(settings.bus, source="cli/nodeward", wait=False)
    except BusError as exc:
        fail(str(exc))
    try:
        ack = await bus.publish(event)
    except PublishError as exc:
        fail(f"not published: {exc}")
    finally:
        await bus.close(grace=1)
    if as_json:
        echo_json(
            {
                "id": event.id,
                "subject": event.nats_subject,
                "stream": ack.stream,
                "seq": ack.seq,
                "duplicate": bool(ack.duplicate),
            }
        )
    else:
        dup = " (duplicate: already stored)" if ack.duplicate else ""
        typer.echo(
            f"published {event.type} {event.id} on {event.nats_subject} -> {ack.stream} #{ack.seq}{dup}"
        )


def streams_for(subjects: list[str]) -> dict[StreamSpec, list[str]]:
    """The streams holding each requested subject filter, with the narrowest filter for each."""
    out: dict[StreamSpec, list[str]] = {}
    for subject in subjects:
        hit = False
        for spec in STREAMS:
            for captured in spec.subjects:
                if not patterns_overlap(subject, captured):
                    continue
                narrower = subject if pattern_within(subject, captured) else captured
                filters = out.setdefault(spec, [])
                if narrower not in filters:
                    filters.append(narrower)
                hit = True
        if not hit:
            fail(f"no nodeward stream holds subject {subject!r}")
    return out


def summarize(event: Any) -> str:
    parts = []
    for key, value in event.data.model_dump(mode="json", exclude_none=True).items():
        if isinstance(value, dict | list):
            if value:
                parts.append(
                    f"{key}=[{len(value)}]" if isinstance(value, list) else f"{key}={{..}}"
                )
            continue
        text = str(value)
        parts.append(f"{key}={text if len(text) <= 60 else text[:57] + '...'}")
    return " ".join(parts)


SEVERITIES = ("info", "warning", "critical")
_COLOURS: dict[str, str | None] = {"critical": "red", "warning": "yellow", "info": None}


def severity_of(event: Any) -> str:
    """How much a person should care about an event: info, warning or critical (what its
    type says, `EventData.concern`)."""
    return str(event.data.concern())


@dataclass(frozen=True)
class TailFilter:
    """Which decoded events `tail` shows."""

    node: str | None = None
    namespace: str | None = None
    min_severity: str = "info"
    heartbeats: bool = False

    def accepts(self, event: Any) -> bool:
        data = event.data
        routine = event.type == "gpu.heartbeat.v1" or getattr(data, "heartbeat", False)
        if not self.heartbeats and routine:
            return False
        about = event.subject.split("/")
        if (
            self.node is not None
            and getattr(data, "node", None) != self.node
            and about[:2] != ["node", self.node]
        ):
            return False
        in_namespace = getattr(data, "namespace", None) == self.namespace or (
            len(about) == 3 and about[1] == self.namespace
        )
        if self.namespace is not None and not in_namespace:
            return False
        return SEVERITIES.index(severity_of(event)) >= SEVERITIES.index(self.min_severity)


async def tail(
    settings: Settings,
    subjects: list[str],
    *,
    since: timedelta | None,
    count: int | None,
    as_json: bool,
    timeout: timedelta | None,
    where: TailFilter | None = None,
) -> None:
    where = where or TailFilter()
    targets = streams_for(subjects or [">"])
    nc = await connect_nats(settings, "cli/tail")
    js = nc.jetstream()
    queue: asyncio.Queue[Msg] = asyncio.Queue()

    async def on_msg(msg: Msg) -> None:
        await queue.put(msg)

    subs = []
    try:
        for spec, filters in targets.items():
            config = api.ConsumerConfig(
                filter_subjects=filters if len(filters) > 1 else None,
                filter_subject=filters[0] if len(filters) == 1 else None,
                deliver_policy=api.DeliverPolicy.BY_START_TIME if since else api.DeliverPolicy.NEW,
                opt_start_time=(datetime.now(UTC) - since) if since else None,
            )
            try:
                subs.append(
                    await js.subscribe(
                        filters[0],
                        stream=spec.name,
                        ordered_consumer=True,
                        cb=on_msg,
                        config=config,
                    )
                )
            except nats.js.errors.NotFoundError:
                continue  # stream not provisioned on this server
        if not subs:
            fail(
                "none of the streams for those subjects exist on this server (run nodeward bus or up)"
            )
        shown = 0
        deadline = asyncio.get_running_loop().time() + timeout.total_seconds() if timeout else None
        while count is None or shown < count:
            remaining = (
                None if deadline is None else max(deadline - asyncio.get_running_loop().time(), 0)
            )
            try:
                msg = await within(queue.get(), remaining)
            except TimeoutError:
                fail(f"no event within {timeout}")
            if _show(msg, as_json, where):
                shown += 1
    finally:
        for sub in subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        with contextlib.suppress(Exception):
            await nc.close()


def _show(msg: Msg, as_json: bool, where: TailFilter) -> bool:
    """Print one message if the filter takes it; True if printed."""
    try:
        event = decode(msg.subject, msg.headers, msg.data)
    except DecodeError as exc:
        if as_json:
            echo_json({"subject": msg.subject, "undecodable": str(exc)})
        else:
            typer.echo(f"{msg.subject}  UNDECODABLE  {exc}")
        return True
    if not where.accepts(event):
        return False
    if as_json:
        echo_json(to_structured(event))
    else:
        echo_line(event_line(event, msg.subject), severity_of(event))
    sys.stdout.flush()
    return True


def event_line(
    event: Any, subject: str, *, detail: str | None = None, at: datetime | None = None
) -> str:
    """One readable line: time (the event's, or `at`), severity, subject, type, and the data
    (or `detail`)."""
    when = (at or event.time).astimezone(UTC).strftime("%H:%M:%S.%f")[:-3]
    severity = severity_of(event)
    text = summarize(event) if detail is None else detail
    return f"{when} {severity[:4].upper():<4} {subject} {event.type} {text}"


def echo_line(line: str, severity: str) -> None:
    """Print a line coloured by severity; colours only on a terminal (click strips them)."""
    typer.secho(line, fg=_COLOURS.get(severity), bold=severity == "critical")
