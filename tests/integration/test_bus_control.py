"""The runtime's operator controls on a real nats-server: one replica of a queue group
answers each request, a bad request or a failing handler is answered in one line, and a
request nobody serves says which service did not answer."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from nodeward.bus import Bus
from nodeward.bus.control import ControlTimeout, request
from nodeward.config import BusSettings
from schemas.control import ControlReply, ControlRequest, ControlStatus, control_subject


def _service() -> str:
    return f"svc-{uuid.uuid4().hex[:8]}"  # control subjects of this test alone


async def test_one_of_two_replicas_answers_each_request(bus_settings: BusSettings) -> None:
    service = _service()
    replicas = [await Bus.connect(bus_settings, source=f"test/{i}") for i in range(2)]
    calls: list[tuple[int, str]] = []
    try:
        for i, replica in enumerate(replicas):

            async def handle(req: ControlRequest, i: int = i) -> ControlReply:
                calls.append((i, req.id))
                return ControlReply.ok(f"done {req.target} by {req.operator}")

            await replica.control(service, "release", handle)
        sent = [
            ControlRequest(service=service, verb="release", operator="ann", target=f"n-{k}")
            for k in range(10)
        ]
        replies = [await request(replicas[0].nc, r, timeout=5) for r in sent]
        for replica in replicas:  # anything a second answer would have taken is in by now
            await replica.nc.flush()
        assert [r.message for r in replies] == [f"done n-{k} by ann" for k in range(10)]
        assert {r.service for r in replies} == {service}
        assert sorted(rid for _, rid in calls) == sorted(r.id for r in sent)  # once each
    finally:
        for replica in replicas:
            await replica.close(grace=1)


async def test_a_failing_handler_and_a_bad_request_are_answered_in_one_line(bus: Bus) -> None:
    service = _service()

    async def boom(req: ControlRequest) -> ControlReply:
        raise RuntimeError("the node\nis gone")

    await bus.control(service, "finish", boom)
    req = ControlRequest(service=service, verb="finish", operator="ann", target="gpu-1")
    reply = await request(bus.nc, req, timeout=5)
    assert reply.status == ControlStatus.ERROR
    assert reply.message == f"{service} could not finish gpu-1: the node is gone"

    raw = await bus.nc.request(control_subject(service, "finish"), b'{"verb": 1}', timeout=5)
    bad = ControlReply.model_validate_json(raw.data)
    assert bad.status == ControlStatus.ERROR
    assert bad.message.startswith("invalid finish request: ")
    assert "\n" not in bad.message


async def test_nobody_serving_is_named(bus: Bus) -> None:
    service = _service()
    req = ControlRequest(service=service, verb="cancel", operator="ann", target="gpu-1")
    with pytest.raises(ControlTimeout) as caught:
        await request(bus.nc, req, timeout=1)
    assert str(caught.value) == (
        f"no answer from the {service} service on control.{service}.cancel "
        "(no replica is serving it); is it running?"
    )


async def test_a_slow_answer_says_it_may_still_act(bus: Bus) -> None:
    service = _service()
    go_on = asyncio.Event()

    async def slow(req: ControlRequest) -> ControlReply:
        await go_on.wait()
        return ControlReply.ok("late")

    await bus.control(service, "release", slow)
    req = ControlRequest(service=service, verb="release", operator="ann", target="gpu-1")
    try:
        with pytest.raises(ControlTimeout) as caught:
            await request(bus.nc, req, timeout=0.5)
    finally:
        go_on.set()
    assert str(caught.value) == (
        f"no answer from the {service} service on control.{service}.release within 0.5s; "
        "it may still act: its audit record tells (`nodeward tail 'remediation.>'`)"
    )
