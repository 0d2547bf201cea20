"""The story on a real nats-server: each source is its own subscription, yet a decision is
told after the GPU event that caused it even when the GPU subscription lags, and a line
waits for quiet sources only as long as it takes to ask the server about them."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
import pytest_asyncio

from launch.story import EVENT_SOURCES, Story, tell
from nodeward.bus import Bus
from nodeward.bus.server import EmbeddedNats
from nodeward.config import BusSettings
from schemas import make_event
from schemas.gpu import GpuHealth, HealthReason, HealthState
from schemas.remediation import Remediation
from schemas.state.cordon import NODES
from tests.conftest import wait_for
from tests.helpers.records import node_action

pytestmark = pytest.mark.timeout(120)

NODE = "gpu-story-1"
PATIENCE = 60.0  # far longer than any wait below: a line out early was not out by patience


@pytest_asyncio.fixture
async def bus(own_nats: EmbeddedNats) -> AsyncIterator[Bus]:
    """Its own server: the story follows whole streams, other tests' events stay out."""
    b = await Bus.connect(BusSettings(url=own_nats.url), source="test/story")  # type: ignore[arg-type]
    await b.kv(NODES.name)  # the cordon service's bucket, which the story follows too
    yield b
    await b.close(grace=2)


@contextlib.asynccontextmanager
async def telling(nc: Any, story: Story) -> AsyncIterator[None]:
    task = asyncio.create_task(tell(nc, None, story))
    try:
        # One subscription per event stream and KV `cordon`, each asked once.
        await wait_for(
            lambda: len(story.marks) == len(EVENT_SOURCES) + 1, timeout=20, what="subscribed"
        )
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def failed() -> GpuHealth:
    return GpuHealth(
        node=NODE,
        gpu_index=1,
        gpu_uuid="GPU-1",
        state=HealthState.FAILED,
        previous_state=HealthState.HEALTHY,
        reasons=[HealthReason(code="xid", xid=79, message="fallen off the bus")],
        observed_at=datetime.now(UTC),
    )


def decision(trigger: str) -> Remediation:
    return node_action("quarantine", NODE, "GPU 1 failed", trigger_event_id=trigger)


async def test_a_decision_on_a_quiet_bus_is_told_once_the_other_sources_are_asked(
    bus: Bus,
) -> None:
    lines: list[str] = []
    story = Story(emit=lambda line, _sev: lines.append(line), patience=PATIENCE)
    async with telling(bus.nc, story):
        await bus.publish(make_event(decision("inc-0"), source="service/cordon"))
        await wait_for(lambda: bool(lines), timeout=20, what="the decision's line")
    assert lines[0].startswith("DECISION ") and f"quarantine node/{NODE}: applied" in lines[0]


class LateSource:
    """`nc` as `tell` uses it, but one stream's messages are handed over `delay` seconds
    late, as a lagging subscription (a consumer being recreated, a loaded client) hands
    them: the server and every other subscription are untouched."""

    def __init__(self, nc: Any, stream: str, delay: float) -> None:
        self._nc, self._stream, self._delay = nc, stream, delay

    def __getattr__(self, name: str) -> Any:
        return getattr(self._nc, name)

    def jetstream(self) -> Any:
        js = self._nc.jetstream()
        late_stream, delay = self._stream, self._delay

        class LateJs:
            def __getattr__(self, name: str) -> Any:
                return getattr(js, name)

            async def subscribe(self, subject: str, *, stream: str, cb: Any, **kw: Any) -> Any:
                if stream != late_stream:
                    return await js.subscribe(subject, stream=stream, cb=cb, **kw)

                async def late(msg: Any) -> None:
                    await asyncio.sleep(delay)  # the lag itself, not a synchronisation
                    await cb(msg)

                return await js.subscribe(subject, stream=stream, cb=late, **kw)

        return LateJs()


async def test_a_decision_waits_for_the_gpu_event_its_lagging_subscription_brings_late(
    bus: Bus,
) -> None:
    """The GPU subscription hands each message over 2 s late; the decision the failure
    causes comes on AUDIT's at once, and is told after the failure all the same."""
    lines: list[str] = []
    story = Story(emit=lambda line, _sev: lines.append(line), patience=PATIENCE)
    async with telling(LateSource(bus.nc, "GPU", 2.0), story):
        event = make_event(failed(), source=f"agent/gpu/{NODE}")
        await bus.publish(event)
        await bus.publish(make_event(decision(event.id), source="service/cordon"))
        await wait_for(lambda: len(lines) >= 2, timeout=30, what=f"two lines in {lines}")
    assert [line.split()[0] for line in lines] == ["GPU", "DECISION"], lines
    assert f"{NODE} GPU 1 healthy -> failed" in lines[0]
