"""The guard chain and the guards that are not limits, exemptions or the breaker.

Every guard declares its `Stage`; `GuardChain` orders them the kernel's way (exemptions,
staleness, dedup, cooldown, rate limits, circuit breaker, ownership) whatever order a
service lists them in, and the runner's dry-run comes after all of them.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import overload

import structlog
from nats.js.kv import KeyValue

from nodeward.bus.kv import TypedKV
from nodeward.durations import format_duration
from schemas.remediation import Outcome
from schemas.state.dedup import DedupRecord
from services.kernel.proposal import Guard, Proposal, Stage, Verdict

_KV_KEY = re.compile(r"[-/_=.a-zA-Z0-9]{1,200}")


class GuardChain(Sequence[Guard]):
    """Guards in the kernel's order: by `Stage`, a service's order kept within one stage.

    A guard that declares no stage is refused: it has no place in the chain.
    """

    def __init__(self, guards: Iterable[Guard] = ()) -> None:
        listed = list(guards)
        for guard in listed:
            if not isinstance(getattr(guard, "stage", None), Stage):
                raise TypeError(f"guard {guard!r} declares no Stage: it has no place in the chain")
        self._guards: tuple[Guard, ...] = tuple(sorted(listed, key=lambda g: g.stage))

    @classmethod
    def of(cls, guards: Iterable[Guard]) -> GuardChain:
        """`guards` as a chain (a chain is returned as it is)."""
        return guards if isinstance(guards, GuardChain) else cls(guards)

    def __iter__(self) -> Iterator[Guard]:
        return iter(self._guards)

    def __len__(self) -> int:
        return len(self._guards)

    @overload
    def __getitem__(self, index: int) -> Guard: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Guard]: ...
    def __getitem__(self, index: int | slice) -> Guard | Sequence[Guard]:
        return self._guards[index]

    def __repr__(self) -> str:
        return "GuardChain(" + ", ".join(f"{g.stage.name}:{g.name}" for g in self._guards) + ")"

    async def check(self, proposal: Proposal) -> Verdict | None:
        """The first objection in chain order, or None when every guard allows."""
        for guard in self._guards:
            verdict = await guard.check(proposal)
            if verdict is not None:
                return verdict
        return None


class Staleness:
    """A guard: the trigger is older than `max_age`, so it is not acted on (a replay after
    a cold start). Skipped and audited as `too_old`, the same way in every service.

    Age counts from `proposal.observed_at`, else `trigger_time`; a proposal with neither
    is never stale.
    """

    name = "too_old"
    stage = Stage.STALENESS

    def __init__(
        self,
        max_age: timedelta,
        *,
        setting: str = "max_event_age",
        applies: Callable[[Proposal], bool] | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.max_age = max_age
        self.setting = setting
        self.applies = applies
        self.clock = clock

    def age(self, proposal: Proposal) -> float | None:
        """Seconds since the trigger was observed, or None if the proposal does not say."""
        at = proposal.observed_at or proposal.trigger_time
        return None if at is None else (self.clock() - at).total_seconds()

    async def check(self, proposal: Proposal) -> Verdict | None:
        if self.applies is not None and not self.applies(proposal):
            return None
        age = self.age(proposal)
        if age is None or age <= self.max_age.total_seconds():
            return None
        return Verdict(
            self.name,
            f"ignored as stale: {proposal.reason} was observed {age:.0f}s ago, more than "
            f"{self.setting} {format_duration(self.max_age)}",
            Outcome.SKIPPED,
            details={"age_s": round(age, 1)},
        )


class DedupWindow:
    """The first of the same key within `window`, agreed by every replica: one KV key per
    key, updated with revision checks. The bucket's TTL should be at least `window`.

    The same `instance` again (a redelivery of the message that opened the window) is
    first again, so an idempotent handler runs once more; anything else is a repeat.
    """

    def __init__(
        self,
        kv: KeyValue,
        window: timedelta,
        *,
        prefix: str = "dedup",
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store: TypedKV[DedupRecord] = TypedKV(kv, DedupRecord)
        self.window = window
        self.prefix = prefix
        self.clock = clock

    def kv_key(self, key: str) -> str:
        """`key` itself when it is a valid KV key, else its hash, under `prefix`."""
        if _KV_KEY.fullmatch(key) and key.startswith(f"{self.prefix}."):
            return key
        return f"{self.prefix}." + hashlib.sha256(key.encode()).hexdigest()[:40]

    async def first(
        self, key: str, instance: str, *, content: str | None = None
    ) -> tuple[bool, DedupRecord]:
        """Whether `instance` is the first of `key` in the window (checked and recorded in
        one revision-checked update), and the window's record. Another `content` for the
        same key (something new about the same thing) opens a new window."""
        now = self.clock()
        first = True

        def change(current: DedupRecord | None) -> DedupRecord | None:
            nonlocal first
            if current is None or not self._open(current, now, content):
                first = True
                return DedupRecord(first=instance, first_seen=now, last_seen=now, content=content)
            if current.first == instance:
                first = True
                return None
            first = False
            return current.model_copy(update={"repeats": current.repeats + 1, "last_seen": now})

        result = await self.store.update(self.kv_key(key), change)
        assert result is not None
        return first, result.value

    async def repeat_of(self, key: str, *, content: str | None = None) -> DedupRecord | None:
        """The open window's record for `key` and `content`, if there is one (read only:
        for a caller that records with `mark` only once it has done the thing)."""
        current = await self.store.get(self.kv_key(key))
        if current is None or not self._open(current.value, self.clock(), content):
            return None
        return current.value

    async def mark(self, key: str, instance: str, *, content: str | None = None) -> None:
        """Open a new window for `key` with `instance` first."""
        now = self.clock()
        record = DedupRecord(first=instance, first_seen=now, last_seen=now, content=content)
        await self.store.put(self.kv_key(key), record)

    def _open(self, record: DedupRecord, now: float, content: str | None) -> bool:
        return now - record.first_seen <= self.window.total_seconds() and record.content == content


class Dedup:
    """A guard: the same `key(proposal)` within the window is acted on once. A repeat is
    skipped as `duplicate` quietly (logged and counted in KV, not audited again: the first
    was). `instance` tells a redelivery of the first (allowed again) from a repeat; by
    default the trigger event id. A proposal whose key is None is not judged.
    """

    stage = Stage.DEDUP

    def __init__(
        self,
        window: DedupWindow,
        key: Callable[[Proposal], str | None],
        *,
        instance: Callable[[Proposal], str | None] = lambda p: p.trigger_id,
        name: str = "duplicate",
    ) -> None:
        self.window = window
        self.key = key
        self.instance = instance
        self.name = name

    async def check(self, proposal: Proposal) -> Verdict | None:
        key = self.key(proposal)
        if key is None:
            return None
        instance = self.instance(proposal) or ""
        first, record = await self.window.first(key, instance)
        if first:
            return None
        structlog.get_logger().debug("action.duplicate", key=key, repeats=record.repeats)
        return Verdict(
            self.name,
            f"skipped: a repeat of {record.first} within {format_duration(self.window.window)} "
            f"({record.repeats} so far): {proposal.reason}",
            Outcome.SKIPPED,
            details={"duplicate_of": record.first, "repeats": record.repeats},
            quiet=True,
        )


OwnerOf = Callable[[Proposal], Awaitable[str | None]]


class Ownership:
    """A guard: nodeward undoes only what it did. `owner_of(proposal)` reads who made the
    change the proposal would undo (from the object's mark or the service's state: None
    when nobody recorded it); unless that is `owner`, the undo is skipped as `not_ours`.

    It judges undoing proposals only (`protective=False`) unless `applies` says otherwise.
    """

    name = "not_ours"
    stage = Stage.OWNERSHIP

    def __init__(
        self,
        owner: str,
        owner_of: OwnerOf,
        *,
        applies: Callable[[Proposal], bool] = lambda p: not p.protective,
    ) -> None:
        self.owner = owner
        self.owner_of = owner_of
        self.applies = applies

    async def check(self, proposal: Proposal) -> Verdict | None:
        if not self.applies(proposal):
            return None
        found = await self.owner_of(proposal)
        if found == self.owner:
            return None
        by = f"by {found}" if found else "by no one nodeward knows of"
        return Verdict(
            self.name,
            f"skipped: {proposal.action} of {proposal.target.key()} undoes a change made {by}, "
            f"not by {self.owner}; nodeward undoes only what it did",
            Outcome.SKIPPED,
            details={"owner": found},
        )
