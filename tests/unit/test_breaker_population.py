"""The breaker's population: GPU nodes of either vendor (services.kernel.breaker)."""

from __future__ import annotations

import asyncio

import pytest

from services.kernel.breaker import BreakerSettings, NodePopulation
from sim.cluster.seed import load_seed, node_manifest
from sim.cluster.selectors import match_labels, parse_label_selector
from tests.conftest import wait_for


async def test_default_selectors_count_nvidia_and_amd_gpu_nodes() -> None:
    nodes = [node_manifest(n, i) for i, n in enumerate(load_seed().nodes)]
    asked: list[str | None] = []

    async def count(selector: str | None) -> int:
        asked.append(selector)
        if selector is None:
            return len(nodes) + 3  # and some CPU nodes
        reqs = parse_label_selector(selector)
        return sum(1 for n in nodes if match_labels(reqs, n["metadata"]["labels"]))

    population = NodePopulation(count, BreakerSettings().node_selector)
    assert await population() == 11  # 9 NVIDIA (the DRA node too), 2 MI300X; no CPU node
    assert None not in asked
    assert await NodePopulation(count, "nvidia.com/gpu.present=true")() == 9


async def test_no_match_counts_every_node() -> None:
    async def count(selector: str | None) -> int:
        return 7 if selector is None else 0

    assert await NodePopulation(count, ["a=b", "c=d"])() == 7
    assert await NodePopulation(count, None)() == 7


async def test_the_count_is_read_ahead_and_renewed_behind_the_caller() -> None:
    now = [0.0]
    reads: list[asyncio.Future[int]] = []

    async def count(selector: str | None) -> int:
        reads.append(asyncio.get_running_loop().create_future())
        return await reads[-1]

    population = NodePopulation(count, "a=b", ttl=30, clock=lambda: now[0])
    population.prime()  # at start, in the background
    await wait_for(lambda: reads, what="the first read")
    reads[0].set_result(5000)
    assert await population() == 5000  # the primed count: nobody waited on the list
    now[0] = 31.0  # stale: answered at once, renewed behind the caller
    assert await population() == 5000
    await wait_for(lambda: len(reads) == 2, what="the renewal")
    assert await population() == 5000  # one renewal at a time, the old count meanwhile
    assert len(reads) == 2
    reads[1].set_result(4000)
    await wait_for(lambda: population._reading is not None and population._reading.done())
    assert await population() == 4000


async def test_a_count_too_old_is_waited_for_and_a_failed_read_raises() -> None:
    now = [0.0]
    answers: list[int | Exception] = [10, RuntimeError("apiserver down"), 12]

    async def count(selector: str | None) -> int:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    population = NodePopulation(count, "a=b", ttl=30, max_stale=300, clock=lambda: now[0])
    assert await population() == 10  # nothing yet: the caller waits for the list
    now[0] = 400.0  # older than max_stale: not answered from memory
    with pytest.raises(RuntimeError, match="apiserver down"):
        await population()
    assert await population() == 12


async def test_kept_fresh_by_a_task_so_a_storm_after_a_quiet_hour_waits_for_no_list() -> None:
    reads: list[int] = []

    async def count(selector: str | None) -> int:
        reads.append(len(reads))
        return 5000 + len(reads)

    population = NodePopulation(count, "a=b", ttl=0.05, max_stale=0.1)
    task = asyncio.create_task(population.keep_fresh())
    try:
        await wait_for(lambda: len(reads) >= 3, what="three counts with nobody asking")
        assert await population() > 5001  # a recent count, answered without a read
    finally:
        task.cancel()


async def test_stopping_the_keeper_leaves_no_read_pending() -> None:
    started = asyncio.Event()

    async def count(selector: str | None) -> int:
        started.set()
        await asyncio.Event().wait()  # a list that never answers
        return 0

    population = NodePopulation(count, "a=b", ttl=30)
    keeper = asyncio.create_task(population.keep_fresh())
    await asyncio.wait_for(started.wait(), 5)
    reading = population._reading
    assert reading is not None
    keeper.cancel()
    with pytest.raises(asyncio.CancelledError):
        await keeper
    await wait_for(reading.done, timeout=5, what="the read cancelled")
    assert reading.cancelled()
