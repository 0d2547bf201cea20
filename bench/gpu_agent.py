"""Benchmark: the GPU agent's CPU share of one core and its RSS, against a bare NVML loop,
and the same agent on AMD GPUs (the AMD SMI backend over a SimAmdSmi of as many MI300X).

Both run in a child process of their own over the same simulated node (8 GPUs): the
agent with 1 s telemetry and its default health poll and heartbeat, publishing to an
embedded nats-server; the bare loop makes the same NVML calls on the same schedule
(telemetry every second, a health sample every poll interval, an event-wait thread) and
nothing else. CPU share = process CPU time / wall time over the measured window, after
a warm-up. Prints medians over the runs. Target: agent under 2% of a core and 80 MB RSS.
`agent+kmsg` is the agent with its second detector reading the host's `/dev/kmsg` (where
readable; `agent` has it off), so the two rows show what the kernel-log reader costs.

Usage: python bench/gpu_agent.py [--seconds S] [--runs R] [--gpus N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import benchlib  # bench/benchlib.py: python puts this folder on sys.path

WARMUP_S = 2.0
POLL_S = 10.0


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def measure(seconds: float) -> dict[str, float]:
    await asyncio.sleep(WARMUP_S)
    cpu0, wall0 = time.process_time(), time.monotonic()
    await asyncio.sleep(seconds)
    cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
    return {"cpu_pct": 100 * cpu / wall, "rss_mb": rss_mb()}


async def child_agent(
    nats_url: str, gpus: int, seconds: float, kernel_log: str = "off", *, amd: bool = False
) -> dict[str, float]:
    from agents.gpu.agent import GpuAgent
    from agents.gpu.backends import AmdSmiBackend
    from agents.gpu.settings import GpuAgentSettings
    from nodeward.bus import Bus
    from nodeward.config import BusSettings
    from nodeward.logs import configure_logging
    from sim.amdsmi import SimAmdSmi
    from sim.nvml import SimNvml

    configure_logging("warning", "json")
    sim: Any = (
        AmdSmiBackend(SimAmdSmi.build("bench-node", count=gpus))
        if amd
        else SimNvml.build("bench-node", count=gpus)
    )
    bus = await Bus.connect(
        BusSettings(url=nats_url, provision=False), source="agent/gpu/bench-node"
    )
    settings = GpuAgentSettings(
        telemetry_interval="1s",
        poll_interval=f"{POLL_S}s",
        kernel_log=kernel_log,
    )
    agent = GpuAgent(sim, bus, settings, node="bench-node")
    task = asyncio.create_task(agent.run())
    try:
        return await measure(seconds)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await bus.close(grace=1)


async def child_bare(gpus: int, seconds: float) -> dict[str, float]:
    from agents.sources.nvml import identify, sample_health, sample_telemetry, wait_events
    from nodeward.watchdog import Lane
    from sim.nvml import SimNvml

    sim = SimNvml.build("bench-node", count=gpus)
    sim.nvmlInit()
    lane = Lane("bare")  # only for the names sample_* mark; calls run inline here
    idents = [identify(sim, lane, i) for i in range(gpus)]
    es = sim.nvmlEventSetCreate()
    stop = threading.Event()
    threading.Thread(
        target=wait_events, args=(sim, es, lambda _: None, lambda _: None, stop), daemon=True
    ).start()

    async def loop() -> None:
        tick = 0
        while True:
            for g in idents:
                sample_telemetry(sim, lane, g)
                if tick % int(POLL_S) == 0:
                    sample_health(sim, lane, g)
            tick += 1
            await asyncio.sleep(1.0)

    task = asyncio.create_task(loop())
    try:
        return await measure(seconds)
    finally:
        stop.set()
        task.cancel()


def run_child(kind: str, args: argparse.Namespace, nats_url: str) -> dict[str, float]:
    argv = ["--child", kind, "--nats", nats_url, "--gpus", str(args.gpus)]
    return benchlib.run_child(__file__, [*argv, "--seconds", str(args.seconds)])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--child", choices=["agent", "agent+kmsg", "agent-amd", "bare"])
    p.add_argument("--nats", default="")
    args = p.parse_args()
    if args.child in ("agent", "agent+kmsg"):
        klog = "auto" if args.child == "agent+kmsg" else "off"  # auto: /dev/kmsg where readable
        print(json.dumps(asyncio.run(child_agent(args.nats, args.gpus, args.seconds, klog))))
        return
    if args.child == "agent-amd":
        print(json.dumps(asyncio.run(child_agent(args.nats, args.gpus, args.seconds, amd=True))))
        return
    if args.child == "bare":
        print(json.dumps(asyncio.run(child_bare(args.gpus, args.seconds))))
        return

    def runs(url: str) -> dict[str, list[dict[str, float]]]:
        return {
            kind: [run_child(kind, args, url) for _ in range(args.runs)]
            for kind in ("bare", "agent", "agent+kmsg", "agent-amd")
        }

    results = asyncio.run(benchlib.with_server(runs))
    print(
        f"{args.gpus} sim GPUs, telemetry 1 s, health poll {POLL_S:g} s, {args.seconds:g} s x {args.runs} runs (medians)"
    )
    for kind, rows in results.items():
        cpu = statistics.median(r["cpu_pct"] for r in rows)
        rss = statistics.median(r["rss_mb"] for r in rows)
        print(f"  {kind:10s}  cpu {cpu:5.2f}% of a core   rss {rss:6.1f} MB")
    agent = results["agent"]
    ok = (
        statistics.median(r["cpu_pct"] for r in agent) < 2
        and statistics.median(r["rss_mb"] for r in agent) < 80
    )
    print(f"  target (agent < 2% and < 80 MB): {'met' if ok else 'NOT met'}")
    amd = statistics.median(r["cpu_pct"] for r in results["agent-amd"])
    nv = statistics.median(r["cpu_pct"] for r in agent)
    print(f"  AMD SMI backend / NVML backend, CPU: {amd / nv:.2f}x" if nv else "")


if __name__ == "__main__":
    main()
