"""Lanes: a call past its deadline is reported once, and how it ends is kept, not lost."""

from __future__ import annotations

import asyncio
import gc
import threading
from typing import Any

import pytest

from nodeward.watchdog import CallTimeout, Lane, LaneBusy
from tests.conftest import wait_for


async def test_a_late_failure_is_kept_and_never_an_unretrieved_exception() -> None:
    loop = asyncio.get_running_loop()
    unhandled: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, ctx: unhandled.append(ctx))
    lane = Lane("bmc")
    release = threading.Event()

    def slow_then_fail() -> None:
        release.wait(5)
        raise OSError("Unable to establish IPMI v2 / RMCP+ session")

    try:
        with pytest.raises(CallTimeout):
            await lane.call(slow_then_fail, 0.05)
        with pytest.raises(LaneBusy):
            await lane.call(lambda: None, 0.05)
        release.set()
        await wait_for(lambda: not lane.busy and lane.late_error, what="the late call's end")
        assert lane.late_error == "OSError: Unable to establish IPMI v2 / RMCP+ session"
        gc.collect()
        await asyncio.sleep(0)
        assert unhandled == []
        assert await lane.call(lambda: 42, 1.0) == 42
    finally:
        loop.set_exception_handler(None)
        lane.close()
