"""Benchmark: 2,000 opted-in OAuth2 Secrets due at once, renewed by 1 and by 2 replicas.

Each run seeds a fresh sim cluster with `--secrets` Secrets labelled
`nodeward.io/credential=oauth2`, each holding its own grant from the test authorization
server (sim/oauth2.py: authlib, refresh-token rotation and reuse
detection, served by werkzeug's threaded server on loopback), all within their last
third of life, so the scheduler finds every one due on its first scan. It then starts
`replicas` credentials daemons (scheduler + renewer each; one holds the Lease) and times
from the start until every Secret has a `credentials.renewed.v1`. Measured: time to renew
all, renewals/s, and that no refresh token was presented twice (reuse would revoke grants).

Every renewal is: a KV lock, a Secret GET, an authlib refresh over a new HTTP connection
to the IdP, a Secret PUT at its resourceVersion, two events and an audit record.

Usage: python bench/credentials.py [--secrets 2000] [--runs 3]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
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

import httpx  # noqa: E402 - after the path is set

from nodeward.bus import Bus  # noqa: E402
from nodeward.bus.server import EmbeddedNats  # noqa: E402
from nodeward.config import BusSettings, Settings  # noqa: E402
from nodeward.daemon import install_signal_handlers  # noqa: E402
from nodeward.logs import configure_logging  # noqa: E402
from services.credentials.service import build  # noqa: E402
from sim.cluster import SimCluster  # noqa: E402
from sim.cluster.seed import SecretSeed, Seed  # noqa: E402
from sim.oauth2 import serve_forever  # noqa: E402

CLIENT = "bench-client"


def seed(ns: str, idp_url: str, n: int) -> Seed:
    """`n` opted-in Secrets, each with its own grant, all in the last sixth of their life."""
    now = datetime.now(UTC)
    grants = httpx.post(
        f"{idp_url}/issue", json={"client_id": CLIENT, "count": n}, timeout=120
    ).json()
    secrets = [
        SecretSeed(
            name="client", namespace=ns, stringData={"client_secret": grants["client_secret"]}
        )
    ]
    for i, (access, refresh) in enumerate(grants["tokens"]):
        secrets.append(
            SecretSeed(
                name=f"tok-{i:05d}",
                namespace=ns,
                labels={"nodeward.io/credential": "oauth2"},
                annotations={"nodeward.io/client-secret": "client"},
                stringData={
                    "access_token": access,
                    "refresh_token": refresh,
                    "issued_at": (now - timedelta(minutes=50)).isoformat(),
                    "expires_at": (now + timedelta(minutes=10)).isoformat(),
                    "token_endpoint": f"{idp_url}/token",
                    "client_id": CLIENT,
                },
            )
        )
    return Seed(namespaces=[ns, "nodeward"], secrets=secrets)


def replica(settings: dict[str, Any], go: Any) -> None:
    """One credentials daemon in this (child) process, from `go` until terminated."""
    configure_logging("warning", "console")
    go.wait()

    async def run() -> None:
        daemon = await build(Settings(**settings))
        install_signal_handlers(daemon.request_stop)
        await daemon.run_until_stopped()

    asyncio.run(run())


async def renewed(bus: Bus, ns: str) -> int:
    info = await bus.js.stream_info("CREDENTIALS", subjects_filter=f"credentials.renewed.{ns}.>")
    return sum((info.state.subjects or {}).values())


async def one_run(
    bus: Bus, url: str, idp_url: str, tmp: Path, n: int, replicas: int
) -> dict[str, float]:
    uid = uuid.uuid4().hex[:6]
    ns = f"bench-{uid}"
    sim = SimCluster(await asyncio.to_thread(seed, ns, idp_url, n), port=0)
    await sim.start()
    ctx = multiprocessing.get_context("spawn")
    go = ctx.Event()
    procs: list[Any] = []
    try:
        kubeconfig = sim.write_kubeconfig(tmp / f"kubeconfig-{uid}", identity="credentials")
        settings = {
            "bus": {"url": url},
            "cluster": {"kubeconfig": str(kubeconfig)},
            "daemon": {"port": 0, "shutdown_timeout": "5s"},
            "services": {
                "credentials": {
                    "consumer": f"credentials-{uid}",
                    "bucket": f"credentials-{uid}",
                    "subjects": [f"credentials.due.{ns}.>"],
                    "lease": f"bench-{uid}",
                    "scan_interval": "60s",
                    "concurrency": 16,
                }
            },
        }
        procs = [ctx.Process(target=replica, args=(settings, go)) for _ in range(replicas)]
        for proc in procs:
            proc.start()
        await asyncio.sleep(3)  # the children import; the clock starts at `go`
        started = time.monotonic()
        go.set()
        while (done := await renewed(bus, ns)) < n:
            if time.monotonic() - started > 600:
                raise RuntimeError(f"only {done} of {n} renewed after 600 s")
            await asyncio.sleep(0.05)
        took = time.monotonic() - started
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            await asyncio.to_thread(proc.join, 30)
        await sim.stop()
    return {"seconds": took, "rate": n / took}


async def main(args: argparse.Namespace) -> None:
    configure_logging("warning", "console")
    results: dict[int, list[dict[str, float]]] = {1: [], 2: []}
    ctx = multiprocessing.get_context("spawn")
    urls = ctx.Queue()
    idp = ctx.Process(target=serve_forever, args=(urls,), daemon=True)
    idp.start()
    idp_url = await asyncio.to_thread(urls.get, True, 60)
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        server = EmbeddedNats(tmp / "nats")
        await server.start()
        try:
            bus = await Bus.connect(BusSettings(url=server.url), source="bench/credentials")
            for _ in range(args.runs):
                for replicas in (1, 2):
                    results[replicas].append(
                        await one_run(bus, server.url, idp_url, tmp, args.secrets, replicas)
                    )
            await bus.close(grace=1)
            stats = await asyncio.to_thread(
                lambda: httpx.get(f"{idp_url}/stats", timeout=10).json()
            )
        finally:
            await server.stop()
            idp.terminate()
    print(f"{args.secrets} OAuth2 Secrets due at once, runs {args.runs} (medians)")
    base = statistics.median(r["rate"] for r in results[1])
    for replicas, runs in results.items():
        seconds = statistics.median(r["seconds"] for r in runs)
        rate = statistics.median(r["rate"] for r in runs)
        print(
            f"  {replicas} replica{'s' if replicas > 1 else ' '}  all renewed in {seconds:6.1f} s"
            f"  {rate:7.0f} renewals/s  ({rate / base:.2f}x 1 replica)"
        )
    print(
        f"  refreshes {stats['refreshes']}, a refresh token presented twice: "
        f"{'YES' if stats['max_presented'] > 1 else 'never'}, reuse detected: "
        f"{stats['reuse_detected']}"
    )


if __name__ == "__main__":
    parser = options(__doc__.splitlines()[0], secrets=2000, runs=3)
    asyncio.run(main(parser.parse_args()))
