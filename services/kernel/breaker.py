"""A circuit breaker on the number of targets quarantined in a sliding window.

Unlike NVSentinel's, it only ever blocks protective actions (quarantine): releasing a
node that has recovered is never refused. The limit is the lower of a percentage of the
eligible nodes and an absolute count. Once tripped it refuses every new target until it
is reset through KV (`CircuitBreaker.reset`, or deleting the key) or, if configured, a
calm period after the trip has passed.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import structlog
from nats.js.kv import KeyValue
from prometheus_client import CollectorRegistry, Gauge
from pydantic import Field

from nodeward.bus import Bus
from nodeward.bus.dlq import one_line
from nodeward.bus.kv import TypedKV
from nodeward.config import Section
from nodeward.daemon import Daemon
from nodeward.durations import Duration
from nodeward.kube import Cluster
from schemas.remediation import Outcome
from schemas.state.breaker import BREAKER_KEY, SHARED, BreakerState
from services.kernel.proposal import Proposal, Stage, Verdict

if TYPE_CHECKING:
    from nodeward.handlers import Runtime

GPU_NODE_SELECTORS = (
    "nvidia.com/gpu.present=true",  # NVIDIA's GPU feature discovery
    "feature.node.kubernetes.io/amd-gpu=true",  # the AMD GPU operator's NFD rule
)
"""GPU nodes of either vendor (a label selector cannot say "or": one per vendor)."""


class BreakerSettings(Section):
    """Each service that removes nodes from service configures it; they share one window
    (KV `bucket`/`breaker`), so give them the same limits."""

    bucket: str = SHARED.name
    """KV bucket of the shared window (key `breaker`)"""
    max_percent: float = Field(default=20.0, gt=0, le=100)
    max_nodes: int = Field(default=5, ge=1)
    window: Duration = timedelta(minutes=10)
    calm_period: Duration | None = timedelta(minutes=30)
    """a tripped breaker closes by itself this long after tripping; None: only by reset"""
    node_selector: str | list[str] | None = Field(
        default_factory=lambda: list(GPU_NODE_SELECTORS),
        description="the nodes the percentage is of (a list: nodes matching any of them)",
    )


def limit_for(settings: BreakerSettings, population: int) -> int:
    """How many targets may be admitted within the window."""
    by_percent = math.ceil(population * settings.max_percent / 100.0 - 1e-9)
    return max(0, min(by_percent, settings.max_nodes))


def decide(
    state: BreakerState | None, settings: BreakerSettings, target: str, population: int, now: float
) -> tuple[BreakerState, bool]:
    """The new state and whether `target` is admitted. Pure: used inside a KV update
    (`state` is not changed: the new one is a shallow copy with a window of its own, not a
    deep copy, which made a batch of admissions quadratic in the window's size)."""
    state = state or BreakerState()
    horizon = now - settings.window.total_seconds()
    state = state.model_copy(
        update={"admitted": {t: at for t, at in state.admitted.items() if at >= horizon}}
    )
    if (
        state.tripped_at is not None
        and settings.calm_period is not None
        and now - state.tripped_at >= settings.calm_period.total_seconds()
    ):
        state.tripped_at, state.trip_reason = None, None
    if target in state.admitted:
        return state, True
    if state.tripped_at is not None:
        return state, False
    limit = limit_for(settings, population)
    if len(state.admitted) + 1 > limit:
        state.tripped_at = now
        state.trips += 1
        state.trip_reason = (
            f"{len(state.admitted)} of {population} nodes quarantined within "
            f"{settings.window}; limit {limit} ({settings.max_percent:g}% / {settings.max_nodes})"
        )
        return state, False
    state.admitted[target] = now
    return state, True


class NodePopulation:
    """How many nodes the breaker's percentage is of, read through the kube port. Several
    selectors add up (one GPU vendor to a node). With no node matching (no GPU feature
    discovery) it counts every node: a limit of 0 would refuse everything.

    Kept off the fault's path: `keep_fresh` (a daemon task) counts at start and every
    `ttl` after, so a storm after a quiet hour finds a fresh count; a count older than
    `ttl` is still answered while a background read renews it (even a metadata-only list
    took seconds at 5,000 nodes on the sim cluster). Only with no count yet, or one older
    than `max_stale` (the reads keep failing), does a caller wait for the list."""

    def __init__(
        self,
        count: Callable[[str | None], Awaitable[int]],
        selector: str | list[str] | None,
        *,
        ttl: float = 30.0,
        max_stale: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.count = count
        self.selector = selector
        self.ttl = ttl
        self.max_stale = max_stale if max_stale is not None else 10 * ttl
        self.clock = clock
        self._cached: tuple[float, int] | None = None
        self._reading: asyncio.Task[int] | None = None

    def prime(self) -> None:
        """Start counting now, in the background, so the first quarantine need not wait."""
        self._renew()

    async def keep_fresh(self) -> None:
        """Count now and every `ttl` after, until cancelled (a failed read is logged and
        tried again next time)."""
        try:
            while True:
                with contextlib.suppress(Exception):  # logged by `_settled`
                    await asyncio.shield(self._renew())
                await asyncio.sleep(self.ttl)
        finally:  # stopping: a read in flight is not left pending behind the daemon
            if self._reading is not None and not self._reading.done():
                self._reading.cancel()

    async def __call__(self) -> int:
        now = self.clock()
        if self._cached is not None:
            at, value = self._cached
            if now - at < self.ttl:
                return value
            if now - at < self.max_stale:
                self._renew()
                return value
        return await asyncio.shield(self._renew())

    def _renew(self) -> asyncio.Task[int]:
        if self._reading is None or self._reading.done():
            self._reading = asyncio.create_task(self._read(), name="breaker-population")
            self._reading.add_done_callback(self._settled)
        return self._reading

    @staticmethod
    def _settled(task: asyncio.Task[int]) -> None:
        error = None if task.cancelled() else task.exception()
        if error is not None:
            structlog.get_logger().warning("breaker.population_unread", error=one_line(error))

    async def _read(self) -> int:
        began = time.monotonic()
        selectors = [self.selector] if isinstance(self.selector, str) else self.selector or []
        count = sum([await self.count(s) for s in selectors])
        if not selectors:
            count = await self.count(None)
        elif count == 0:
            structlog.get_logger().warning(
                "breaker.selector_matches_nothing", selector=self.selector
            )
            count = await self.count(None)
        self._cached = (self.clock(), count)
        structlog.get_logger().debug(
            "breaker.population_counted", nodes=count, seconds=round(time.monotonic() - began, 3)
        )
        return count


class CircuitBreaker:
    """A guard backed by one KV key, shared by every replica (revision-checked updates)."""

    name = "circuit_breaker"
    stage = Stage.BREAKER

    def __init__(
        self,
        kv: KeyValue,
        settings: BreakerSettings,
        population: Callable[[], Awaitable[int]],
        *,
        key: str = BREAKER_KEY,
        clock: Callable[[], float] = time.time,
        registry: CollectorRegistry | None = None,
    ) -> None:
        # Its last write remembered: the next admission starts from it, not a read (another
        # replica's write since makes it a conflict, which reads afresh).
        self.store: TypedKV[BreakerState] = TypedKV(kv, BreakerState, remember=1)
        self.settings = settings
        self.population = population
        self.key = key
        self.clock = clock
        # Admissions in this replica are committed together: whoever holds the turn
        # decides every admission waiting, in arrival order, in one revision-checked write
        # (a storm of 50 faults at 5,000 nodes queued for seconds behind one write each);
        # only replicas contend on the key then.
        self._turn = asyncio.Lock()
        self._waiting: list[tuple[str, asyncio.Future[tuple[bool, BreakerState]]]] = []
        self.tripped = Gauge(
            "nodeward_breaker_tripped",
            "1 while the circuit breaker refuses new targets",
            registry=registry,
        )
        self.admitted = Gauge(
            "nodeward_breaker_admitted",
            "Targets admitted within the sliding window",
            registry=registry,
        )

    async def state(self) -> BreakerState:
        current = await self.store.get(self.key)
        return current.value if current else BreakerState()

    async def admit(self, target: str) -> tuple[bool, BreakerState]:
        """Whether `target` is admitted, and the window after. Concurrent admissions of this
        replica share one KV write (decided one after another, in the order they came)."""
        population = await self.population()
        mine: asyncio.Future[tuple[bool, BreakerState]] = asyncio.get_running_loop().create_future()
        self._waiting.append((target, mine))
        async with self._turn:
            if not mine.done():  # no earlier turn took it: this one decides all waiting
                await self._commit(population, mine)
        return mine.result()

    async def _commit(
        self, population: int, mine: asyncio.Future[tuple[bool, BreakerState]]
    ) -> None:
        batch = [(t, f) for t, f in self._waiting if not f.done()]
        self._waiting = []
        decided: dict[str, bool] = {}

        def change(current: BreakerState | None) -> BreakerState:
            decided.clear()
            state = current or BreakerState()
            for target, _ in batch:
                state, decided[target] = decide(
                    state, self.settings, target, population, self.clock()
                )
            return state

        others = [(t, f) for t, f in batch if f is not mine]
        try:
            result = await self.store.update(self.key, change)
        except asyncio.CancelledError:
            # This turn's handler was cancelled: the next turn decides the others (if this
            # write landed, it finds them admitted already).
            self._waiting[:0] = others
            raise
        except Exception as exc:
            for _, future in others:  # they would each have failed the same way
                future.set_exception(exc)
            raise
        assert result is not None
        self.tripped.set(1 if result.value.tripped_at is not None else 0)
        self.admitted.set(len(result.value.admitted))
        for target, future in batch:
            future.set_result((decided[target], result.value))

    async def reset(self) -> None:
        """Close the breaker and forget the window (an operator's command)."""
        await self.store.put(self.key, BreakerState())
        structlog.get_logger().warning("breaker.reset", key=self.key)

    async def check(self, proposal: Proposal) -> Verdict | None:
        if not proposal.protective:
            return None  # releasing is never blocked
        admitted, state = await self.admit(proposal.target.key())
        if admitted:
            return None
        return Verdict(
            self.name,
            f"refused by the circuit breaker: {state.trip_reason or 'tripped'}; reset it to resume",
            Outcome.REFUSED,
        )


async def node_breaker(
    bus: Bus,
    cluster: Cluster,
    settings: BreakerSettings,
    *,
    registry: CollectorRegistry | None = None,
    ttl: float = 30.0,
    daemon: Daemon | None = None,
) -> CircuitBreaker:
    """The shared breaker as a service that removes nodes uses it: its window in KV
    (`settings.bucket`), its population the cluster's nodes that match `node_selector`,
    counted by a `daemon` task every `ttl` (without a daemon: once, at once)."""

    async def count(selector: str | None) -> int:
        return await cluster.nodes.count(label_selector=selector)

    population = NodePopulation(count, settings.node_selector, ttl=ttl)
    if daemon is not None:
        daemon.add_task(population.keep_fresh, name="breaker-population")
    else:
        population.prime()
    return CircuitBreaker(
        await bus.kv(settings.bucket, history=5), settings, population, registry=registry
    )


async def breaker_for(rt: Runtime[Any]) -> CircuitBreaker:
    """`node_breaker` for a service declared with `nodeward.handlers`: its section's
    `breaker` settings, its cluster's nodes counted by a task of its daemon."""
    return await node_breaker(
        rt.bus, rt.acting, rt.config.breaker, registry=rt.daemon.metrics.registry, daemon=rt.daemon
    )
