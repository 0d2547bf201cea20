"""Benchmark: nodeward's publish and consume path against raw nats-py, same server, same event.

Baseline (raw nats-py): `js.publish_async` of the encoded body for publishing; a durable
pull consumer with `fetch(batch)` + `ack()` for consuming. nodeward: `Bus.publish_many`
(encode to CloudEvents binary mode + publish_async + ack wait + retry bookkeeping) and a
`Consumer` (fetch, decode to the typed model, bounded concurrency, ack) with a no-op handler.

Usage: python bench/bus.py [--events N] [--runs R] [--batch B]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import nats

from nodeward.bus import Bus, ConsumerSpec
from nodeward.bus.server import EmbeddedNats
from nodeward.config import BusSettings
from nodeward.logs import configure_logging
from schemas import encode, make_event
from schemas.gpu import GpuHealth, HealthState


def make_events(n: int) -> list:
    data = GpuHealth(
        node="gpu-node-07",
        gpu_index=3,
        gpu_uuid="GPU-5d3c1b2a-8f4e-4a7b-9c6d-0e1f2a3b4c5d",
        model="NVIDIA H100 80GB HBM3",
        pci_bus_id="00000000:4E:00.0",
        state=HealthState.HEALTHY,
        heartbeat=True,
        observed_at=datetime.now(UTC),
        agent_boot_id="b6a1",
        sequence=42,
    )
    return [make_event(data, source="agent/gpu/gpu-node-07") for _ in range(n)]


async def purge(js, stream: str = "GPU") -> None:
    await js.purge_stream(stream)
    for c in await js.consumers_info(stream):
        await js.delete_consumer(stream, c.name)


async def raw_publish(js, wires, chunk: int, headers: bool) -> float:
    t0 = time.perf_counter()
    for i in range(0, len(wires), chunk):
        futs = [
            await js.publish_async(w.subject, w.body, headers=dict(w.headers) if headers else None)
            for w in wires[i : i + chunk]
        ]
        await asyncio.gather(*futs)
    return time.perf_counter() - t0


async def nodeward_publish(bus: Bus, events, chunk: int) -> float:
    t0 = time.perf_counter()
    for i in range(0, len(events), chunk):
        await bus.publish_many(events[i : i + chunk])
    return time.perf_counter() - t0


async def raw_consume(js, n: int, batch: int, name: str) -> float:
    from nats.js import api

    await js.add_consumer(
        "GPU",
        config=api.ConsumerConfig(
            name=name,
            durable_name=name,
            ack_policy=api.AckPolicy.EXPLICIT,
            max_ack_pending=10000,
            filter_subject="gpu.health.>",
        ),
    )
    psub = await js.pull_subscribe_bind(durable=name, stream="GPU")
    got = 0
    t0 = time.perf_counter()
    while got < n:
        try:
            msgs = await psub.fetch(batch, timeout=1)
        except TimeoutError:
            continue
        for m in msgs:
            await m.ack()
        got += len(msgs)
    elapsed = time.perf_counter() - t0
    await psub.unsubscribe()
    return elapsed


async def nodeward_consume(bus: Bus, n: int, batch: int, name: str, concurrency: int) -> float:
    done = asyncio.Event()
    count = 0

    async def handler(event, delivery) -> None:
        nonlocal count
        count += 1
        if count >= n:
            done.set()

    spec = ConsumerSpec(
        name=name,
        stream="GPU",
        subjects=("gpu.health.>",),
        batch=batch,
        concurrency=concurrency,
        max_ack_pending=10000,
    )
    t0 = time.perf_counter()
    consumer = await bus.consume(spec, handler)
    await done.wait()
    elapsed = time.perf_counter() - t0
    await consumer.stop()
    bus.consumers.remove(consumer)
    return elapsed


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=20000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--chunk", type=int, default=1000)
    ap.add_argument("--concurrency", type=int, default=8)
    args = ap.parse_args()
    configure_logging("warning")

    events = make_events(args.events)
    wires = [encode(e) for e in events]
    body = len(wires[0].body)
    hdr = sum(len(k) + len(v) + 4 for k, v in wires[0].headers.items())
    with tempfile.TemporaryDirectory() as d:
        async with EmbeddedNats(Path(d)) as server:
            bus = await Bus.connect(BusSettings(url=server.url), source="bench")
            nc = await nats.connect(server.url)
            js = nc.jetstream()
            pub_raw, pub_nw, con_raw, con_nw, pub_body, con_body = [], [], [], [], [], []
            for run in range(args.runs):
                # Alternate the order so drifting machine load does not favour one side.
                order = ["body", "raw", "nodeward"] if run % 2 == 0 else ["nodeward", "raw", "body"]
                for side in order:
                    await purge(js)
                    if side == "body":
                        pub_body.append(
                            args.events / await raw_publish(js, wires, args.chunk, headers=False)
                        )
                        con_body.append(
                            args.events
                            / await raw_consume(js, args.events, args.batch, f"body{run}")
                        )
                    elif side == "raw":
                        fresh = [
                            encode(e) for e in make_events(args.events)
                        ]  # new ids: no dedup across runs
                        pub_raw.append(
                            args.events / await raw_publish(js, fresh, args.chunk, headers=True)
                        )
                        con_raw.append(
                            args.events
                            / await raw_consume(js, args.events, args.batch, f"raw{run}")
                        )
                    else:
                        events = make_events(args.events)
                        pub_nw.append(args.events / await nodeward_publish(bus, events, args.chunk))
                        con_nw.append(
                            args.events
                            / await nodeward_consume(
                                bus, args.events, args.batch, f"nw{run}", args.concurrency
                            )
                        )
            await nc.close()
            await bus.close()

    def show(label: str, raw: list[float], ours: list[float]) -> None:
        r, o = statistics.median(raw), statistics.median(ours)
        paired = statistics.median(x / y for x, y in zip(ours, raw, strict=True))
        print(
            f"{label:8s} raw nats-py {r:9.0f} ev/s   nodeward {o:9.0f} ev/s   "
            f"ratio of medians {o / r:.2f}   median of paired ratios {paired:.2f}"
            f"   (runs: raw {[round(x) for x in raw]}, nodeward {[round(x) for x in ours]})"
        )

    print(
        f"events/run={args.events} runs={args.runs} body={body}B ce-headers~{hdr}B batch={args.batch} "
        f"chunk={args.chunk} concurrency={args.concurrency} storage=file"
    )
    print("baseline = raw nats-py sending the same wire message (CloudEvents headers + body):")
    show("publish", pub_raw, pub_nw)
    show("consume", con_raw, con_nw)
    print(
        "baseline = raw nats-py sending the body alone (no headers; what CloudEvents binary mode costs):"
    )
    show("publish", pub_body, pub_nw)
    show("consume", con_body, con_nw)


if __name__ == "__main__":
    asyncio.run(main())
