"""Dead-lettering: bad or failing messages end in the DLQ with their error; nothing is lost."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import time
from datetime import timedelta
from typing import Any

import pytest
import structlog
from structlog.testing import capture_logs

from nodeward.bus import Bus, ConsumerSpec, Delivery, Handler, PermanentError, PublishError
from nodeward.bus.server import EmbeddedNats
from nodeward.config import BusSettings
from schemas import Event, decode, encode, make_event
from schemas.dlq import DeadLetter
from schemas.gpu import GpuHealth
from schemas.streams import stream_spec
from tests.conftest import wait_for


def health(node: str, seq: int = 0) -> Event[GpuHealth]:
    return make_event(
        GpuHealth.example().model_copy(update={"node": node, "sequence": seq}), source="t"
    )


def spec(name: str, node: str, **kw: Any) -> ConsumerSpec:
    base: dict[str, Any] = {
        "name": name,
        "stream": "GPU",
        "subjects": (f"gpu.health.{node}.>",),
        "concurrency": 2,
        "batch": 8,
        "max_ack_pending": 32,
        "retry_delays": (0.05,),
    }
    return ConsumerSpec(**(base | kw))


async def dead_letters(bus: Bus, consumer: str) -> list[Event[DeadLetter]]:
    """Every DLQ event for `consumer` on the GPU stream, read back from JetStream."""
    subject = f"dlq.GPU.{consumer}"
    info = await bus.js.stream_info("DLQ", subjects_filter=subject)
    if not info.state.subjects:
        return []
    out = []
    psub = await bus.js.pull_subscribe(subject, stream="DLQ")
    try:
        msgs = await psub.fetch(sum(info.state.subjects.values()), timeout=2)
        for m in msgs:
            out.append(decode(m.subject, m.headers, m.data))
            await m.ack()
    finally:
        await psub.unsubscribe()
    return out


def failing(attempts: list[int], error: Exception) -> Handler:
    """A handler that notes each delivery's attempt in `attempts` and raises `error`."""

    async def handler(event: Event[Any], delivery: Delivery) -> None:
        attempts.append(delivery.attempt)
        raise error

    return handler


async def test_invalid_payload_is_dead_lettered_and_consumer_keeps_going(
    bus: Bus, node: str
) -> None:
    handled: list[str] = []

    async def handler(event: Event[Any], delivery: Delivery) -> None:
        handled.append(event.id)

    good_before, good_after = health(node, 1), health(node, 2)
    bad = health(node, 3)
    await bus.publish(good_before)
    # A well-formed envelope whose data violates the schema.
    headers = {
        "ce-specversion": "1.0",
        "ce-id": bad.id,
        "ce-source": "t",
        "ce-type": "gpu.health.v1",
        "ce-time": "2026-08-20T14:02:11Z",
        "ce-datacontenttype": "application/json",
        "Nats-Msg-Id": bad.id,
    }
    body = (
        b'{"node": "%s", "gpu_index": 0, "gpu_uuid": "GPU-1", "state": "on-fire", "observed_at": "2026-08-20T14:00:00Z"}'
        % node.encode()
    )
    await bus.js.publish(f"gpu.health.{node}.0", body, headers=headers)
    await bus.js.publish(f"gpu.health.{node}.0", b"\xff\xfe not json at all")
    await bus.publish(good_after)
    name = f"inv-{node}"
    await bus.consume(spec(name, node), handler)

    await wait_for(
        lambda: {good_before.id, good_after.id} <= set(handled), what="good events handled"
    )
    dls = await wait_for(lambda: _n(bus, name, 2), what="two dead letters")
    by_payload = {base64.b64decode(d.data.payload_b64): d.data for d in dls}
    invalid = by_payload[body]
    assert invalid.reason == "invalid"
    assert invalid.error.startswith("gpu.health.v1: state: Input should be")
    assert invalid.original_headers["ce-id"] == bad.id
    assert invalid.original_subject == f"gpu.health.{node}.0"
    assert invalid.stream_sequence is not None
    garbage = by_payload[b"\xff\xfe not json at all"]
    assert garbage.reason == "invalid" and "CloudEvents" in garbage.error
    # Both were acked: nothing left pending on the consumer.
    info = await bus.js.consumer_info("GPU", name)
    await wait_for(lambda: _acked(bus, name), what="all acked")
    assert info.num_redelivered == 0


async def _n(bus: Bus, name: str, n: int) -> list[Event[DeadLetter]] | None:
    dls = await dead_letters(bus, name)
    return dls if len(dls) >= n else None


async def _acked(bus: Bus, name: str) -> bool:
    info = await bus.js.consumer_info("GPU", name)
    return info.num_ack_pending == 0 and info.num_pending == 0


async def test_failing_handler_is_retried_then_dead_lettered(bus: Bus, node: str) -> None:
    attempts: list[int] = []
    handler = failing(attempts, RuntimeError("database is down"))

    event = health(node)
    await bus.publish(event)
    name = f"fail-{node}"
    await bus.consume(spec(name, node, max_deliver=3), handler)
    dls = await wait_for(lambda: _n(bus, name, 1), what="dead letter")
    assert attempts == [1, 2, 3]
    dl = dls[0].data
    assert dl.reason == "exhausted" and dl.deliveries == 3
    assert dl.error == "database is down" and dl.error_type == "RuntimeError"
    assert dl.original_headers["ce-id"] == event.id
    await wait_for(lambda: _acked(bus, name), what="original acked")


async def test_permanent_error_dead_letters_at_once(bus: Bus, node: str) -> None:
    attempts: list[int] = []
    handler = failing(attempts, PermanentError("node gpu-node-99 does not exist"))

    await bus.publish(health(node))
    name = f"perm-{node}"
    await bus.consume(spec(name, node), handler)
    dls = await wait_for(lambda: _n(bus, name, 1), what="dead letter")
    assert attempts == [1]
    assert dls[0].data.reason == "permanent"
    assert dls[0].data.error == "node gpu-node-99 does not exist"


async def test_dlq_write_is_acked_before_the_original(own_nats: EmbeddedNats, node: str) -> None:
    """With the DLQ stream gone the original is never acked; once it is back, it lands there."""
    settings = BusSettings(url=own_nats.url, publish_timeout="300ms", publish_retries=0)  # type: ignore[arg-type]
    bus = await Bus.connect(settings, source="test/dlq")
    try:
        await bus.js.delete_stream("DLQ")
        attempts: list[int] = []
        handler = failing(attempts, PermanentError("bad target"))

        await bus.publish(health(node))
        name = f"dlqdown-{node}"
        await bus.consume(spec(name, node, retry_delays=(0.1,), dead_letter_tries=20), handler)
        # The handler runs again and again: the original was nak'ed, not acked, each time.
        await wait_for(lambda: len(attempts) >= 3, what="redeliveries while the DLQ is down")
        info = await bus.js.consumer_info("GPU", name)
        assert info.num_ack_pending + info.num_pending >= 1
        await bus.provision()  # the DLQ stream comes back
        dls = await wait_for(lambda: _n(bus, name, 1), what="dead letter after DLQ is back")
        assert dls[0].data.reason == "permanent"
        await wait_for(lambda: _acked(bus, name), what="original acked after the DLQ write")
        assert len(await dead_letters(bus, name)) == 1
    finally:
        await bus.close(grace=1)


async def test_long_handler_is_kept_alive_with_in_progress(bus: Bus, node: str) -> None:
    """A handler running 3x ack_wait is not redelivered: the runtime sends in_progress."""
    attempts: list[int] = []
    release = asyncio.Event()

    async def handler(event: Event[Any], delivery: Delivery) -> None:
        attempts.append(delivery.attempt)
        await release.wait()

    await bus.publish(health(node))
    name = f"slow-{node}"
    await bus.consume(spec(name, node, ack_wait=timedelta(seconds=0.6)), handler)
    await wait_for(lambda: attempts, what="handler started")
    loop = asyncio.get_running_loop()
    started = loop.time()
    await wait_for(lambda: loop.time() - started > 1.8, interval=0.1, what="3x ack_wait")
    release.set()
    await wait_for(lambda: _acked(bus, name), what="acked")
    assert attempts == [1]


def test_stream_table_has_dlq() -> None:
    assert stream_spec("DLQ").subjects == ("dlq.>",)


async def test_metrics_count_outcomes_and_lag(bus: Bus, node: str) -> None:
    release = asyncio.Event()

    async def handler(event: Event[Any], delivery: Delivery) -> None:
        if event.data.sequence == 0:
            raise PermanentError("no such GPU")
        await release.wait()

    name = f"metrics-{node}"
    await bus.publish_many([health(node, i) for i in range(40)])
    await bus.consume(
        spec(name, node, concurrency=1, batch=4, max_ack_pending=8, lag_interval=0.05), handler
    )
    sample = bus.metrics.registry.get_sample_value
    labels = {"stream": "GPU", "consumer": name}
    await wait_for(
        lambda: (sample("nodeward_consumer_pending", labels) or 0) > 20, what="lag reported"
    )
    release.set()
    await wait_for(
        lambda: sample("nodeward_consumer_pending", labels) == 0, what="lag back to zero"
    )
    await wait_for(
        lambda: (
            sample(
                "nodeward_events_handled_total",
                {"consumer": name, "type": "gpu.health.v1", "outcome": "ok"},
            )
            == 39
        ),
        what="39 handled",
    )
    assert (
        sample("nodeward_events_dead_lettered_total", {"consumer": name, "reason": "permanent"})
        == 1
    )
    assert (
        sample(
            "nodeward_events_handled_total",
            {"consumer": name, "type": "gpu.health.v1", "outcome": "permanent"},
        )
        == 1
    )
    assert (sample("nodeward_handler_seconds_count", {"consumer": name}) or 0) >= 40
    assert (sample("nodeward_events_published_total", {"type": "gpu.health.v1"}) or 0) >= 40


# -- poison always leaves -------------------------------------------------------------


def ce_headers(event_id: str, type_name: str = "gpu.health.v1") -> dict[str, str]:
    return {
        "ce-specversion": "1.0",
        "ce-id": event_id,
        "ce-source": "agent/gpu/x",
        "ce-type": type_name,
        "ce-time": "2026-08-20T14:02:11Z",
        "ce-datacontenttype": "application/json",
    }


async def test_megabyte_of_garbage_is_dead_lettered_truncated_within_seconds(
    bus: Bus, node: str
) -> None:
    """Its base64 copy exceeds max_payload: the dead letter keeps the headers, the size, the
    sha256 and the first bytes, and nothing is left unacknowledged."""
    garbage = os.urandom(1_000_000)
    headers = ce_headers("garbage-1")
    await bus.js.publish(f"gpu.health.{node}.5", garbage, headers=headers)
    handled: list[str] = []

    async def handler(event: Event[Any], delivery: Delivery) -> None:
        handled.append(event.id)

    name = f"big-{node}"
    began = time.monotonic()
    await bus.consume(spec(name, node), handler)
    dls = await wait_for(lambda: _n(bus, name, 1), timeout=5, what="dead letter")
    await wait_for(lambda: _acked(bus, name), timeout=5, what="nothing unacknowledged")
    assert time.monotonic() - began < 5
    dl = dls[0].data
    assert dl.reason == "invalid" and dl.truncated
    assert dl.payload_size == 1_000_000
    assert dl.payload_sha256 == hashlib.sha256(garbage).hexdigest()
    assert 0 < len(dl.payload) < 1_000_000 and garbage.startswith(dl.payload)
    assert dl.original_headers["ce-id"] == "garbage-1"
    assert dl.original_subject == f"gpu.health.{node}.5"
    assert handled == []
    info = await bus.js.consumer_info("GPU", name)
    assert info.num_redelivered == 0


async def test_small_dead_letters_keep_the_whole_body_with_size_and_hash(
    bus: Bus, node: str
) -> None:
    await bus.js.publish(f"gpu.health.{node}.0", b"not json", headers=ce_headers("small-1"))
    name = f"small-{node}"
    await bus.consume(spec(name, node), _never)
    dl = (await wait_for(lambda: _n(bus, name, 1), what="dead letter"))[0].data
    assert dl.payload == b"not json" and not dl.truncated
    assert dl.payload_size == 8 and dl.payload_sha256 == hashlib.sha256(b"not json").hexdigest()


async def _never(event: Event[Any], delivery: Delivery) -> None:
    raise AssertionError("the handler must not run")


async def test_errors_that_cannot_succeed_on_retry_are_dead_lettered_at_once(
    bus: Bus, node: str
) -> None:
    """Validation, an invalid KV key, max payload: the first delivery is the last."""
    kv = await bus.kv(f"poison-{node}")
    attempts: dict[int, list[int]] = {0: [], 1: [], 2: []}

    async def handler(event: Event[Any], delivery: Delivery) -> None:
        gpu = event.data.gpu_index
        attempts[gpu].append(delivery.attempt)
        if gpu == 0:
            GpuHealth.model_validate({"node": "a b"})
        elif gpu == 1:
            await kv.put(f"node.{event.data.node} x", b"1")
        else:
            big = "x" * 2_000_000
            await bus.publish(
                make_event(event.data.model_copy(update={"gpu_uuid": big}), source="t")
            )

    for gpu in attempts:
        await bus.publish(
            make_event(
                GpuHealth.example().model_copy(update={"node": node, "gpu_index": gpu}), source="t"
            )
        )
    name = f"perm2-{node}"
    began = time.monotonic()
    await bus.consume(spec(name, node, retry_delays=(5.0,)), handler)
    dls = await wait_for(lambda: _n(bus, name, 3), timeout=5, what="three dead letters")
    assert time.monotonic() - began < 5
    assert attempts == {0: [1], 1: [1], 2: [1]}
    by_type = {d.data.error_type: d.data for d in dls}
    assert set(by_type) == {"ValidationError", "InvalidKeyError", "PublishError"}
    assert {d.reason for d in by_type.values()} == {"permanent"}
    assert "maximum payload exceeded" in by_type["PublishError"].error
    await wait_for(lambda: _acked(bus, name), what="all acked")


async def test_big_publish_fails_at_once_without_retries(bus: Bus, node: str) -> None:
    event = make_event(
        GpuHealth.example().model_copy(update={"node": node, "gpu_uuid": "x" * 2_000_000}),
        source="t",
    )
    began = time.monotonic()
    with (
        capture_logs() as logs,
        pytest.raises(PublishError, match="maximum payload exceeded") as info,
    ):
        await bus.publish(event)
    assert info.value.permanent
    assert time.monotonic() - began < 5  # liveness; that it is not retried is the next line
    assert not [e for e in logs if e["event"] == "bus.publish_retry"]
    assert bus.connected  # refused here, not by the server (which would drop the connection)


async def test_message_that_cannot_be_dead_lettered_is_terminated_and_audited(
    own_nats: EmbeddedNats, node: str
) -> None:
    """With the DLQ stream gone for good, the original is tried `dead_letter_tries` times,
    then terminated (AckTerm) and the termination audited: it never circulates forever."""
    settings = BusSettings(url=own_nats.url, publish_timeout="300ms", publish_retries=0)  # type: ignore[arg-type]
    bus = await Bus.connect(settings, source="test/term")
    try:
        await bus.js.delete_stream("DLQ")
        await bus.js.publish(f"gpu.health.{node}.0", b"garbage", headers=ce_headers("term-1"))
        name = f"term-{node}"
        await bus.consume(spec(name, node, retry_delays=(0.05,), dead_letter_tries=3), _never)

        async def terminated() -> list[Event[Any]] | None:
            info = await bus.js.stream_info("AUDIT", subjects_filter="remediation.terminate.>")
            if not info.state.messages:
                return None
            psub = await bus.js.pull_subscribe("remediation.terminate.>", stream="AUDIT")
            try:
                msgs = await psub.fetch(info.state.messages, timeout=2)
                return [decode(m.subject, m.headers, m.data) for m in msgs]
            finally:
                await psub.unsubscribe()

        audits = await wait_for(terminated, timeout=10, what="termination audited")
        await wait_for(lambda: _acked(bus, name), what="nothing left unacknowledged")
        audit = audits[0].data
        assert audit.action == "terminate" and audit.outcome == "applied"
        assert audit.trigger_event_id == "term-1"
        assert "after 3 tries" in audit.reason
        assert audit.details["subject"] == f"gpu.health.{node}.0"
        assert audit.details["dead_letter_reason"] == "invalid"
        assert audit.details["sha256"] == hashlib.sha256(b"garbage").hexdigest()
        info = await bus.js.consumer_info("GPU", name)
        assert info.delivered.consumer_seq == 3  # three deliveries in all
        assert info.ack_floor.stream_seq == info.delivered.stream_seq
    finally:
        await bus.close(grace=1)


async def test_log_lines_name_the_message_being_handled(bus: Bus, node: str) -> None:
    """An undecodable message after a good one: its lines carry its own id and subject."""
    good = health(node, 1)
    await bus.publish(good)
    await bus.js.publish(f"gpu.health.{node}.7", b"garbage", headers=ce_headers("bad-7"))

    async def handler(event: Event[Any], delivery: Delivery) -> None:
        structlog.get_logger().info("handled")

    name = f"ctx-{node}"
    with capture_logs(processors=[structlog.contextvars.merge_contextvars]) as logs:
        await bus.consume(spec(name, node, concurrency=1), handler)
        await wait_for(lambda: _n(bus, name, 1), what="dead letter")
        await wait_for(lambda: _acked(bus, name), what="all acked")
    handled = [e for e in logs if e["event"] == "handled"]
    dead = [e for e in logs if e["event"] == "dlq.dead_lettered"]
    assert handled and handled[0]["event_id"] == good.id
    assert handled[0]["subject"] == good.nats_subject
    assert dead and dead[0]["event_id"] == "bad-7"
    assert dead[0]["subject"] == f"gpu.health.{node}.7"


# -- identity binds to the subject ----------------------------------------------------


async def test_identity_is_checked_by_default_and_on_call_told_once_per_publisher(
    bus: Bus, node: str
) -> None:
    """A spec that declares nothing is still checked; two publishers forging a burst each
    give one notice each, and every forged event is refused without the handler."""
    other = f"{node}-b"
    victim = f"{node}-victim"
    for publisher in (node, other):
        for gpu in range(4):
            wire = encode(health(victim, gpu))
            await bus.js.publish(f"gpu.health.{publisher}.{gpu}", wire.body, headers=wire.headers)
    await bus.publish(health(node, 9))  # a true one
    handled: list[str] = []

    async def handler(event: Event[Any], delivery: Delivery) -> None:
        handled.append(event.data.node)

    name = f"ident-{node}"
    subjects = (f"gpu.health.{node}.>", f"gpu.health.{other}.>")
    await bus.consume(spec(name, node, subjects=subjects), handler)
    dls = await wait_for(lambda: _n(bus, name, 8), what="eight dead letters")
    await wait_for(lambda: _acked(bus, name), what="all acked")
    assert handled == [node]
    assert {d.data.reason for d in dls} == {"identity_mismatch"}
    info = await bus.js.stream_info("NOTIFY", subjects_filter="notify.critical.security")
    psub = await bus.js.pull_subscribe("notify.critical.security", stream="NOTIFY")
    try:
        msgs = await psub.fetch(sum((info.state.subjects or {}).values()), timeout=2)
        notes = [decode(m.subject, m.headers, m.data).data for m in msgs]
    finally:
        await psub.unsubscribe()
    mine = sorted(n.targets[0].name for n in notes if n.targets[0].name in (node, other))
    assert mine == sorted([node, other])


# -- clocks are bounded -----------------------------------------------------------------


async def _read(bus: Bus, stream: str, subject: str) -> list[Any]:
    info = await bus.js.stream_info(stream, subjects_filter=subject)
    n = sum((info.state.subjects or {}).values())
    if not n:
        return []
    psub = await bus.js.pull_subscribe(subject, stream=stream)
    try:
        return [decode(m.subject, m.headers, m.data) for m in await psub.fetch(n, timeout=2)]
    finally:
        await psub.unsubscribe()


async def test_an_event_from_a_clock_running_ahead_is_refused_audited_and_told_once(
    bus: Bus, node: str
) -> None:
    """An agent whose clock runs an hour fast: its observations would outrank every real
    one after them. Each is dead-lettered as `future` with how far ahead it was, audited,
    and on-call told once for the publisher, by whichever consumer refused it first; an event
    within the allowed skew is handled."""
    from datetime import UTC, datetime

    now = datetime.now(UTC)
    fast = [
        make_event(
            GpuHealth.example().model_copy(
                update={"node": node, "sequence": i, "observed_at": now + timedelta(hours=1)}
            ),
            source="t",
        )
        for i in range(3)
    ]
    # The event's own time (CloudEvents `time`) ahead counts too.
    fast.append(health(node, 7).model_copy(update={"time": now + timedelta(minutes=10)}))
    within = make_event(
        GpuHealth.example().model_copy(
            update={"node": node, "sequence": 9, "observed_at": now + timedelta(seconds=2)}
        ),
        source="t",
    )
    for event in [*fast, within]:
        await bus.publish(event)
    handled: list[int | None] = []

    async def handler(event: Event[Any], delivery: Delivery) -> None:
        handled.append(event.data.sequence)

    name = f"future-{node}"
    await bus.consume(spec(name, node), handler)
    dls = await wait_for(lambda: _n(bus, name, 4), what="four dead letters")
    await wait_for(lambda: _acked(bus, name), what="all acked")
    assert handled == [9]
    assert {d.data.reason for d in dls} == {"future"}
    by_id = {d.data.original_headers.get("ce-id"): d.data for d in dls}
    assert set(by_id) == {e.id for e in fast}
    first = by_id[fast[0].id].error
    assert "claims observed_at" in first and "ahead of when the bus stored it" in first, first
    assert "(at most 5s allowed)" in first
    assert "claims time" in by_id[fast[3].id].error
    audits = await _read(bus, "AUDIT", f"remediation.future_event.{node}")
    assert sorted(a.data.trigger_event_id for a in audits) == sorted(e.id for e in fast)
    assert {a.data.outcome for a in audits} == {"refused"}
    assert {a.data.guard for a in audits} == {"clock"}
    details = next(a.data.details for a in audits if a.data.trigger_event_id == fast[0].id)
    assert details["field"] == "observed_at" and 3590 < details["ahead_s"] < 3610, details
    # Another service reading the same stream refuses them too, and tells no one again:
    # on-call hears once per publisher, however many consumers refuse it.
    other = f"future-other-{node}"
    await bus.consume(spec(other, node), handler)
    await wait_for(lambda: _n(bus, other, 4), what="the other consumer's dead letters")
    notes = [
        n
        for n in await _read(bus, "NOTIFY", "notify.warning.clock")
        if n.data.targets[0].name == node
    ]
    assert len(notes) == 1, notes
    assert notes[0].data.title.startswith(f"{node}'s clock is ")
    assert notes[0].data.audience == "oncall"
    assert f"first refused by {name}" in notes[0].data.body
