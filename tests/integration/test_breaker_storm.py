"""The circuit breaker in a storm: many handlers of one replica admit at once. Exactly the
limit is admitted, the rest refused, and each admission is decided once: the replica's
waiting admissions are committed together, a few KV writes for the storm instead of one
each (or a race into revision conflicts)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from nodeward.bus import Bus
from services.kernel import breaker as breaker_module
from services.kernel.breaker import BreakerSettings, CircuitBreaker
from tests.conftest import wait_for


async def test_a_storm_of_admissions_decides_each_once(
    bus: Bus, monkeypatch: pytest.MonkeyPatch
) -> None:
    decided: list[str] = []
    decide = breaker_module.decide

    def counted(*args: object, **kwargs: object) -> object:
        decided.append(str(args[2]))
        return decide(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(breaker_module, "decide", counted)
    settings = BreakerSettings(max_nodes=30, max_percent=100)

    async def population() -> int:
        return 5000

    breaker = CircuitBreaker(await bus.kv(f"b{uuid.uuid4().hex[:8]}"), settings, population)
    nodes = [f"node/gpu-{i}" for i in range(50)]
    results = await asyncio.gather(*(breaker.admit(n) for n in nodes))
    admitted = [n for n, (ok, _) in zip(nodes, results, strict=True) if ok]
    assert len(admitted) == 30
    state = await breaker.state()
    assert sorted(state.admitted) == sorted(admitted)
    assert state.tripped_at is not None
    assert sorted(decided) == sorted(nodes)  # no admission decided twice (no conflict)
    entry = await breaker.store.kv.get(breaker.key)
    assert entry.revision is not None and entry.revision <= 5  # the only key: writes made


async def test_a_turn_cancelled_mid_write_leaves_the_others_decided(bus: Bus) -> None:
    settings = BreakerSettings(max_nodes=30, max_percent=100)

    async def population() -> int:
        return 5000

    breaker = CircuitBreaker(await bus.kv(f"b{uuid.uuid4().hex[:8]}"), settings, population)
    update, gate, writing = breaker.store.update, asyncio.Event(), asyncio.Event()

    async def held(*args: Any, **kwargs: Any) -> Any:
        if not gate.is_set():  # the first turn's write hangs until cancelled
            writing.set()
            await gate.wait()
        return await update(*args, **kwargs)

    breaker.store.update = held  # type: ignore[method-assign]
    async with breaker._turn:  # all three wait: the first turn takes them in one batch
        tasks = [asyncio.create_task(breaker.admit(f"node/gpu-{n}")) for n in "abc"]
        await wait_for(lambda: len(breaker._waiting) == 3, timeout=5, what="all three waiting")
    await asyncio.wait_for(writing.wait(), 5)
    tasks[0].cancel()  # its handler gives up mid-write
    gate.set()
    results = await asyncio.wait_for(asyncio.gather(*tasks[1:]), 5)
    assert [ok for ok, _ in results] == [True, True]
    assert sorted((await breaker.state()).admitted) == ["node/gpu-b", "node/gpu-c"]


async def test_two_replicas_in_a_storm_never_admit_past_the_limit(bus: Bus) -> None:
    """Two replicas (two breakers on one window, each starting from its own last write)
    admit different nodes at once, interleaved: exactly the limit is admitted in all, and
    the window lists each admitted node."""
    settings = BreakerSettings(max_nodes=7, max_percent=100)

    async def population() -> int:
        return 5000

    kv = await bus.kv(f"b{uuid.uuid4().hex[:8]}")
    one, two = (CircuitBreaker(kv, settings, population) for _ in range(2))
    nodes = [f"node/gpu-{i}" for i in range(40)]
    results = await asyncio.gather(*((one if i % 2 else two).admit(n) for i, n in enumerate(nodes)))
    admitted = [n for n, (ok, _) in zip(nodes, results, strict=True) if ok]
    assert len(admitted) == 7
    assert sorted((await one.state()).admitted) == sorted(admitted)
    # A node admitted by one replica is admitted again by the other (not counted twice).
    assert (await two.admit(admitted[0]))[0] and (await one.admit(admitted[-1]))[0]
    assert len((await two.state()).admitted) == 7
