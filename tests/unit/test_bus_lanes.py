"""nodeward.bus.lanes: the urgent lane's subjects, and urgent work first within a process."""

from __future__ import annotations

import asyncio

from nodeward.bus.lanes import UrgentFirst, lanes, split

LEVELS = {"urgent": ["critical"], "other": ["info", "warning"]}


def test_split_covers_a_subject_with_the_levels_of_each_lane() -> None:
    assert split("notify.>", prefix="notify", **LEVELS) == (
        ["notify.critical.>"],
        ["notify.info.>", "notify.warning.>"],
    )
    assert split("notify.*.gpu", prefix="notify", **LEVELS) == (
        ["notify.critical.gpu"],
        ["notify.info.gpu", "notify.warning.gpu"],
    )
    assert split("notify.critical.x", prefix="notify", **LEVELS) == (["notify.critical.x"], [])
    assert split("notify.debug.x", prefix="notify", **LEVELS) is None  # a level in neither
    assert split("other.>", prefix="notify", **LEVELS) is None


def test_lanes_name_the_urgent_consumer_and_fall_back_to_one() -> None:
    assert lanes("n", ["notify.critical.>", "notify.info.>"], prefix="notify", **LEVELS) == [
        ("n-urgent", ["notify.critical.>"]),
        ("n", ["notify.info.>"]),
    ]
    assert lanes("n", ["notify.info.>"], prefix="notify", **LEVELS) == [("n", ["notify.info.>"])]
    assert lanes("n", ["notify.>", "x.>"], prefix="notify", **LEVELS) == [
        ("n", ["notify.>", "x.>"])
    ]


async def test_low_priority_work_waits_while_urgent_work_is_in_hand() -> None:
    gate = UrgentFirst()
    await gate.clear()  # nothing urgent: at once
    order: list[str] = []
    release = asyncio.Event()
    started = asyncio.Event()

    async def urgent() -> None:
        async with gate.urgent():
            order.append("urgent started")
            started.set()
            await release.wait()
            order.append("urgent done")

    async def low() -> None:
        await gate.clear()
        order.append("low")

    task = asyncio.create_task(urgent())
    await started.wait()
    waiting = asyncio.create_task(low())
    # Bounded by `at_most`, a wait returns while the urgent work is still in hand; the
    # unbounded one is still waiting then.
    await gate.clear(at_most=0.05)
    assert order == ["urgent started"] and gate.busy and not waiting.done()
    release.set()
    await asyncio.gather(task, waiting)
    assert order == ["urgent started", "urgent done", "low"] and not gate.busy
