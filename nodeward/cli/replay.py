"""`nodeward replay`: export stored events as JSON lines, up to the current end of the streams."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

from nats.errors import TimeoutError as NatsTimeout
from nats.js import api
from nats.js.errors import NotFoundError

from nodeward.cli.common import connect_nats, fail
from nodeward.cli.events import streams_for
from nodeward.config import Settings
from nodeward.durations import parse_duration
from nodeward.endpoints import DEFAULT_STATE_DIR
from schemas import DecodeError, decode, to_structured
from schemas.streams import StreamSpec

BATCH = 256


def parse_since(value: str, now: datetime | None = None) -> datetime:
    """`--since`: a duration back from now (`90s`, `15m`, `1h30m`) or an RFC 3339 time.

    A time must carry its offset (`Z` or `+02:00`). `ValueError` says what was wrong.
    """
    text = value.strip()
    now = now or datetime.now(UTC)
    try:
        return now - parse_duration(text)
    except ValueError:
        pass
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"{value!r} is neither a duration (90s, 15m, 1h30m) nor an RFC 3339 time "
            "(2026-11-29T20:00:00Z)"
        ) from None
    if at.tzinfo is None:
        raise ValueError(f"{value!r} has no UTC offset; add Z or +HH:MM")
    if at > now:
        raise ValueError(f"{value!r} is in the future")
    return at.astimezone(UTC)


async def _export_stream(
    js: Any, spec: StreamSpec, filters: list[str], since: datetime, write: Callable[[str], None]
) -> int:
    """Write every event of `spec` matching `filters` from `since` to the stream's end now."""
    config = api.ConsumerConfig(
        filter_subjects=filters if len(filters) > 1 else None,
        deliver_policy=api.DeliverPolicy.BY_START_TIME,
        opt_start_time=since,
        ack_policy=api.AckPolicy.NONE,
        inactive_threshold=30.0,
        mem_storage=True,
    )
    try:
        sub = await js.pull_subscribe(filters[0], stream=spec.name, config=config)
    except NotFoundError:
        return 0  # stream not provisioned on this server
    written = 0
    try:
        # What is stored now, as the consumer sees it at creation: the export ends there.
        remaining = (await sub.consumer_info()).num_pending or 0
        while remaining > 0:
            try:
                msgs = await sub.fetch(min(BATCH, remaining), timeout=5)
            except NatsTimeout:
                fail(f"stream {spec.name} stopped answering after {written} events")
            for msg in msgs:
                remaining -= 1
                try:
                    event = decode(msg.subject, msg.headers, msg.data)
                except DecodeError as exc:
                    line = {"subject": msg.subject, "undecodable": str(exc)}
                    write(_json(line))
                    continue
                write(_json(to_structured(event)))
                written += 1
                pending = msg.metadata.num_pending
                remaining = min(remaining, pending) if pending is not None else remaining
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
    return written


def _json(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), default=str)


async def replay(
    settings: Settings,
    subjects: list[str],
    *,
    since: datetime,
    to: Path | None,
    state_dir: Path = DEFAULT_STATE_DIR,
) -> int:
    """Export the matching events of each stream, each in stream order; returns the count."""
    targets = streams_for(subjects or [">"])
    nc = await connect_nats(settings, "cli/replay", state_dir)
    out: IO[str]
    if to is None:
        out = sys.stdout
    else:
        try:
            out = to.open("w")
        except OSError as exc:
            await nc.close()
            fail(f"cannot write {to}: {exc.strerror}")
    total = 0
    try:
        js = nc.jetstream()

        def write(line: str) -> None:
            out.write(line + "\n")

        for spec, filters in targets.items():
            total += await _export_stream(js, spec, filters, since, write)
    finally:
        out.flush()
        if to is not None:
            out.close()
        with contextlib.suppress(Exception):
            await nc.close()
    return total
