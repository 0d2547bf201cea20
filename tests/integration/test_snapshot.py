"""`nodeward.bus.snapshot` against a real JetStream: each subject's last message in one pass,
a bucket's live entries (deleted and purged keys left out), a stream's newest messages,
those stored since a time, and a stream's subjects with their counts."""

from __future__ import annotations

from datetime import timedelta

from nodeward.bus import Bus
from nodeward.bus.snapshot import (
    kv_entries,
    last_per_subject,
    newest,
    stored_since,
    subject_counts,
)


async def test_the_last_message_of_each_matching_subject(own_bus: Bus) -> None:
    js = own_bus.js
    for subject, body in (
        ("gpu.health.a.0", b"a0-1"),
        ("gpu.health.a.0", b"a0-2"),
        ("gpu.health.b.0", b"b0-1"),
        ("gpu.xid.a.0", b"xid"),
        ("gpu.health.c.1", b"c1-1"),
    ):
        await js.publish(subject, body)
    nc = own_bus.nc

    got = await last_per_subject(nc, "GPU", ["gpu.health.a.>", "gpu.health.b.>"])
    assert got is not None
    assert {m.subject: m.data for m in got} == {
        "gpu.health.a.0": b"a0-2",
        "gpu.health.b.0": b"b0-1",
    }
    assert [m.seq for m in got] == sorted(m.seq for m in got)  # stream order
    every = await last_per_subject(nc, "GPU", ["gpu.>"])
    assert every is not None and len(every) == 4
    headers = await last_per_subject(nc, "GPU", ["gpu.xid.>"], headers_only=True)
    assert headers is not None and [m.data for m in headers] == [b""]
    assert await last_per_subject(nc, "GPU", ["gpu.health.zz.>"]) == []
    assert await last_per_subject(nc, "NO-SUCH-STREAM", [">"]) is None

    tail = await newest(nc, "GPU", 2)
    assert tail is not None and [m.data for m in tail] == [b"xid", b"c1-1"]
    assert await newest(nc, "NO-SUCH-STREAM", 2) is None


async def test_a_buckets_live_entries_without_deleted_or_purged_keys(own_bus: Bus) -> None:
    kv = await own_bus.kv("snap")
    await kv.put("node.a", b"1")
    await kv.put("node.a", b"2")
    await kv.put("node.b", b"x")
    await kv.delete("node.b")
    await kv.put("node.c", b"y")
    await kv.purge("node.c")
    await kv.put("node.d.e", b"dotted")
    await kv.put("breaker", b"open")
    await kv.put("xid.a", b"other kind")

    got = await kv_entries(own_bus.nc, "snap", ["node.", "breaker"])
    assert got == {"node.a": b"2", "node.d.e": b"dotted", "breaker": b"open"}
    assert await kv_entries(own_bus.nc, "snap", ["node.a"]) == {"node.a": b"2"}
    assert await kv_entries(own_bus.nc, "no-such-bucket", ["node."]) is None


async def test_messages_stored_since_a_time_and_a_streams_subject_counts(own_bus: Bus) -> None:
    js = own_bus.js
    nc = own_bus.nc
    await js.publish("gpu.health.a.0", b"old")
    await js.publish("gpu.health.b.0", b"old")
    first = await last_per_subject(nc, "GPU", ["gpu.health.>"])
    assert first is not None
    after = max(m.time for m in first) + timedelta(milliseconds=1)
    # Stored later than `after` (the server's clock, to the nanosecond, only moves on).
    while (await last_per_subject(nc, "GPU", ["gpu.health.a.0"]) or [first[0]])[0].time < after:
        await js.publish("gpu.health.a.0", b"new")
    await js.publish("gpu.health.c.1", b"new")
    since = await stored_since(nc, "GPU", ["gpu.health.>"], after)
    assert since is not None and {m.data for m in since} == {b"new"}
    assert {m.subject for m in since} == {"gpu.health.a.0", "gpu.health.c.1"}
    assert await stored_since(nc, "NO-SUCH-STREAM", [">"], after) is None

    counts = await subject_counts(nc, "GPU", "gpu.health.>")
    assert counts is not None and counts["gpu.health.b.0"] == 1 and counts["gpu.health.c.1"] == 1
    assert counts["gpu.health.a.0"] >= 2
    assert await subject_counts(nc, "GPU", "gpu.xid.>") == {}
    assert await subject_counts(nc, "NO-SUCH-STREAM", ">") is None
