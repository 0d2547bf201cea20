"""Benchmark: from publishing a failed gpu.health.v1 to the taint visible in the Kubernetes API.

Runs an embedded nats-server, the sim cluster with `--nodes` GPU nodes and the cordon
service (breaker opened wide so every node may be quarantined). The sim cluster runs as
its own process (`nodeward sim cluster`) unless `--sim-in-process`. A
node watch (admin identity) timestamps the first time each node shows the taint
`nodeward.io/gpu-unhealthy`; one failed event per node is published every `--interval`.
Latency = taint seen in a watch event - publish call started.

Usage: python bench/detect_to_quarantine.py [--nodes 250] [--interval 0.01] [--sim-in-process]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import structlog
import yaml

from nodeward.bus import Bus
from nodeward.bus.server import EmbeddedNats
from nodeward.config import BusSettings, ClusterSettings
from nodeward.kube import Cluster
from nodeward.kube.client import KubeClient
from nodeward.kube.nodes import taints_of
from nodeward.logs import configure_logging
from services.cordon.marks import TAINT_KEY
from services.cordon.service import build
from sim.cluster import SimCluster
from sim.cluster.seed import NodeSeed, Seed

sys.path.insert(0, str(Path(__file__).parent))
from benchlib import sim_cluster_command, wide_cordon, xid79


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


@contextlib.asynccontextmanager
async def sim_cluster(names: list[str], workdir: Path, *, in_process: bool) -> AsyncIterator[Path]:
    """The sim cluster with `names` as GPU nodes; yields its kubeconfig (contexts
    `nodeward-admin`, `nodeward-cordon`). Out of process by default, so the figures are the
    service's and not the API server's CPU."""
    seed = Seed(namespaces=["nodeward"], nodes=[NodeSeed(name=n) for n in names])
    kubeconfig = workdir / "kubeconfig"
    if in_process:
        sim = SimCluster(seed)
        await sim.start()
        try:
            yield sim.write_kubeconfig(kubeconfig)
        finally:
            await sim.stop()
        return
    seed_file = workdir / "seed.yaml"
    seed_file.write_text(yaml.safe_dump(seed.model_dump(by_alias=True, exclude_defaults=True)))
    proc = await asyncio.create_subprocess_exec(
        *sim_cluster_command(seed_file, kubeconfig, "--port", "0"), stdout=asyncio.subprocess.PIPE
    )
    try:
        assert proc.stdout is not None
        while not (await proc.stdout.readline()).startswith(b"kubeconfig:"):
            if proc.returncode is not None:
                raise RuntimeError("the sim cluster did not start")
        yield kubeconfig
    finally:
        proc.send_signal(signal.SIGTERM)
        await proc.wait()


async def _acked(bus: Bus) -> None:
    """Until the cordon consumer has nothing pending (every event handled and acked)."""
    for _ in range(600):
        info = await bus.js.consumer_info("GPU", "cordon")
        if info.num_ack_pending == 0 and info.num_pending == 0:
            return
        await asyncio.sleep(0.05)


async def run(nodes: int, interval: float, in_process: bool) -> None:
    names = [f"bench-gpu-{i:04d}" for i in range(nodes)]
    seen: dict[str, float] = {}
    sent: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as d:
        async with (
            EmbeddedNats(Path(d) / "nats") as server,
            sim_cluster(names, Path(d), in_process=in_process) as kubeconfig,
        ):
            admin = Cluster(
                KubeClient.from_settings(
                    ClusterSettings(kubeconfig=kubeconfig, context="nodeward-admin")
                )
            )
            daemon = await build(wide_cordon(server.url, kubeconfig))
            await daemon.start()
            bus = await Bus.connect(BusSettings(url=server.url), source="bench/inject")
            all_seen = asyncio.Event()

            async def watch() -> None:
                async for ev in admin.nodes.watch():
                    name = ev.object["metadata"]["name"]
                    if name in seen or not any(
                        t.get("key") == TAINT_KEY for t in taints_of(ev.object)
                    ):
                        continue
                    seen[name] = time.perf_counter()
                    if len(seen) == len(names):
                        all_seen.set()

            watcher = asyncio.create_task(watch())
            await asyncio.sleep(0.5)  # let the watch establish (bench setup, not a test)
            events = [xid79(n) for n in names]
            cpu = time.process_time()
            start = time.perf_counter()
            for name, event in zip(names, events, strict=True):
                sent[name] = time.perf_counter()
                await bus.publish(event)
                await asyncio.sleep(interval)
            try:
                await asyncio.wait_for(all_seen.wait(), 60)
            except TimeoutError:
                print(f"only {len(seen)} of {len(names)} quarantined within 60 s")
            total = time.perf_counter() - start
            await _acked(bus)  # the writes after the taint (the audit, the record) too
            cpu = time.process_time() - cpu
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            await bus.close(grace=1)
            await daemon.stop()
            await admin.close()
    lat = [(seen[n] - sent[n]) * 1000 for n in names if n in seen]
    where = "in-process" if in_process else "separate process"
    print(
        f"injections={len(names)} quarantined={len(lat)} interval={interval * 1000:.0f}ms "
        f"wall={total:.1f}s sim={where}"
    )
    print(
        f"detect->taint ms: p50={pct(lat, 50):.1f} p90={pct(lat, 90):.1f} "
        f"p99={pct(lat, 99):.1f} max={max(lat):.1f} mean={statistics.fmean(lat):.1f}"
    )
    print(
        f"CPU of this process (the cordon service, the injector, the watch), every event "
        f"acked: {cpu * 1000 / len(names):.2f} ms per injection"
    )
    print(f"p99 target < 100 ms (issue 32): {'met' if pct(lat, 99) < 100 else 'MISSED'}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=250)
    ap.add_argument("--interval", type=float, default=0.01, help="seconds between injections")
    ap.add_argument(
        "--sim-in-process", action="store_true", help="run the sim cluster in this process"
    )
    args = ap.parse_args()
    configure_logging("warning", "console")
    structlog.get_logger().info("bench.start")
    asyncio.run(run(args.nodes, args.interval, args.sim_in_process))


if __name__ == "__main__":
    main()
