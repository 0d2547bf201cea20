"""Health of one daemon: named readiness checks, and a monitor of event-loop liveness."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from nodeward.aio import within

ReadinessCheck = Callable[[], bool | Awaitable[bool]]
"""A check such as "bus connected": returns (or resolves to) True when it passes."""


@dataclass(frozen=True, slots=True)
class CheckResult:
    name: str
    ok: bool
    error: str | None = None


@dataclass(frozen=True, slots=True)
class ReadinessReport:
    """The outcome of every readiness check, in the order they were added."""

    results: tuple[CheckResult, ...]

    @property
    def ready(self) -> bool:
        return all(r.ok for r in self.results)

    @property
    def failing(self) -> list[str]:
        return [r.name for r in self.results if not r.ok]

    def to_json(self) -> dict[str, Any]:
        return {
            "status": "ready" if self.ready else "not ready",
            "checks": {r.name: r.ok for r in self.results},
            "failing": self.failing,
            "errors": {r.name: r.error for r in self.results if r.error},
        }


class Readiness:
    """Named readiness checks; a check that raises or times out counts as failing."""

    def __init__(self, timeout: float = 2.0) -> None:
        self.timeout = timeout
        self._checks: dict[str, ReadinessCheck] = {}

    def add(self, name: str, check: ReadinessCheck) -> None:
        if name in self._checks:
            raise ValueError(f"readiness check {name!r} is already registered")
        self._checks[name] = check

    def remove(self, name: str) -> None:
        self._checks.pop(name, None)

    @property
    def names(self) -> list[str]:
        return list(self._checks)

    async def evaluate(self) -> ReadinessReport:
        """Run every check concurrently, each bounded by `timeout`."""
        results = await asyncio.gather(*(self._run(n, c) for n, c in list(self._checks.items())))
        return ReadinessReport(tuple(results))

    async def _run(self, name: str, check: ReadinessCheck) -> CheckResult:
        try:
            value: Any = check()
            if inspect.isawaitable(value):
                value = await within(value, self.timeout)
        except TimeoutError:
            return CheckResult(name, False, f"timed out after {self.timeout:g}s")
        except Exception as exc:  # noqa: BLE001 - a failing check is "not ready", not a crash
            return CheckResult(name, False, f"{type(exc).__name__}: {exc}".replace("\n", " "))
        return CheckResult(name, bool(value))


class LoopMonitor:
    """A heartbeat that measures how late the event loop runs it.

    The loop counts as wedged when the last heartbeat woke more than `max_lag` seconds
    late (something blocked the loop), or when no heartbeat has run for `max_lag`
    seconds past its due time (the loop is starved or the heartbeat died).
    """

    def __init__(
        self,
        interval: float = 1.0,
        max_lag: float = 10.0,
        on_beat: Callable[[float], None] | None = None,
    ) -> None:
        self.interval = interval
        self.max_lag = max_lag
        self.lag = 0.0
        self._on_beat = on_beat
        self._last_beat: float | None = None

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        self._last_beat = loop.time()
        while True:
            due = loop.time() + self.interval
            await asyncio.sleep(self.interval)
            now = loop.time()
            self.lag = max(0.0, now - due)
            self._last_beat = now
            if self._on_beat is not None:
                self._on_beat(self.lag)

    def problem(self) -> str | None:
        """Why the loop counts as wedged now, or None."""
        if self._last_beat is None:
            return None
        overdue = asyncio.get_running_loop().time() - self._last_beat - self.interval
        if overdue > self.max_lag:
            return f"event loop heartbeat is {overdue:.2f}s overdue"
        if self.lag > self.max_lag:
            return f"event loop was blocked for {self.lag:.2f}s"
        return None
