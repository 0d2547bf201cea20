"""Benchmark: how fast each XID detector fails a GPU, and what the kernel-log reader costs.

One GPU agent on a simulated 8-GPU node with a fake kmsg (`sim.kmsg`), publishing to an
embedded nats-server. Latency: from the injection to the `gpu.health.v1` change to failed
on the bus, for an XID 79 through NVML's event (the baseline) and through the kernel log
only, alternating, each GPU once per agent run; the kernel log is read every
`kernel_log_interval` (default 200 ms), so its latency is about half that plus the rest.
The simulated kmsg is a regular file, so it is polled; the real `/dev/kmsg` wakes the agent
as soon as a record arrives (`add_reader`), without the interval.
Cost: the parser's throughput over a mix of real driver lines and other kernel lines,
against a bare substring scan of the same lines (the floor of any reader). Prints medians.

Usage: python bench/kernel_log.py [--runs R] [--interval 200ms]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

import benchlib  # bench/benchlib.py: python puts this folder on sys.path

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "kernel_log"


async def latencies(nats_url: str, interval: str) -> dict[str, list[float]]:
    from agents.gpu.agent import GpuAgent
    from agents.gpu.settings import GpuAgentSettings
    from nodeward.bus import Bus
    from nodeward.config import BusSettings
    from nodeward.logs import configure_logging
    from sim.kmsg import SimKmsg
    from sim.nvml import SimNvml

    configure_logging("warning", "json")
    out: dict[str, list[float]] = {"nvml": [], "kmsg": []}
    with tempfile.TemporaryDirectory() as tmp:
        sim = SimNvml.build("bench-node", count=8)
        kmsg = SimKmsg(Path(tmp) / "kmsg", sim)
        bus = await Bus.connect(
            BusSettings(url=nats_url, provision=False), source="agent/gpu/bench-node"
        )
        settings = GpuAgentSettings(
            kernel_log="kmsg",
            kmsg_path=kmsg.path,
            kernel_log_interval=interval,
        )
        agent = GpuAgent(sim, bus, settings, node="bench-node")
        failed: dict[int, asyncio.Event] = {i: asyncio.Event() for i in range(8)}

        async def on_health(msg: object) -> None:
            body = json.loads(msg.data)  # type: ignore[attr-defined]
            if body["state"] == "failed":
                failed[body["gpu_index"]].set()

        sub = await bus.nc.subscribe("gpu.health.bench-node.*", cb=on_health)
        task = asyncio.create_task(agent.run())
        try:
            for _ in range(200):  # up to 10 s
                if agent.ready and agent._kernel_log is not None:
                    break
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)
            for gpu in range(8):
                via = "nvml" if gpu % 2 == 0 else "kmsg"
                began = time.perf_counter()
                if via == "nvml":
                    sim.inject_xid(gpu, 79)
                else:
                    kmsg.xid(gpu, 79)
                await asyncio.wait_for(failed[gpu].wait(), 5)
                out[via].append((time.perf_counter() - began) * 1000)
                await asyncio.sleep(random.uniform(0.05, 0.5))  # any phase of the reader
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await sub.unsubscribe()
            sim.close()
            await bus.close(grace=1)
    return out


def parse_rates(repeat: int) -> dict[str, float]:
    from agents.sources.kmsg import DriverLineParser

    lines = [
        json.loads(x)["line"]
        for x in (DATA / "driver_xid_lines.jsonl").read_text().split("\n")
        if x
    ]
    lines += (DATA / "not_xid_lines.txt").read_text().splitlines()
    lines += [f"[{i}.0] usb 1-1: new high-speed USB device number {i}" for i in range(200)]
    corpus = lines * repeat
    began = time.perf_counter()
    hits = sum(1 for line in corpus if "NVRM: Xid" in line)
    bare = time.perf_counter() - began
    parser = DriverLineParser()
    began = time.perf_counter()
    found = sum(len(parser.feed(line)) for line in corpus)
    parsed = time.perf_counter() - began
    assert found >= hits * 0  # both ran
    return {"bare": len(corpus) / bare, "parser": len(corpus) / parsed}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--interval", default="200ms")
    p.add_argument("--child", action="store_true")
    p.add_argument("--nats", default="")
    args = p.parse_args()
    if args.child:
        print(json.dumps(asyncio.run(latencies(args.nats, args.interval))))
        return

    def runs(url: str) -> list[dict[str, list[float]]]:
        argv = ["--child", "--nats", url, "--interval", args.interval]
        return [benchlib.run_child(__file__, argv) for _ in range(args.runs)]  # type: ignore[misc]

    results = asyncio.run(benchlib.with_server(runs))
    nvml = statistics.median(x for r in results for x in r["nvml"])
    kmsg = statistics.median(x for r in results for x in r["kmsg"])
    n = sum(len(r["nvml"]) for r in results)
    print(f"XID 79 to gpu.health failed, {args.runs} agent runs, {n} XIDs per detector (medians)")
    print(f"  nvml event (baseline)      {nvml:7.1f} ms")
    print(f"  kernel log, read every {args.interval:>5s} {kmsg:7.1f} ms   ({kmsg / nvml:.1f}x)")
    rates = [parse_rates(200) for _ in range(args.runs)]
    bare = statistics.median(r["bare"] for r in rates)
    parser = statistics.median(r["parser"] for r in rates)
    print("kernel-log lines per second (medians)")
    print(f"  substring scan (baseline)  {bare:12,.0f}")
    print(f"  DriverLineParser           {parser:12,.0f}   ({parser / bare:.2f}x)")


if __name__ == "__main__":
    main()
