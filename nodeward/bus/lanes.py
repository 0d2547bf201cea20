"""Priority lanes: a consumer for the urgent messages of a stream, another for the rest.

A stream whose subjects carry a level as their second token (`notify.<severity>.…`,
`falco.<priority>.…`) mixes urgencies. One consumer over all of it hands a page, or a
Critical alert, to a handler only after everything stored before it: behind a flood of
low-level messages that is minutes. Split in two durables, the urgent one is never queued
behind the other; each keeps its own order, acks and retries.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence

URGENT_SUFFIX = "-urgent"


def split(
    subject: str, *, prefix: str, urgent: Sequence[str], other: Sequence[str]
) -> tuple[list[str], list[str]] | None:
    """(urgent, other) subjects that together cover `subject` (`<prefix>.<level>.…`), or
    None when its level cannot be told: not of that form, or a level in neither list."""
    tokens = subject.split(".")
    if len(tokens) < 2 or tokens[0] != prefix:
        return None
    level, rest = tokens[1], tokens[2:]
    if level == ">":
        level, rest = "*", [">"]

    def at(levels: Sequence[str]) -> list[str]:
        return [".".join([prefix, lvl, *rest]) for lvl in levels]

    if level == "*":
        return at(urgent), at(other)
    if level in urgent:
        return [subject], []
    if level in other:
        return [], [subject]
    return None


def lanes(
    consumer: str,
    subjects: Sequence[str],
    *,
    prefix: str,
    urgent: Sequence[str],
    other: Sequence[str],
    suffix: str = URGENT_SUFFIX,
) -> list[tuple[str, list[str]]]:
    """The consumers for `subjects`, (durable name, subjects): the urgent levels on
    `<consumer><suffix>`, the others on `<consumer>`; one consumer over everything when
    some subject's level cannot be told apart."""
    first: list[str] = []
    rest: list[str] = []
    for subject in subjects:
        parts = split(subject, prefix=prefix, urgent=urgent, other=other)
        if parts is None:
            return [(consumer, list(subjects))]
        first += [s for s in parts[0] if s not in first]
        rest += [s for s in parts[1] if s not in rest]
    found = [(consumer + suffix, first), (consumer, rest)]
    return [(name, lane) for name, lane in found if lane]


class UrgentFirst:
    """Within one process, low-priority work steps aside while urgent work is in hand.

    Two consumers keep an urgent message from being fetched behind a flood, but their
    handlers share one event loop: a CPU-bound flood makes every await of the urgent
    handler wait its turn behind the flood's. Low-priority work calls `await
    gate.clear()` before each step it can pause at (a handler's start, each action, an
    ingest's publish); urgent work runs `async with gate.urgent():`.
    """

    def __init__(self) -> None:
        self._urgent = 0
        self._idle = asyncio.Event()
        self._idle.set()

    @contextlib.asynccontextmanager
    async def urgent(self) -> AsyncIterator[None]:
        self._urgent += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._urgent -= 1
            if self._urgent == 0:
                self._idle.set()

    async def clear(self, at_most: float | None = None) -> None:
        """Returns once no urgent work is in hand (at once when none is), or after
        `at_most` seconds whatever is in hand."""
        if self._idle.is_set():
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(at_most):
                await self._idle.wait()

    @property
    def busy(self) -> bool:
        return self._urgent > 0
