"""The newest message on every subject of a stream, read in one pass.

One ephemeral consumer with `DeliverPolicy.LAST_PER_SUBJECT` over the wanted subjects
(several filters at once) pushes each subject's last message; the read ends when the
consumer has nothing pending. A KV bucket is a stream (`KV_<bucket>`), so its live
entries are read the same way, deleted and purged keys left out. One request and one
stream of replies, instead of one `get_last_msg` round trip per subject. `newest` reads
a stream's last messages the same way, `stored_since` those stored after a time, and
`subject_counts` lists a stream's subjects (one paged `STREAM.INFO`, no message read).
`last_stored_times` reads when each subject's last message was stored with batched direct
gets (`multi_last`, nats-server 2.11+): no consumer, so a read-only `DIRECT.GET` grant on
the one stream is all it needs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from nats.js import api
from nats.js.errors import NotFoundError

from nodeward.aio import within

_KV_OPERATION = "KV-Operation"
_MARKER = "Nats-Marker-Reason"
_PENDING_LIMIT = 1 << 22  # messages the client may hold unread: a snapshot is read whole


@dataclass(slots=True)
class Stored:
    """One stored message: its subject, headers, body, stream sequence and store time.

    Not frozen, though nothing changes one once read: a frozen dataclass sets each field
    through `object.__setattr__`, and `nodeward status` makes 25,000 of them at 5,000 nodes."""

    subject: str
    headers: dict[str, str] | None
    data: bytes
    seq: int
    time: datetime


class SnapshotError(Exception):
    """The server stopped sending before every subject's last message arrived."""


async def last_per_subject(
    nc: Any,
    stream: str,
    filters: Sequence[str],
    *,
    headers_only: bool = False,
    timeout: float = 5.0,
) -> list[Stored] | None:
    """The last message of each subject of `stream` that matches one of `filters`, in
    stream order; None if there is no such stream. `headers_only` leaves bodies out.

    `timeout` bounds the wait for each next message (a stalled server), not the whole read.
    """
    return await _read(
        nc,
        stream,
        filters,
        {"deliver_policy": api.DeliverPolicy.LAST_PER_SUBJECT},
        headers_only=headers_only,
        timeout=timeout,
    )


async def newest(
    nc: Any, stream: str, count: int, *, filters: Sequence[str] = (), timeout: float = 5.0
) -> list[Stored] | None:
    """The stream's last `count` messages (of those matching `filters`, counted back from
    the stream's last sequence), oldest first; None if there is no such stream."""
    try:
        info = await nc.jetstream().stream_info(stream)
    except NotFoundError:
        return None
    last = info.state.last_seq or 0
    if count <= 0 or last == 0:
        return []
    start = max(last - count + 1, info.state.first_seq or 1, 1)
    return await _read(
        nc,
        stream,
        filters or [">"],
        {"deliver_policy": api.DeliverPolicy.BY_START_SEQUENCE, "opt_start_seq": start},
        timeout=timeout,
    )


async def stored_since(
    nc: Any, stream: str, filters: Sequence[str], start: datetime, *, timeout: float = 5.0
) -> list[Stored] | None:
    """Every message of `stream` matching `filters` stored at or after `start`, in stream
    order; None if there is no such stream."""
    return await _read(
        nc,
        stream,
        filters,
        {
            "deliver_policy": api.DeliverPolicy.BY_START_TIME,
            "opt_start_time": start.astimezone(UTC),
        },
        timeout=timeout,
    )


async def stream_info(
    nc: Any, stream: str, request: dict[str, Any] | None = None, *, timeout: float = 5.0
) -> dict[str, Any] | None:
    """The server's own `STREAM.INFO` answer for `stream` (nats-py's leaves out fields, such
    as the first message's time, and pages of subjects); None if there is no such stream."""
    payload = json.dumps(request).encode() if request else b""
    msg = await nc.request(f"$JS.API.STREAM.INFO.{stream}", payload, timeout)
    reply: dict[str, Any] = json.loads(msg.data)
    error = reply.get("error")
    if error:
        if error.get("code") == 404:
            return None
        raise SnapshotError(f"stream {stream}: {error.get('description', error)}")
    return reply


async def subject_counts(
    nc: Any, stream: str, subjects_filter: str, *, timeout: float = 5.0
) -> dict[str, int] | None:
    """Each subject of `stream` matching `subjects_filter` with its message count, every
    page of the server's answer (it lists at most 100,000 subjects a page); None if there
    is no such stream."""
    out: dict[str, int] = {}
    offset = 0
    while True:
        request = {"subjects_filter": subjects_filter, "offset": offset}
        reply = await stream_info(nc, stream, request, timeout=timeout)
        if reply is None:
            return None
        page = (reply.get("state") or {}).get("subjects") or {}
        out.update(page)
        offset += len(page)
        if not page or offset >= int(reply.get("total") or 0):
            return out


async def _read(
    nc: Any,
    stream: str,
    filters: Sequence[str],
    policy: dict[str, Any],
    *,
    headers_only: bool = False,
    timeout: float,
) -> list[Stored] | None:
    """What an ephemeral push consumer with `policy` delivers up to the end of the stream
    as it stood when the consumer was created."""
    js = nc.jetstream()
    got: list[Stored] = []
    done = asyncio.Event()

    async def take(msg: Any) -> None:
        if not msg.reply:  # a status message (heartbeat), not a stored one
            return
        meta = msg.metadata
        got.append(
            Stored(
                subject=msg.subject,
                headers=dict(msg.headers) if msg.headers else None,
                data=msg.data or b"",
                seq=meta.sequence.stream,
                time=meta.timestamp,  # UTC
            )
        )
        if meta.num_pending == 0:
            done.set()

    inbox = nc.new_inbox()
    sub = await nc.subscribe(
        inbox, cb=take, pending_msgs_limit=_PENDING_LIMIT, pending_bytes_limit=-1
    )
    wanted = [f for f in filters if f != ">"]
    config = api.ConsumerConfig(
        deliver_subject=inbox,
        ack_policy=api.AckPolicy.NONE,
        filter_subject=wanted[0] if len(wanted) == 1 else None,
        filter_subjects=wanted if len(wanted) > 1 else None,
        headers_only=headers_only or None,
        mem_storage=True,
        num_replicas=1,
        inactive_threshold=30.0,
        **policy,
    )
    name: str | None = None
    try:
        try:
            info = await js.add_consumer(stream, config=config, timeout=timeout)
        except NotFoundError:
            return None
        name = info.name
        if not info.num_pending:
            return []
        seen = -1
        while not done.is_set():
            if len(got) == seen:
                raise SnapshotError(
                    f"stream {stream}: {seen} messages read, then nothing for {timeout}s"
                )
            seen = len(got)
            with contextlib.suppress(TimeoutError):
                await within(done.wait(), timeout)
        return got
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
        if name is not None:
            with contextlib.suppress(Exception):
                await js.delete_consumer(stream, name)


MULTI_LAST_CHUNK = 400
"""Filters per batched direct get: the server answers one with at most 1,024 messages
(`413 Too Many Results` past that), and a node's subject may be stored under a partition."""


async def last_stored_times(
    nc: Any, stream: str, filters: Sequence[str], *, timeout: float = 5.0
) -> dict[str, datetime]:
    """When the last message of each subject of `stream` matching one of `filters` was
    stored (subject -> UTC time), in batched direct gets of `MULTI_LAST_CHUNK` filters; the
    stream needs `allow_direct`. A chunk the server finds too big is read in halves."""
    out: dict[str, datetime] = {}
    pending = [
        list(filters[i : i + MULTI_LAST_CHUNK]) for i in range(0, len(filters), MULTI_LAST_CHUNK)
    ]
    while pending:
        chunk = pending.pop()
        got = await _multi_last(nc, stream, chunk, timeout)
        if got is None:
            if len(chunk) == 1:
                raise SnapshotError(f"stream {stream}: {chunk[0]} matches too many subjects")
            half = len(chunk) // 2
            pending += [chunk[:half], chunk[half:]]
            continue
        out.update(got)
    return out


async def _multi_last(
    nc: Any, stream: str, filters: list[str], timeout: float
) -> dict[str, datetime] | None:
    """One batched direct get; None when the server says it has too many results."""
    inbox = nc.new_inbox()
    got: dict[str, datetime] = {}
    status: list[str] = []
    done = asyncio.Event()

    async def take(msg: Any) -> None:
        headers = msg.headers or {}
        if headers.get("Status"):
            status.append(str(headers["Status"]))
            done.set()
            return
        subject, stamp = headers.get("Nats-Subject"), headers.get("Nats-Time-Stamp")
        if subject and stamp:
            got[str(subject)] = _stamp(str(stamp))

    sub = await nc.subscribe(inbox, cb=take, pending_msgs_limit=4096, pending_bytes_limit=-1)
    try:
        body = json.dumps({"multi_last": filters, "batch": 4096}).encode()
        await nc.publish(f"$JS.API.DIRECT.GET.{stream}", body, reply=inbox)
        try:
            await within(done.wait(), timeout)
        except TimeoutError as exc:
            raise SnapshotError(f"stream {stream}: no end of a direct get in {timeout}s") from exc
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
    if status and status[0] == "413":
        return None
    if status and status[0] not in ("204", "404"):  # 404: none of the subjects is stored
        raise SnapshotError(f"stream {stream}: direct get answered {status[0]}")
    return got


def _stamp(value: str) -> datetime:
    """A `Nats-Time-Stamp` (RFC 3339 with nanoseconds) as a UTC datetime (microseconds)."""
    head, _, frac = value.rstrip("Z").partition(".")
    micros = (frac + "000000")[:6]
    return datetime.fromisoformat(f"{head}.{micros}+00:00").astimezone(UTC)


def kv_filter(bucket: str, prefix: str) -> str:
    """The subject of a KV key prefix (`node.` -> `$KV.<bucket>.node.>`), or of one key."""
    return f"$KV.{bucket}.{prefix}>" if prefix.endswith(".") else f"$KV.{bucket}.{prefix}"


async def kv_entries(
    nc: Any, bucket: str, prefixes: Sequence[str], *, timeout: float = 5.0
) -> dict[str, bytes] | None:
    """Every live key of `bucket` under `prefixes` with its value, read in one pass; None
    if there is no such bucket."""
    stored = await last_per_subject(
        nc, f"KV_{bucket}", [kv_filter(bucket, p) for p in prefixes], timeout=timeout
    )
    return None if stored is None else kv_live(bucket, stored)


def kv_live(bucket: str, stored: Sequence[Stored]) -> dict[str, bytes]:
    """A bucket's live entries among its subjects' last messages (deleted and purged keys,
    and the server's markers, left out), by key."""
    head = f"$KV.{bucket}."
    out: dict[str, bytes] = {}
    for m in stored:
        h = m.headers or {}
        if h.get(_KV_OPERATION) in ("DEL", "PURGE") or _MARKER in h:
            continue
        out[m.subject.removeprefix(head)] = m.data
    return out


class Reads(Protocol):
    """The reads a picture of the fleet is made of: each subject's last message, those
    stored since a time, the newest few, which subjects a stream holds and how many messages
    each. `BusReads` asks the bus each time; `nodeward.bus.mirror.Mirrors` answers from
    streams it watches."""

    async def last(
        self, stream: str, filters: Sequence[str], *, headers_only: bool = False
    ) -> list[Stored] | None:
        """Each matching subject's last message, in stream order; None: no such stream."""
        ...

    async def since(
        self, stream: str, filters: Sequence[str], start: datetime
    ) -> list[Stored] | None:
        """At least each matching subject's newest message stored at or after `start`, in
        stream order (callers use only the newest of each subject)."""
        ...

    async def newest(
        self, stream: str, count: int, *, filters: Sequence[str] = ()
    ) -> list[Stored] | None:
        """The stream's last `count` messages (of those matching `filters`), oldest first."""
        ...

    async def subjects(self, stream: str, subjects_filter: str) -> set[str] | None:
        """The stream's subjects matching `subjects_filter`."""
        ...

    async def counts(self, stream: str, subjects_filter: str) -> dict[str, int] | None:
        """The stream's subjects matching `subjects_filter`, with how many messages each."""
        ...

    async def kv(self, bucket: str, prefixes: Sequence[str]) -> dict[str, bytes] | None:
        """The bucket's live entries under `prefixes`; None: no such bucket."""
        ...


@dataclass(slots=True)
class BusReads:
    """`Reads` that ask the bus each time: one ephemeral consumer (or one `STREAM.INFO`) per
    read, deleted when it is done. Right for a command that reads once (`nodeward status`)."""

    nc: Any

    async def last(
        self, stream: str, filters: Sequence[str], *, headers_only: bool = False
    ) -> list[Stored] | None:
        return await last_per_subject(self.nc, stream, filters, headers_only=headers_only)

    async def since(
        self, stream: str, filters: Sequence[str], start: datetime
    ) -> list[Stored] | None:
        return await stored_since(self.nc, stream, filters, start)

    async def newest(
        self, stream: str, count: int, *, filters: Sequence[str] = ()
    ) -> list[Stored] | None:
        return await newest(self.nc, stream, count, filters=filters)

    async def subjects(self, stream: str, subjects_filter: str) -> set[str] | None:
        got = await subject_counts(self.nc, stream, subjects_filter)
        return None if got is None else set(got)

    async def counts(self, stream: str, subjects_filter: str) -> dict[str, int] | None:
        return await subject_counts(self.nc, stream, subjects_filter)

    async def kv(self, bucket: str, prefixes: Sequence[str]) -> dict[str, bytes] | None:
        return await kv_entries(self.nc, bucket, prefixes)
