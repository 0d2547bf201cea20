"""Benchmark: the accounting service's intake of `energy.pod.v1`, and `nodeward report`'s read.

A fleet of 500 nodes with 8 GPU pods each and a 60 s interval sends about 67 pod events/s.
One sim cluster node holds `--pods` GPU pods; each run publishes `--intervals` 60-second
intervals of every pod (their hours' rollups fill as in production: 60 ids per pod-hour) to
an embedded nats-server and times from the first publish until the service has acked every
one; then the report's read of the bucket and its sums (`--by namespace`), as
`nodeward report` does them. Prints medians over `--runs`.

Usage: python bench/accounting.py [--pods 200] [--intervals 30] [--runs 3]
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from benchlib import options

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from nodeward.bus import Bus  # noqa: E402 - after the path is set
from nodeward.bus.server import EmbeddedNats  # noqa: E402
from nodeward.config import BusSettings, Settings  # noqa: E402
from nodeward.logs import configure_logging  # noqa: E402
from schemas import make_event  # noqa: E402
from schemas.energy import EnergyPod, Interval  # noqa: E402
from services.accounting.report import Window, build  # noqa: E402
from services.accounting.service import build as build_service  # noqa: E402
from services.accounting.show import read_rollups  # noqa: E402
from sim.cluster import SimCluster  # noqa: E402
from sim.cluster.seed import NodeSeed, PodSeed, Seed  # noqa: E402


async def one_run(url: str, tmp: Path, pods: int, intervals: int) -> tuple[float, float, int]:
    uid = uuid.uuid4().hex[:6]
    node, ns = f"bench-{uid}", f"ns-{uid}"
    names = [f"p-{i:04d}" for i in range(pods)]
    seed = Seed(
        namespaces=[ns, "nodeward"],
        nodes=[NodeSeed(name=node)],
        pods=[PodSeed(name=n, namespace=ns, node=node, gpus=1) for n in names],
    )
    async with SimCluster(seed, port=0) as sim:
        kubeconfig = sim.write_kubeconfig(tmp / f"kc-{uid}", identity="accounting")
        bucket = f"accounting-{uid}"
        settings = Settings(
            bus={"url": url},
            cluster={"kubeconfig": kubeconfig},
            services={
                "accounting": {
                    "bucket": bucket,
                    "consumer_prefix": f"acc-{uid}",
                    "energy_subjects": [f"energy.pod.{node}.>"],
                    "session_subjects": [f"session.*.{node}.>"],
                    "finding_subjects": [f"node.finding.{node}.>"],
                    "culler_actor": f"bench-{uid}",
                }
            },
        )
        bus = await Bus.connect(BusSettings(url=url), source="bench")
        start = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=2)
        events = [
            make_event(
                EnergyPod(
                    namespace=ns,
                    pod=name,
                    node=node,
                    interval=Interval(
                        start=start + timedelta(minutes=i),
                        end=start + timedelta(minutes=i + 1),
                    ),
                    gpu_energy_j=40_000.0,
                    cpu_energy_j=2_000.0,
                    energy_j=42_000.0,
                    gpus=1.0,
                    attribution="gpu-exclusive",
                ),
                source=f"agent/energy/{node}",
            )
            for i in range(intervals)
            for name in names
        ]
        daemon = await build_service(settings)
        await daemon.start()
        began = time.perf_counter()
        for k in range(0, len(events), 500):
            await bus.publish_many(events[k : k + 500])
        while True:
            info = await bus.js.consumer_info("ENERGY", f"acc-{uid}-energy")
            if info.num_pending == 0 and info.num_ack_pending == 0:
                break
            await asyncio.sleep(0.05)
        intake = len(events) / (time.perf_counter() - began)
        await daemon.stop()
        report_settings = Settings(bus={"url": url}, services={"accounting": {"bucket": bucket}})
        began = time.perf_counter()
        cells, hours, periods = await read_rollups(report_settings, tmp)
        rows = build("namespace", Window.of(start, datetime.now(UTC)), cells, hours, periods)
        read_s = time.perf_counter() - began
        assert abs(rows[0].energy_j - 42_000.0 * len(events)) < 1e-3 * len(events)
        await bus.close()
        return intake, read_s, len(cells)


async def main(pods: int, intervals: int, runs: int) -> None:
    configure_logging("warning", "console")
    with tempfile.TemporaryDirectory() as d:
        server = EmbeddedNats(Path(d) / "nats")
        await server.start()
        try:
            results = [await one_run(server.url, Path(d), pods, intervals) for _ in range(runs)]
        finally:
            await server.stop()
    intake = statistics.median(r[0] for r in results)
    read = statistics.median(r[1] for r in results)
    print(
        f"{pods} pods x {intervals} intervals ({pods * intervals} events), medians of {runs}: "
        f"intake {intake:,.0f} events/s; report read and sum {read:.3f} s over "
        f"{results[0][2]} pod-hour cells"
    )


if __name__ == "__main__":
    parser = options(__doc__.splitlines()[0], pods=200, intervals=30, runs=3)
    args = parser.parse_args()
    asyncio.run(main(args.pods, args.intervals, args.runs))
