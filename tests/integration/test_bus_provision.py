"""Provisioning writes only what differs: a daemon's start leaves streams as wanted alone
(no proposal to the cluster per start), and puts back a stream someone changed."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import nats

from nodeward.bus.provision import ensure_stream, ensure_streams
from nodeward.bus.server import EmbeddedNats
from schemas.streams import STREAMS, stream_spec


async def test_a_second_start_changes_nothing_and_a_changed_stream_is_put_back(
    tmp_path: Path,
) -> None:
    async with EmbeddedNats(tmp_path / "nats") as server:
        nc = await nats.connect(server.url)
        try:
            js = nc.jetstream()
            first = await ensure_streams(js)
            assert set(first.values()) == {"created"} and len(first) == len(STREAMS)
            again = await ensure_streams(js)
            assert set(again.values()) == {"unchanged"}, again
            # With partitions, the partitioned streams gain a transform; the others stay.
            parted = await ensure_streams(js, partitions=4)
            partitioned = {s.name for s in STREAMS if s.partitioning is not None}
            assert {n for n, did in parted.items() if did == "updated"} == partitioned
            assert set((await ensure_streams(js, partitions=4)).values()) == {"unchanged"}
            # Someone shortened HEARTBEATS' retention and turned off direct get: put back.
            spec = stream_spec("HEARTBEATS")
            info = await js.stream_info("HEARTBEATS")
            edited = info.config
            edited.max_age = 60.0
            edited.allow_direct = False
            await js.update_stream(config=edited)
            assert await ensure_stream(js, spec, partitions=4) == "updated"
            restored = (await js.stream_info("HEARTBEATS")).config
            assert restored.max_age == spec.max_age.total_seconds() and restored.allow_direct
            wider = replace(spec, subjects=(*spec.subjects, "gpu.beat.>"))
            assert await ensure_stream(js, wider, partitions=4) == "updated"
        finally:
            await nc.close()
