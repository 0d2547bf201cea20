"""Rate limits (a token bucket) and cooldowns against flapping."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import KW_ONLY, dataclass, field
from datetime import timedelta

from pydantic import Field

from nodeward.config import Section
from nodeward.durations import Duration, format_duration
from schemas.remediation import Outcome
from services.kernel.proposal import Proposal, Stage, Verdict


class RateLimitSettings(Section):
    """At most `per_minute` protective actions a minute, in bursts of `burst`."""

    per_minute: float = Field(default=30.0, gt=0)
    burst: int = Field(default=10, ge=1)
    max_wait: Duration = timedelta(seconds=5)
    """how long an action waits for a token before it is refused and retried"""


class RateLimiter:
    """A guard: a token bucket per replica. An action that waits longer than `max_wait` is
    refused (audited) and retried later through redelivery."""

    name = "rate_limit"
    stage = Stage.RATE_LIMIT

    def __init__(
        self, settings: RateLimitSettings, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.settings = settings
        self.clock = clock
        self.tokens = float(settings.burst)
        self.updated = clock()
        self._lock = asyncio.Lock()

    def _refill(self) -> None:
        now = self.clock()
        rate = self.settings.per_minute / 60.0
        self.tokens = min(float(self.settings.burst), self.tokens + (now - self.updated) * rate)
        self.updated = now

    def wait_time(self) -> float:
        """Seconds until a token is available (0 if one is)."""
        self._refill()
        missing = 1.0 - self.tokens
        return 0.0 if missing <= 0 else missing * 60.0 / self.settings.per_minute

    async def acquire(self, max_wait: float) -> bool:
        async with self._lock:
            wait = self.wait_time()
            if wait > max_wait:
                return False
            if wait > 0:
                await asyncio.sleep(wait)
                self._refill()
            self.tokens -= 1.0
            return True

    async def check(self, proposal: Proposal) -> Verdict | None:
        if not proposal.protective:
            return None
        if await self.acquire(self.settings.max_wait.total_seconds()):
            return None
        wait = self.wait_time()
        return Verdict(
            self.name,
            f"refused: {refusal(self.settings, proposal.action)}; retried in {wait:.0f}s",
            Outcome.REFUSED,
            retry_after=max(wait, 1.0),
        )


def refusal(settings: RateLimitSettings, action: str) -> str:
    """Why the bucket is empty, in the limits a reader set: the burst was spent, and it
    refills at `per_minute`."""
    return (
        f"the burst of {settings.burst} {action} actions is spent, refilling at "
        f"{settings.per_minute:g} a minute"
    )


LastAction = Callable[[Proposal], Awaitable[float | None]]


@dataclass(eq=False)
class Cooldown:
    """A guard against flapping: no second action on a target within `period` of the last.

    `last(proposal)` reads when the target was last acted on (unix time, from the
    service's own state); `applies` picks the proposals it judges (all by default). The
    objection is a refusal retried once the period is over (`retry`), or not retried.
    """

    name = "cooldown"
    stage = Stage.COOLDOWN

    period: timedelta
    _: KW_ONLY
    last: LastAction | None = None
    applies: Callable[[Proposal], bool] | None = None
    retry: bool = True
    clock: Callable[[], float] = time.time

    def remaining(self, last_action_at: float | None, now: float) -> float:
        """Seconds left in the cooldown (0 when the target may be acted on)."""
        if last_action_at is None:
            return 0.0
        return max(0.0, last_action_at + self.period.total_seconds() - now)

    async def check(self, proposal: Proposal) -> Verdict | None:
        if self.last is None or (self.applies is not None and not self.applies(proposal)):
            return None
        now = self.clock()
        last = await self.last(proposal)
        left = self.remaining(last, now)
        if left <= 0 or last is None:
            return None
        return Verdict(
            self.name,
            f"refused: {proposal.target.key()} was acted on {now - last:.0f}s ago, within "
            f"the cooldown of {format_duration(self.period)}; {left:.0f}s left",
            Outcome.REFUSED,
            retry_after=max(left, 1.0) if self.retry else None,
            details={"cooldown_left_s": round(left, 1)},
        )


@dataclass(eq=False)
class KeyedRateLimiter:
    """A guard: one token bucket per key (a pod, a rule, ...), so one noisy key cannot use
    up everyone's actions. Over the limit an action is refused (audited) at once, without
    waiting and without a retry: the next alert for that key is judged afresh.

    Buckets that have refilled are forgotten once there are more than `max_keys`.
    It judges protective proposals unless `applies` says otherwise.
    """

    stage = Stage.RATE_LIMIT

    name: str
    settings: RateLimitSettings
    key: Callable[[Proposal], str | None]
    _: KW_ONLY
    what: str
    clock: Callable[[], float] = time.monotonic
    max_keys: int = 10_000
    applies: Callable[[Proposal], bool] = lambda p: p.protective
    _buckets: dict[str, RateLimiter] = field(default_factory=dict, init=False, repr=False)

    def _bucket(self, key: str) -> RateLimiter:
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) >= self.max_keys:
                for k, b in list(self._buckets.items()):
                    if b.wait_time() == 0 and b.tokens >= b.settings.burst:
                        del self._buckets[k]
            bucket = self._buckets[key] = RateLimiter(self.settings, clock=self.clock)
        return bucket

    async def check(self, proposal: Proposal) -> Verdict | None:
        if not self.applies(proposal):
            return None
        key = self.key(proposal)
        if key is None:
            return None
        if await self._bucket(key).acquire(0.0):
            return None
        return Verdict(
            self.name,
            f"refused for {self.what} {key}: {refusal(self.settings, proposal.action)}",
            Outcome.REFUSED,
        )
