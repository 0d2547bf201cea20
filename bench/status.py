"""Benchmark: how long `nodeward status` takes to read a fleet, batched against per node.

For each fleet size (`--nodes`, default 100 and 1000) a fresh embedded nats-server is seeded
as a running fleet leaves it: per node 8 `gpu.health.v1`, a `gpu.telemetry.v1`, an
`energy.node.v1` and a session's `session.activity.v1`; KV records as the services write
them (the cordon service's node record, the energy totals, a culler session on every tenth
node, a maintenance on every hundredth); 200 audit records. Then, alternating, `--runs`
times each:

- per node (the baseline, the reads `status` made before): every KV key listed then read
  one at a time, and each subject's last message by `get_last_msg`, 64 at a time, for
  what that status showed (cordon KV, GPU health, telemetry, DLQ counts, the last actions);
- batched (`nodeward.fleet_status.read_fleet`): every source status shows now (those, plus
  maintenance, marks, isolations, energy, sessions, agent liveness, credentials), each
  source in one pass (`nodeward.bus.snapshot`), all concurrently;
- batched + assembled: the same reads and the picture `status --json` prints.

Prints the median seconds of each and the ratio of the baseline to the batched read.

Usage: python bench/status.py [--nodes 100 1000] [--runs 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from nats.js.errors import NoKeysError, NotFoundError  # noqa: E402 - after the path is set

from nodeward.bus import Bus  # noqa: E402
from nodeward.bus.kv import TypedKV  # noqa: E402
from nodeward.bus.server import EmbeddedNats  # noqa: E402
from nodeward.config import BusSettings  # noqa: E402
from nodeward.fleet_status import Buckets, gather_status, read_fleet  # noqa: E402
from nodeward.logs import configure_logging  # noqa: E402
from schemas import DecodeError, decode, make_event  # noqa: E402
from schemas.common import ObjectRef  # noqa: E402
from schemas.energy import EnergyNode  # noqa: E402
from schemas.gpu import GpuHealth, GpuTelemetry, HealthState  # noqa: E402
from schemas.remediation import Outcome, Remediation  # noqa: E402
from schemas.session import SessionActivity  # noqa: E402
from schemas.state.cordon import NODES, GpuRecord, NodeRecord  # noqa: E402
from schemas.state.culler import SESSIONS, SessionRecord  # noqa: E402
from schemas.state.energy import TOTALS, EnergyTotals  # noqa: E402
from schemas.state.maintenance import MAINTENANCES, MaintenanceState  # noqa: E402

GPUS = 8


async def seed(bus: Bus, nodes: int) -> None:
    """A fleet of `nodes` as its agents and services leave the streams and KV."""
    now = datetime.now(UTC)
    events: list[Any] = []
    cordon = TypedKV(await bus.kv(NODES.name), NodeRecord)
    totals = TypedKV(await bus.kv(TOTALS.name), EnergyTotals)
    culler = TypedKV(await bus.kv(SESSIONS.name), SessionRecord)
    checkpoint = TypedKV(await bus.kv(MAINTENANCES.name), MaintenanceState)
    telemetry = GpuTelemetry.example()
    energy = EnergyNode.example()
    activity = SessionActivity.example()
    for i in range(nodes):
        node = f"gpu-{i:05d}"
        health = [
            GpuHealth(
                node=node,
                gpu_index=g,
                gpu_uuid=f"GPU-{i}-{g}",
                state=HealthState.HEALTHY,
                observed_at=now,
                heartbeat=True,
            )
            for g in range(GPUS)
        ]
        events += health
        events.append(telemetry.model_copy(update={"node": node}))
        events.append(energy.model_copy(update={"node": node}))
        events.append(activity.model_copy(update={"node": node, "pod": f"nb-{i:05d}"}))
        await cordon.put(
            NODES.key(node),
            NodeRecord(
                gpus={
                    str(h.gpu_index): GpuRecord(
                        state=h.state, observed_at=now, event_id=f"e-{i}-{h.gpu_index}"
                    )
                    for h in health
                }
            ),
        )
        await totals.put(TOTALS.key(node), EnergyTotals(energy_j=1e6, co2e_g=20, updated_at=now))
        if i % 10 == 0:
            await culler.put(
                SESSIONS.key("user-a", f"nb-{i:05d}"),
                SessionRecord(
                    node=node,
                    reason="idle",
                    idle_since=now - timedelta(hours=2),
                    warned_at=now,
                    deadline=now + timedelta(hours=1),
                ),
            )
        if i % 100 == 0:
            await checkpoint.put(
                MAINTENANCES.key(node),
                MaintenanceState(
                    maintenance_id=f"m-{i}",
                    node=node,
                    requested_at=now,
                    trigger_id=f"t-{i}",
                    start_at=now,
                    deadline_s=600,
                ),
            )
    for i in range(200):
        events.append(
            Remediation(
                action="quarantine",
                target=ObjectRef(kind="Node", name=f"gpu-{i % nodes:05d}"),
                outcome=Outcome.REFUSED,
                reason=f"bench {i}",
                actor="service/cordon",
            )
        )
    wrapped = [make_event(e, source="bench/status") for e in events]
    for i in range(0, len(wrapped), 500):
        await bus.publish_many(wrapped[i : i + 500])


async def per_node_reads(nc: Any, actions: int = 10) -> int:
    """What `status` read before batching: KV one key at a time, last messages one subject
    at a time (64 concurrently), the audit trail one message at a time."""
    js = nc.jetstream()
    kv = await js.key_value(NODES.name)
    try:
        keys = await kv.keys()
    except NoKeysError:
        keys = []
    records = 0
    for key in keys:
        entry = await kv.get(key)
        records += bool(entry.value)

    async def last(stream: str, subject: str) -> Any:
        try:
            msg = await js.get_last_msg(stream, subject)
            return decode(msg.subject or subject, msg.headers, msg.data or b"")
        except (NotFoundError, DecodeError):
            return None

    got = 0
    for stream, pattern in (("GPU", "gpu.health.>"), ("TELEMETRY", "gpu.telemetry.>")):
        info = await js.stream_info(stream, subjects_filter=pattern)
        subjects = sorted(info.state.subjects or {})
        for i in range(0, len(subjects), 64):
            found = await asyncio.gather(*(last(stream, s) for s in subjects[i : i + 64]))
            got += sum(1 for e in found if e is not None)
    await js.stream_info("DLQ", subjects_filter="dlq.>")
    info = await js.stream_info("AUDIT")
    seq = info.state.last_seq
    while seq >= max(info.state.first_seq, 1) and seq > info.state.last_seq - actions:
        await js.get_msg("AUDIT", seq)
        seq -= 1
    return records + got


async def batched_reads(nc: Any) -> int:
    seen = await read_fleet(nc, actions=10, buckets=Buckets())
    return len(seen.records) + len(seen.health)


async def batched_and_assembled(nc: Any, url: str) -> int:
    fleet = await gather_status(nc, nats_url=url)
    return len(fleet.model_dump_json())


async def timed(fn: Callable[[], Awaitable[int]]) -> float:
    start = time.perf_counter()
    await fn()
    return time.perf_counter() - start


async def one_size(nodes: int, runs: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedNats(Path(tmp))
        await server.start()
        bus = await Bus.connect(BusSettings(url=server.url), source="bench/status")
        try:
            await seed(bus, nodes)
            nc = bus.nc
            fleet = await gather_status(nc, nats_url=server.url)
            assert len(fleet.nodes) == nodes, (len(fleet.nodes), nodes)
            times: dict[str, list[float]] = {"per_node": [], "batched": [], "assembled": []}
            for _ in range(runs):
                times["per_node"].append(await timed(lambda: per_node_reads(nc)))
                times["batched"].append(await timed(lambda: batched_reads(nc)))
                times["assembled"].append(
                    await timed(lambda: batched_and_assembled(nc, server.url))
                )
            return {k: statistics.median(v) for k, v in times.items()}
        finally:
            await bus.close(grace=1)
            await server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    configure_logging("warning", "console")
    print(f"status reads, medians of {args.runs} runs ({GPUS} GPUs per node)")
    print(f"{'nodes':>6} {'per node (old)':>15} {'batched':>9} {'+assembled':>11} {'ratio':>7}")
    for nodes in args.nodes:
        m = asyncio.run(one_size(nodes, args.runs))
        ratio = m["per_node"] / m["batched"]
        print(
            f"{nodes:>6} {m['per_node']:>14.3f}s {m['batched']:>8.3f}s "
            f"{m['assembled']:>10.3f}s {ratio:>6.1f}x"
        )


if __name__ == "__main__":
    main()
