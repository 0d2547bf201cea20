"""Keeping daemons that share one process running: `nodeward up` restarts a daemon that dies.

A `Unit` is the daemons one component builds together. When one of them stops on its own
(a task failed), the `Supervisor` stops the unit's others, waits its back-off, builds the
unit again (a `Daemon` runs once) and starts the fresh daemons on their predecessors'
ports. After `limit` restarts within `window` it gives up on that unit, and the rest keep
running. The `core` daemons are not restarted: one stopping stops everything, as do
SIGINT and SIGTERM. A unit can be suspended (its daemons stopped, not as a death: nothing
restarts them) and resumed (built again, started on its old ports): the simulated agents of
a node whose machine is hung or off.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from nodeward.aio import any_set, cancel_all
from nodeward.config import RestartSettings
from nodeward.daemon import Daemon, DaemonError, install_signal_handlers
from schemas.common import ObjectRef
from schemas.remediation import Outcome, Remediation

ACTOR = "nodeward/up"


@dataclass(frozen=True)
class RestartPolicy:
    """Back-off before each restart (`backoff`, doubling to `backoff_max`, by the number of
    deaths within `window`), and at most `limit` restarts within `window`."""

    backoff: float = 1.0
    backoff_max: float = 30.0
    limit: int = 5
    window: float = 600.0

    @classmethod
    def of(cls, settings: RestartSettings) -> RestartPolicy:
        return cls(
            backoff=settings.backoff.total_seconds(),
            backoff_max=settings.backoff_max.total_seconds(),
            limit=settings.limit,
            window=settings.window.total_seconds(),
        )


@dataclass(frozen=True)
class Decision:
    """What to do about a death: restart after `delay` seconds, or give up."""

    restart: bool
    delay: float
    count: int
    """Deaths within the window, this one included: the restart's number when restarting."""


def decide(policy: RestartPolicy, deaths: Iterable[float], now: float) -> Decision:
    """The decision for a death at `now`, given the earlier deaths' times (pure)."""
    count = 1 + sum(1 for t in deaths if now - t < policy.window)
    if count > policy.limit:
        return Decision(False, 0.0, count)
    return Decision(True, min(policy.backoff * 2 ** (count - 1), policy.backoff_max), count)


@dataclass
class Restarts:
    """The deaths of one unit, kept for one window; `died(now)` decides each."""

    policy: RestartPolicy
    deaths: deque[float] = field(default_factory=deque)

    def died(self, now: float) -> Decision:
        while self.deaths and now - self.deaths[0] >= self.policy.window:
            self.deaths.popleft()
        decision = decide(self.policy, self.deaths, now)
        self.deaths.append(now)
        return decision


def ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th, 11th, 21st."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def span(seconds: float) -> str:
    """A window in words: `10 min`, `90 s`."""
    return f"{seconds / 60:g} min" if seconds >= 60 and seconds % 60 == 0 else f"{seconds:g} s"


@dataclass(frozen=True)
class Restart:
    """A unit `up` restarted, or gave up on."""

    unit: str
    cause: str
    """Why it died, one line: `task consume failed: RuntimeError: boom`."""
    count: int
    window_s: float
    gave_up: bool = False
    down_s: float = 0.0
    urls: dict[str, str] = field(default_factory=dict)
    """The fresh daemons' base URLs (none when given up)."""

    @property
    def result(self) -> str:
        """What `up` did about it, in words."""
        if self.gave_up:
            done = self.count - 1
            return (
                f"gave up after {done} restart{'' if done == 1 else 's'} in {span(self.window_s)}; "
                "the rest keep running"
            )
        return f"restarted ({ordinal(self.count)} time in {span(self.window_s)})"

    def audit(self) -> Remediation:
        return restart_audit(
            self.unit,
            self.cause,
            self.result,
            gave_up=self.gave_up,
            details={
                "restarts": self.count if not self.gave_up else self.count - 1,
                "window_s": self.window_s,
                "down_s": round(self.down_s, 3),
                "urls": self.urls,
            },
        )


def restart_audit(
    name: str,
    cause: str,
    result: str,
    *,
    gave_up: bool = False,
    details: dict[str, Any] | None = None,
) -> Remediation:
    """The audit record of `up` restarting `name` (a daemon, or its nats-server): why it died
    (`reason`) and what `up` did (`details.result`); outcome `failed` when it gave up."""
    return Remediation(
        action="restart",
        target=ObjectRef(kind="Daemon", name=name),
        outcome=Outcome.FAILED if gave_up else Outcome.APPLIED,
        reason=cause,
        actor=ACTOR,
        details={"result": result, **(details or {})},
    )


@dataclass
class Unit:
    """Daemons built, and rebuilt, together: a component's, or one simulated agent's."""

    name: str
    build: Callable[[], Awaitable[list[Daemon]]]
    daemons: list[Daemon] = field(default_factory=list)


class Supervisor:
    """Runs `core` daemons and `units` until SIGINT/SIGTERM or a core daemon stops, restarting
    a unit whose daemon dies (see the module). `on_restart` hears of each restart and each
    unit given up (it must not block)."""

    def __init__(
        self,
        core: Sequence[Daemon],
        units: Sequence[Unit],
        policy: RestartPolicy,
        *,
        on_restart: Callable[[Restart], None] = lambda _: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.core = list(core)
        self.units = list(units)
        self.policy = policy
        self.on_restart = on_restart
        self.clock = clock
        self.given_up: dict[str, str] = {}
        """Unit name -> why its last daemon died."""
        self.suspended: dict[str, dict[str, int]] = {}
        """Unit name -> its daemons' ports, while suspended."""
        self._watchers: dict[str, asyncio.Task[None]] = {}
        self._running = False
        self.log = structlog.get_logger().bind(component="supervisor")

    @property
    def daemons(self) -> list[Daemon]:
        """The daemons running now (or being restarted), core first, in the units' order."""
        return [*self.core, *(d for u in self.units for d in u.daemons)]

    async def run(
        self, *, handle_signals: bool = True, signalled: asyncio.Event | None = None
    ) -> None:
        """Start what is not started yet, run until a signal or a core daemon stops, then stop
        everything (each daemon within its own timeout). Raises `DaemonError` if a daemon
        failed to start or a core daemon's task failed.

        `signalled`: set by the caller's own signal handlers (installed before it built the
        daemons, so a signal during the build stops them as well); set already, nothing runs."""
        signalled = signalled or asyncio.Event()
        remove = (
            install_signal_handlers(lambda _: signalled.set()) if handle_signals else (lambda: None)
        )
        try:
            for daemon in self.daemons:
                if not daemon.started:
                    await daemon.start()
            self._running = True
            for unit in self.units:
                if unit.name not in self.suspended:
                    self._supervise(unit)
            await any_set([*(d.stopping for d in self.core), signalled])
        finally:
            self._running = False
            await cancel_all(list(self._watchers.values()))
            self._watchers.clear()
            await asyncio.gather(*(d.stop() for d in self.daemons))
            remove()
        failed = [d for d in self.core if d.failure is not None]
        if failed:
            d = failed[0]
            raise DaemonError(f"{d.name}: {type(d.failure).__name__}: {d.failure}") from d.failure

    def _supervise(self, unit: Unit) -> None:
        self._watchers[unit.name] = asyncio.create_task(
            self._watch(unit), name=f"supervise:{unit.name}"
        )

    def unit(self, name: str) -> Unit | None:
        return next((u for u in self.units if u.name == name), None)

    async def suspend(self, name: str) -> bool:
        """Stop unit `name`'s daemons without restarting them, until `resume(name)`. False
        when there is no such unit, or it is suspended or given up already."""
        unit = self.unit(name)
        if unit is None or name in self.suspended or name in self.given_up:
            return False
        watcher = self._watchers.pop(name, None)
        if watcher is not None:
            await cancel_all([watcher])
        self.suspended[name] = {d.name: d.port for d in unit.daemons if _bound(d)}
        daemons, unit.daemons = unit.daemons, []
        await asyncio.gather(*(d.stop() for d in daemons))
        self.log.info("up.suspended", unit=name)
        return True

    async def resume(self, name: str) -> bool:
        """Build a suspended unit again and start it on its old ports (where free), watched
        as before. False when it is not suspended; raises what its build or start raised
        (it stays suspended then)."""
        unit = self.unit(name)
        ports = self.suspended.get(name)
        if unit is None or ports is None:
            return False
        daemons = await unit.build()
        try:
            for daemon in daemons:
                await _start(daemon, ports.get(daemon.name))
        except BaseException:
            await asyncio.gather(*(d.stop() for d in daemons), return_exceptions=True)
            raise
        unit.daemons = daemons
        del self.suspended[name]
        if self._running:
            self._supervise(unit)
        self.log.info("up.resumed", unit=name)
        return True

    async def _watch(self, unit: Unit) -> None:
        """Until cancelled: wait for one of the unit's daemons to stop, then restart the unit
        (or give up on it)."""
        restarts = Restarts(self.policy)
        log = self.log.bind(unit=unit.name)
        while True:
            dead = await _first_to_stop(unit.daemons)
            died = self.clock()
            cause = dead.stop_cause or "stopped"
            while True:
                ports = {d.name: d.port for d in unit.daemons if _bound(d)}
                await asyncio.gather(*(d.stop() for d in unit.daemons))
                decision = restarts.died(self.clock())
                if not decision.restart:
                    unit.daemons = []
                    self.given_up[unit.name] = cause
                    report = Restart(unit.name, cause, decision.count, self.policy.window, True)
                    log.error("up.gave_up", cause=cause, result=report.result)
                    self._tell(report)
                    return
                log.warning("up.restarting", cause=cause, count=decision.count, in_s=decision.delay)
                await asyncio.sleep(decision.delay)  # the back-off itself
                try:
                    unit.daemons = await unit.build()
                    for daemon in unit.daemons:
                        await _start(daemon, ports.get(daemon.name))
                except Exception as exc:  # noqa: BLE001 - a failed restart is one more death
                    cause = f"restart failed: {type(exc).__name__}: {' '.join(str(exc).split())}"
                    log.warning("up.restart_failed", error=cause)
                    continue
                break
            report = Restart(
                unit.name,
                cause,
                decision.count,
                self.policy.window,
                down_s=self.clock() - died,
                urls={d.name: d.url for d in unit.daemons},
            )
            log.warning(
                "up.restarted", cause=cause, result=report.result, down_s=round(report.down_s, 3)
            )
            self._tell(report)

    def _tell(self, report: Restart) -> None:
        try:
            self.on_restart(report)
        except Exception as exc:  # noqa: BLE001 - reporting must not end the supervision
            self.log.warning("up.restart_unreported", unit=report.unit, error=str(exc))


def _bound(daemon: Daemon) -> bool:
    try:
        return daemon.port > 0
    except DaemonError:
        return False


async def _start(daemon: Daemon, port: int | None) -> None:
    """Start on `port` (the predecessor's) if given and free, else on the settings' port."""
    if port is not None:
        try:
            await daemon.start(port=port)
            return
        except DaemonError:
            pass  # taken meanwhile: any port will do, endpoints.json says which
    await daemon.start()


async def _first_to_stop(daemons: Sequence[Daemon]) -> Daemon:
    """The first of `daemons` to stop (waits until cancelled if there are none)."""
    if not daemons:
        await asyncio.Future()  # nothing to watch
    waiters = {asyncio.ensure_future(d.stopping.wait()): d for d in daemons}
    try:
        done, _ = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
    return waiters[next(iter(done))]
