"""Benchmark: the culler's intake of session events, against a bare consumer of the same events.

A fleet sends every session's `session.activity.v1` each interval and `session.idle.v1` for
the idle ones; at 500 nodes of 8 sessions and a 30 s interval that is about 130 events/s.
One sim cluster node holds `--sessions` notebook pods; each case publishes `--events`
events for them to an embedded nats-server and times from the first publish until the
consumer has acked every one:

- bare: a pull consumer that decodes and acks (the floor of any consumer);
- culler, quiet: the culler on a mix of 90 % activity and 10 % idle short of warn_after
  (the common case: settled from KV alone);
- culler, warned: idle events past warn_after for sessions already warned and not yet
  due (each reads its pod, Notebook and KV: the path with API reads).

Prints medians over `--runs` of events/s, the ratio to bare, and the culler's requests to
the sim API per event.

Usage: python bench/culler.py [--sessions 200] [--events 5000] [--runs 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from benchlib import options

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from nodeward.bus import Bus  # noqa: E402 - after the path is set
from nodeward.bus.server import EmbeddedNats  # noqa: E402
from nodeward.config import BusSettings, Settings  # noqa: E402
from nodeward.logs import configure_logging  # noqa: E402
from schemas import decode, make_event  # noqa: E402
from schemas.session import (  # noqa: E402
    ActivityState,
    IdleEvidence,
    SessionActivity,
    SessionIdle,
    SessionKind,
)
from services.culler.service import build  # noqa: E402
from services.culler.state import SessionRecord, session_key  # noqa: E402
from sim.cluster import SimCluster  # noqa: E402
from sim.cluster.seed import NodeSeed, NotebookSeed, Owner, PodSeed, Seed  # noqa: E402

NS = "bench"


def seed(node: str, sessions: int) -> Seed:
    names = [f"nb-{i:04d}" for i in range(sessions)]
    pods = [
        PodSeed(
            name=f"{nb}-0",
            namespace=NS,
            node=node,
            role="notebook",
            owner=Owner(kind="StatefulSet", name=nb),
            labels={"notebook-name": nb, "statefulset": nb},
        )
        for nb in names
    ]
    notebooks = [NotebookSeed(name=nb, namespace=NS, gpus=0) for nb in names]
    return Seed(namespaces=[NS, "nodeward"], nodes=[NodeSeed(name=node)], pods=pods,
                notebooks=notebooks)  # fmt: skip


def events(node: str, uids: dict[str, str], n: int, case: str) -> list[Any]:
    now = datetime.now(UTC)
    pods = sorted(uids)
    out = []
    for i in range(n):
        pod = pods[i % len(pods)]
        if case == "warned" or i % 10 == 0:
            since = now - timedelta(minutes=150 if case == "warned" else 5)
            data: Any = SessionIdle(
                namespace=NS, pod=pod, node=node, kind=SessionKind.NOTEBOOK, uid=uids[pod],
                idle_since=since, idle_for_s=(now - since).total_seconds(),
                evidence=[IdleEvidence(signal="cpu", idle_since=since, detail="0.01 cores")],
            )  # fmt: skip
        else:
            data = SessionActivity(
                namespace=NS, pod=pod, node=node, kind=SessionKind.NOTEBOOK, uid=uids[pod],
                state=ActivityState.ACTIVE, cpu_cores=1.0, sampled_at=now,
            )  # fmt: skip
        out.append(make_event(data, source=f"agent/idle/{node}"))
    return out


async def drained(bus: Bus, consumer: str, total: int) -> None:
    while True:
        info = await bus.js.consumer_info("SESSIONS", consumer)
        if info.delivered.stream_seq and info.num_pending == 0 and info.num_ack_pending == 0:
            return
        await asyncio.sleep(0.01)  # polling the consumer's state, the end of the timed window


async def bare(bus: Bus, node: str, batch: list[Any]) -> float:
    name = f"bare-{uuid.uuid4().hex[:6]}"
    psub = await bus.js.pull_subscribe(f"session.*.{node}.>", durable=name, stream="SESSIONS")
    started = time.monotonic()
    await bus.publish_many(batch)
    done = 0
    while done < len(batch):
        for m in await psub.fetch(256, timeout=5):
            decode(m.subject, m.headers, m.data)
            await m.ack()
            done += 1
    took = time.monotonic() - started
    await psub.unsubscribe()
    return len(batch) / took


async def culler(
    bus: Bus, url: str, sim: SimCluster, kubeconfig: Path, node: str, batch: list[Any],
    uids: dict[str, str], case: str,
) -> tuple[float, float]:  # fmt: skip
    uid = uuid.uuid4().hex[:6]
    settings = Settings(
        bus={"url": url},
        cluster={"kubeconfig": kubeconfig},
        services={"culler": {"consumer": f"culler-{uid}", "bucket": f"culler-{uid}",
                             "subjects": [f"session.*.{node}.>"], "warn_after": "2h",
                             "cull_after": "3h"}},
    )  # fmt: skip
    if case == "warned":  # every session warned already, due in an hour
        kv = await bus.kv(f"culler-{uid}", history=5)
        now = datetime.now(UTC)
        for pod, pod_uid in uids.items():
            record = SessionRecord(uid=pod_uid, reason="idle", idle_since=now - timedelta(minutes=150),
                                   warned_at=now - timedelta(minutes=30), warn_id="w", warn_sent=True,
                                   deadline=now + timedelta(hours=1))  # fmt: skip
            await kv.put(session_key(NS, pod), record.model_dump_json().encode())
    daemon = await build(settings)
    await daemon.start()
    try:
        while not (await daemon.readiness()).ready:  # noqa: ASYNC110 - before the window
            await asyncio.sleep(0.05)
        before = sum(1 for r in sim.requests if r[0] == "culler")
        started = time.monotonic()
        await bus.publish_many(batch)
        await drained(bus, f"culler-{uid}", len(batch))
        took = time.monotonic() - started
        requests = sum(1 for r in sim.requests if r[0] == "culler") - before
    finally:
        await daemon.stop()
    return len(batch) / took, requests / len(batch)


async def main(args: argparse.Namespace) -> None:
    configure_logging("warning", "console")
    node = f"gpu-bench-{uuid.uuid4().hex[:6]}"
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedNats(Path(tmp) / "nats")
        await server.start()
        sim = SimCluster(seed(node, args.sessions), port=0)
        await sim.start()
        try:
            kubeconfig = sim.write_kubeconfig(Path(tmp) / "kubeconfig", identity="culler")
            bus = await Bus.connect(BusSettings(url=server.url), source="bench/culler")
            admin = sim.write_kubeconfig(Path(tmp) / "admin")
            from nodeward.config import ClusterSettings
            from nodeward.kube import Cluster

            async with Cluster.connect(ClusterSettings(kubeconfig=admin)) as cluster:
                uids = {
                    p["metadata"]["name"]: p["metadata"]["uid"] for p in await cluster.pods.list(NS)
                }
            results: dict[str, list[float]] = {"bare": [], "quiet": [], "warned": [],
                                               "quiet_rpe": [], "warned_rpe": []}  # fmt: skip
            for _ in range(args.runs):
                # Each case its own subjects (the node token), so a consumer sees its batch only.
                token = f"{node}-{uuid.uuid4().hex[:6]}"
                results["bare"].append(
                    await bare(bus, token, events(token, uids, args.events, "quiet"))
                )
                for case in ("quiet", "warned"):
                    token = f"{node}-{uuid.uuid4().hex[:6]}"
                    n = args.events if case == "quiet" else max(args.events // 5, len(uids))
                    rate, rpe = await culler(bus, server.url, sim, kubeconfig, token,
                                             events(token, uids, n, case), uids, case)  # fmt: skip
                    results[case].append(rate)
                    results[f"{case}_rpe"].append(rpe)
            await bus.close(grace=1)
        finally:
            await sim.stop()
            await server.stop()
    med = {k: statistics.median(v) for k, v in results.items()}
    print(f"sessions {args.sessions}, events {args.events}, runs {args.runs} (medians)")
    print(f"  bare consumer        {med['bare']:8.0f} events/s")
    print(f"  culler, quiet        {med['quiet']:8.0f} events/s  ({med['quiet'] / med['bare']:.2f}x bare)"
          f"  {med['quiet_rpe']:.3f} API requests/event")  # fmt: skip
    print(f"  culler, warned       {med['warned']:8.0f} events/s  ({med['warned'] / med['bare']:.2f}x bare)"
          f"  {med['warned_rpe']:.2f} API requests/event")  # fmt: skip


if __name__ == "__main__":
    parser = options(__doc__.splitlines()[0], sessions=200, events=5000, runs=3)
    asyncio.run(main(parser.parse_args()))
