"""The kernel's TtlCache: an answer is read once while fresh, again once stale, and the
oldest are forgotten past the cache's size."""

from __future__ import annotations

from services.kernel.cache import TtlCache


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_an_answer_is_read_once_while_fresh_and_again_when_stale() -> None:
    clock = Clock()
    reads: list[str] = []

    async def read(key: str) -> str | None:
        reads.append(key)
        return None  # a None answer is kept like any other

    cache = TtlCache[str, str | None](10.0, clock=clock)
    assert await cache.get("a", read) is None
    clock.now = 9.9
    assert await cache.get("a", read) is None
    assert reads == ["a"]
    clock.now = 10.0
    await cache.get("a", read)
    assert reads == ["a", "a"]


def test_past_its_size_the_oldest_tenth_is_forgotten() -> None:
    clock = Clock()
    cache = TtlCache[int, int](60.0, size=20, clock=clock)
    for i in range(21):
        clock.now = float(i)
        cache.put(i, i)
    assert cache.fresh(0) is None and cache.fresh(1) is None
    assert cache.fresh(2) == (2,) and cache.fresh(20) == (20,)
