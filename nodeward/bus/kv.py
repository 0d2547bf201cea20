"""KV helpers: revision-checked updates of typed state, and a lease for singleton loops."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import structlog
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue
from pydantic import BaseModel

from nodeward.bus.errors import BusError
from schemas.state.encoding import dump_record, load_record
from schemas.state.lease import LeaseRecord, lease_key

M = TypeVar("M", bound=BaseModel)


class ConflictError(BusError):
    """A revision-checked update kept losing to concurrent writers."""


@dataclass(frozen=True)
class Versioned(Generic[M]):
    value: M
    revision: int


class TypedKV(Generic[M]):
    """One bucket whose values are one pydantic model, updated with optimistic concurrency.

    `remember` > 0: keep the last value this instance read or wrote, for up to that many
    keys, so that an update of a key this instance mostly writes (a node in the partition a
    replica holds) starts from it instead of a read; a key it read as absent is created
    without another read (a create fails if anyone wrote it since). Nothing is believed on
    memory alone:
    the write is checked against the remembered revision (a conflict reads afresh), and a
    change that would write nothing is asked again on a fresh read before it is answered.
    """

    def __init__(self, kv: KeyValue, model: type[M], *, remember: int = 0) -> None:
        self.kv = kv
        self.model = model
        self.remember = remember
        self._memory: OrderedDict[str, Versioned[M]] = OrderedDict()
        self._absent: OrderedDict[str, None] = OrderedDict()

    async def get(self, key: str) -> Versioned[M] | None:
        try:
            entry = await self.kv.get(key)
        except KeyNotFoundError:
            self._forget(key)
            self._keep_absent(key)
            return None
        if entry.value is None:  # deleted: a create would fail on the tombstone's revision
            self._forget(key)
            return None
        found = Versioned(load_record(self.model, entry.value), entry.revision or 0)
        self._keep(key, found)
        return found

    async def put(self, key: str, value: M) -> int:
        self._forget(key)
        return int(await self.kv.put(key, dump_record(value)))

    async def update(
        self, key: str, change: Callable[[M | None], M | None], *, attempts: int = 20
    ) -> Versioned[M] | None:
        """Read, apply `change`, write only if nobody wrote in between; retry on conflict.

        `change` gets the current value (None if absent) and returns the new one, or None
        to leave the key as it is. It may be called several times: keep it pure.
        """
        for attempt in range(attempts):
            if attempt:  # lost a race: back off with jitter so contenders spread out
                await asyncio.sleep(random.uniform(0, 0.002 * 2 ** min(attempt, 7)))  # noqa: S311
            current = self._memory.get(key) if attempt == 0 else None
            new = change(current.value) if current is not None else None
            if new is None and attempt == 0 and key in self._absent:
                new = change(None)  # read as absent: a create fails if it is not any more
            if new is None:  # nothing remembered, or nothing to write on memory: read
                current = await self.get(key)
                new = change(current.value if current else None)
                if new is None:
                    return current
            data = dump_record(new)
            try:
                if current is None:
                    revision = await self.kv.create(key, data)
                else:
                    revision = await self.kv.update(key, data, last=current.revision)
            except KeyWrongLastSequenceError:
                self._forget(key)
                continue
            except Exception as exc:
                self._forget(key)
                if "wrong last sequence" in str(exc).lower() or "key exists" in str(exc).lower():
                    continue
                raise
            written = Versioned(new, int(revision))
            self._keep(key, written)
            return written
        raise ConflictError(
            f"KV {self.kv._name}/{key}: still conflicting after {attempts} attempts"
        )

    async def delete(self, key: str, *, revision: int | None = None) -> None:
        self._forget(key)
        with contextlib.suppress(KeyNotFoundError):
            await self.kv.delete(key, last=revision)

    def remembered(self, key: str) -> Versioned[M] | None:
        """The value this instance last read or wrote (`remember` > 0), if it still has it:
        what its own next write will be checked against, not a fresh read."""
        return self._memory.get(key)

    def _keep_absent(self, key: str) -> None:
        if self.remember > 0:
            self._absent[key] = None
            self._absent.move_to_end(key)
            while len(self._absent) > self.remember:
                self._absent.popitem(last=False)

    def _keep(self, key: str, value: Versioned[M]) -> None:
        self._absent.pop(key, None)
        if self.remember > 0:
            self._memory[key] = value
            self._memory.move_to_end(key)
            while len(self._memory) > self.remember:
                self._memory.popitem(last=False)

    def _forget(self, key: str) -> None:
        self._memory.pop(key, None)
        self._absent.pop(key, None)


class Lease:
    """A lease in a KV bucket: at most one holder at a time runs a singleton loop.

    The holder renews every `ttl/3`; a holder that stops renewing loses the lease after
    `ttl`. Every change is revision-checked, so two candidates never both win.
    """

    def __init__(self, kv: KeyValue, name: str, holder: str, *, ttl: float = 15.0) -> None:
        self.store: TypedKV[LeaseRecord] = TypedKV(kv, LeaseRecord)
        self.name = name
        self.holder = holder
        self.ttl = ttl
        self.log = structlog.get_logger().bind(lease=name, holder=holder)

    async def try_acquire(self) -> bool:
        """Take or renew the lease if it is free, expired or already ours."""
        now = time.time()

        def take(current: LeaseRecord | None) -> LeaseRecord | None:
            if current is not None and current.holder != self.holder and current.expires_at > now:
                return None
            ours = current is not None and current.holder == self.holder and not current.released
            acquired = current.acquired_at if current and ours else now
            return LeaseRecord(holder=self.holder, expires_at=now + self.ttl, acquired_at=acquired)

        try:
            result = await self.store.update(lease_key(self.name), take, attempts=3)
        except ConflictError:
            return False
        return (
            result is not None
            and result.value.holder == self.holder
            and result.value.expires_at > now
        )

    async def release(self, *, handover: bool = False) -> None:
        """Give the lease up if it is ours. `handover`: say the work under it stopped
        cleanly (the record stays, expired and `released`) instead of deleting it."""
        current = await self.store.get(lease_key(self.name))
        if current is not None and current.value.holder == self.holder:
            with contextlib.suppress(Exception):
                if handover:
                    done = current.value.model_copy(update={"expires_at": 0.0, "released": True})
                    await self.store.kv.update(
                        lease_key(self.name), done.model_dump_json().encode(), last=current.revision
                    )
                else:
                    await self.store.delete(lease_key(self.name), revision=current.revision)

    @contextlib.asynccontextmanager
    async def held(self, poll: float | None = None) -> AsyncIterator[asyncio.Event]:
        """Wait until this holder has the lease, keep renewing it while inside.

        Yields an event that is set if the lease is lost; the caller should stop its work then.
        """
        interval = poll or self.ttl / 3
        while not await self.try_acquire():  # noqa: ASYNC110 - polling state held elsewhere
            await asyncio.sleep(interval)
        self.log.info("lease.acquired")
        lost = asyncio.Event()

        async def renew() -> None:
            while True:
                await asyncio.sleep(interval)
                if not await self.try_acquire():
                    self.log.warning("lease.lost")
                    lost.set()
                    return

        task = asyncio.create_task(renew())
        try:
            yield lost
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await self.release()
            self.log.info("lease.released")
