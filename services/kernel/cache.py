"""A small cache of answers read from elsewhere (the Kubernetes API, say), each kept a while."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


@dataclass
class TtlCache(Generic[K, V]):
    """Answers by key, each fresh for `ttl` seconds of `clock`; past `size` answers the
    oldest tenth are forgotten."""

    ttl: float
    size: int = 10_000
    clock: Callable[[], float] = time.monotonic
    _kept: dict[K, tuple[float, V]] = field(default_factory=dict, init=False, repr=False)

    def fresh(self, key: K) -> tuple[V] | None:
        """The answer for `key` (in a 1-tuple: it may be None) while fresh, else None."""
        kept = self._kept.get(key)
        if kept is None or self.clock() - kept[0] >= self.ttl:
            return None
        return (kept[1],)

    def put(self, key: K, value: V, at: float | None = None) -> None:
        """Keep `value` for `key`, as read at `at` (by default now)."""
        self._kept[key] = (self.clock() if at is None else at, value)
        if len(self._kept) > self.size:
            for old in sorted(self._kept, key=lambda k: self._kept[k][0])[: self.size // 10]:
                del self._kept[old]

    async def get(self, key: K, read: Callable[[K], Awaitable[V]]) -> V:
        """The fresh answer for `key`, else `read(key)`'s (then kept)."""
        if (kept := self.fresh(key)) is not None:
            return kept[0]
        at = self.clock()
        value = await read(key)
        self.put(key, value, at)
        return value
