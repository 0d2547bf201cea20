"""The circuit breaker in a storm: many handlers of one replica admit at once. Exactly the
limit is admitted, the rest refused, and each admission is decided once: the replica's
handlers take turns on the one KV key instead of racing into revision conflicts."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from nodeward.bus import Bus
from services.kernel import breaker as breaker_module
from services.kernel.breaker import BreakerSettings, CircuitBreaker


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
