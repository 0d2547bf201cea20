"""`within` keeps a cancellation that arrives as its timeout fires (asyncio.wait_for on
Python 3.11 can lose it, and a polling loop around it then survives `cancel()`); `KeyedLocks`
serialises one key and forgets it."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from nodeward.aio import KeyedLocks, within


async def test_timeout_raises_and_a_result_passes_through() -> None:
    with pytest.raises(TimeoutError):
        await within(asyncio.Event().wait(), 0.01)
    assert await within(asyncio.sleep(0, result=7), 1.0) == 7


async def test_a_cancel_that_meets_a_wake_up_is_not_lost() -> None:
    """The wake-up and the cancel land in the same loop turn: `asyncio.wait_for` (3.11)
    returns the wake-up and drops the cancel, and this loop would wait on for 10 s."""
    event = asyncio.Event()
    woke = 0

    async def poll_loop() -> None:
        nonlocal woke
        while True:
            with contextlib.suppress(TimeoutError):
                await within(event.wait(), 10.0)
            woke += 1
            event.clear()

    task = asyncio.create_task(poll_loop())
    for _ in range(3):
        await asyncio.sleep(0)  # the loop is now waiting on the event
    event.set()
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=1.0)
    assert done, "the cancelled polling loop kept running"
    assert task.cancelled()
    assert woke == 0


async def test_keyed_locks_one_key_at_a_time_other_keys_meanwhile_nothing_left() -> None:
    """`KeyedLocks`: a key's holders one at a time, another key meanwhile, and no lock kept
    once nobody holds or waits for its key."""
    locks = KeyedLocks()
    inside = {"a": 0, "b": 0}
    most = {"a": 0, "b": 0}
    go = asyncio.Event()
    b_in = asyncio.Event()

    async def hold(key: str) -> None:
        async with locks(key):
            inside[key] += 1
            most[key] = max(most[key], inside[key])
            if key == "b":
                b_in.set()
            await go.wait()  # held until the test lets go: the keys overlap by design
            inside[key] -= 1

    held = [asyncio.create_task(hold("a")) for _ in range(3)]
    held.append(asyncio.create_task(hold("b")))
    await b_in.wait()  # "b" got in while "a" is held
    assert inside == {"a": 1, "b": 1} and len(locks) == 2
    go.set()
    await asyncio.gather(*held)
    assert most == {"a": 1, "b": 1}
    assert len(locks) == 0
