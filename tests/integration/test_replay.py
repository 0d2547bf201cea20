"""`nodeward replay` against a real JetStream: across streams, from a time, to the end now."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from nodeward.bus import Bus
from nodeward.bus.server import EmbeddedNats
from nodeward.cli.common import CliError
from nodeward.cli.replay import replay
from nodeward.config import BusSettings, Settings
from schemas import example_event


async def test_replay_exports_matching_events_of_several_streams(
    own_nats: EmbeddedNats, tmp_path: Path
) -> None:
    bus = await Bus.connect(BusSettings(url=own_nats.url), source="test/replay")
    try:
        sent = {}
        for type_name in ("gpu.health.v1", "remediation.v1", "notify.v1", "gpu.health.v1"):
            event = example_event(type_name)
            await bus.publish(event)
            sent.setdefault(type_name, []).append(event.id)
    finally:
        await bus.close(grace=1)
    settings = Settings(bus=BusSettings(url=own_nats.url))
    since = datetime.now(UTC) - timedelta(minutes=1)

    out = tmp_path / "all.jsonl"
    count = await replay(settings, [], since=since, to=out, state_dir=tmp_path)
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert count == len(lines) == 4
    assert [e["type"] for e in lines] == [
        "gpu.health.v1",
        "gpu.health.v1",
        "remediation.v1",
        "notify.v1",
    ]  # each stream in stream order, streams in table order
    assert [e["id"] for e in lines[:2]] == sent["gpu.health.v1"]

    narrowed = tmp_path / "some.jsonl"
    count = await replay(
        settings,
        ["remediation.>", "notify.critical.*"],
        since=since,
        to=narrowed,
        state_dir=tmp_path,
    )
    assert [json.loads(line)["id"] for line in narrowed.read_text().splitlines()] == [
        sent["remediation.v1"][0],
        sent["notify.v1"][0],
    ]

    later = await replay(
        settings,
        ["gpu.health.>"],
        since=datetime.now(UTC),
        to=tmp_path / "none.jsonl",
        state_dir=tmp_path,
    )
    assert later == 0 and (tmp_path / "none.jsonl").read_text() == ""

    with pytest.raises(CliError, match=r"no nodeward stream holds subject 'nope\.>'"):
        await replay(settings, ["nope.>"], since=since, to=None, state_dir=tmp_path)
