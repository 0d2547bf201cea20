"""The Falco response's throughput and latency, from HTTP POST to the decision audited.

Each run starts a fresh NATS and sim cluster holding the sample alerts' pods, then:
- baseline: the same alerts published raw on `falco.<priority>.<rule>` (as Falcosidekick's
  NATS output does) to a bare `Bus.consume` handler that only acks: the floor any
  nodeward consumer starts from; latency is publish -> handled;
- falco: `nodeward service falco` in a process of its own (as its Deployment runs it),
  the alerts POSTed to its ingest (`--concurrency` at a time, bearer token), through
  the rules, guards and actions, until each alert's `remediation.v1` is on the AUDIT
  stream; latency is POST sent -> audit record received.
Alerts are distinct (no duplicate window hits). `--priority notice` answers each with a
notify (one audit); `critical` with checkpoint, isolate and notify (three audits, the
first counts). Prints medians over the runs and the ratio falco / baseline.

    python bench/falco.py [--alerts 500] [--runs 3] [--concurrency 16] [--priority notice]
                          [--log-level info]
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import shutil
import signal
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from benchlib import options

from nodeward.bus import Bus, ConsumerSpec
from nodeward.bus.server import EmbeddedNats
from nodeward.config import BusSettings
from nodeward.logs import configure_logging
from schemas.cloudevents import decode
from sim.cluster import SimCluster
from sim.falco_samples import DROP_AND_EXECUTE, sample_seed, samples, sidekick_subject

TOKEN = "bench-token-0123456789abcdef"
RULES = {"notice": "Terminal shell in container", "critical": DROP_AND_EXECUTE}


def alerts(count: int, priority: str, uid: str, tag: str = "run") -> list[dict[str, Any]]:
    """`count` distinct alerts of one rule on the seed's pods (a different command each;
    batches of another `tag` differ from this one's too)."""
    base = next(a for a in samples() if a["rule"] == RULES[priority])
    out = []
    for i in range(count):
        alert = copy.deepcopy(base)
        fields = alert["output_fields"]
        if uid:  # the sample seed's namespaces of that uid; none: the samples' own
            fields["k8s.ns.name"] = f"{fields['k8s.ns.name']}-{uid}"
        fields["proc.cmdline"] = f"{fields['proc.cmdline']} #{tag}{i}"
        alert["output"] = f"{alert['output']} {tag}={i}"
        alert["uuid"] = f"00000000-0000-4000-{ord(tag[0]):04x}-{i:012d}"
        out.append(alert)
    return out


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def baseline(bus: Bus, batch: list[dict[str, Any]]) -> tuple[float, list[float]]:
    """Raw publishes on the Sidekick subjects, a consumer that only acks."""
    sent: dict[str, float] = {}
    latencies: list[float] = []
    done = asyncio.Event()

    async def handler(event: Any, _delivery: Any) -> None:
        latencies.append(time.monotonic() - sent[event.id])
        if len(latencies) >= len(batch):
            done.set()

    subject = sidekick_subject(batch[0])
    spec = ConsumerSpec(
        name="baseline", stream="SECURITY", subjects=(subject,), max_ack_pending=10000
    )
    consumer = await bus.consume(spec, handler)
    began = time.monotonic()
    for alert in batch:
        body = json.dumps(alert).encode()
        sent[decode(subject, None, body).id] = time.monotonic()
        await bus.nc.publish(subject, body)
    await asyncio.wait_for(done.wait(), 120)
    elapsed = time.monotonic() - began
    await consumer.stop()
    bus.consumers.remove(consumer)
    await bus.js.delete_consumer("SECURITY", "baseline")
    return elapsed, latencies


async def through_falco(
    bus: Bus, url: str, batch: list[dict[str, Any]], concurrency: int
) -> tuple[float, float, list[float]]:
    """POSTs to the ingest; each alert's first audit record on AUDIT ends its clock."""
    sent: dict[str, float] = {}
    audited: dict[str, float] = {}
    done = asyncio.Event()

    async def on_audit(msg: Any) -> None:
        trigger = json.loads(msg.data).get("trigger_event_id")
        if trigger and trigger not in audited:
            audited[trigger] = time.monotonic()
            if len(audited) >= len(batch):
                done.set()

    sub = await bus.nc.subscribe("remediation.>", cb=on_audit)
    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    for alert in batch:
        queue.put_nowait(alert)
    headers = {"Authorization": f"Bearer {TOKEN}"}

    async def poster(client: httpx.AsyncClient) -> None:
        while not queue.empty():
            alert = queue.get_nowait()
            at = time.monotonic()
            answer = await client.post(url, json=alert, headers=headers)
            answer.raise_for_status()
            sent[answer.json()["published"][0]] = at

    began = time.monotonic()
    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=30) as client:
        await asyncio.gather(*(poster(client) for _ in range(concurrency)))
    answered = time.monotonic() - began
    await asyncio.wait_for(done.wait(), 120)
    elapsed = time.monotonic() - began
    await sub.unsubscribe()
    return elapsed, answered, [audited[i] - sent[i] for i in sent]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def ready(daemon_url: str, proc: asyncio.subprocess.Process) -> None:
    """Until the service's /readyz says its consumer is bound."""
    async with httpx.AsyncClient() as client:
        for _ in range(600):
            if proc.returncode is not None:
                raise RuntimeError("nodeward service falco exited before it was ready")
            try:
                if (await client.get(f"{daemon_url}/readyz", timeout=1)).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError("nodeward service falco not ready within 60 s")


@dataclass
class Stage:
    """What a falco bench runs against: a scratch folder holding the ingest's bearer token
    (`TOKEN`), a NATS server, the sim cluster of `uid`'s sample seed, and a bus client."""

    tmp: Path
    uid: str
    server: EmbeddedNats
    sim: SimCluster
    bus: Bus

    @property
    def token(self) -> Path:
        return self.tmp / "token"

    async def spawn_falco(
        self, falco: dict[str, Any], daemon_port: int, log_level: str
    ) -> asyncio.subprocess.Process:
        """The falco service with settings `falco`, its daemon on `daemon_port`, in a
        process of its own, as its Deployment runs it."""
        config = self.tmp / "config.yaml"
        daemon = {"host": "127.0.0.1", "port": daemon_port}
        config.write_text(json.dumps({"daemon": daemon, "services": {"falco": falco}}))
        kubeconfig = self.sim.write_kubeconfig(self.tmp / "kubeconfig", identity="falco")
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", "launch", "--log-level", log_level, "service", "falco",
            "--nats", self.server.url, "--kubeconfig", str(kubeconfig), "--config", str(config),
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip


@contextlib.asynccontextmanager
async def staged(prefix: str, uid: str) -> AsyncIterator[Stage]:
    """A `Stage` for one run, all of it stopped and removed after."""
    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    server = EmbeddedNats(tmp / "nats")
    await server.start()
    sim = SimCluster(sample_seed(uid), port=0)
    await sim.start()
    bus = await Bus.connect(BusSettings(url=server.url), source="bench")
    stage = Stage(tmp, uid, server, sim, bus)
    stage.token.write_text(TOKEN)
    try:
        yield stage
    finally:
        await bus.close()
        await sim.stop()
        await server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


async def one_run(count: int, priority: str, concurrency: int, log_level: str) -> dict[str, Any]:
    async with staged("falco-bench-", "bench") as stage:
        batch = alerts(count, priority, stage.uid)
        base_s, base_lat = await baseline(stage.bus, batch)
        await stage.bus.js.purge_stream("SECURITY")
        limit = {"per_minute": 1e9, "burst": 1_000_000}
        ingest_port, daemon_port = free_port(), free_port()
        falco = {
            "rate_limit_per_pod": limit,
            "rate_limit_per_rule": limit,
            "ingest": {"host": "127.0.0.1", "port": ingest_port, "token_file": str(stage.token)},
        }
        proc = await stage.spawn_falco(falco, daemon_port, log_level)
        try:
            await ready(f"http://127.0.0.1:{daemon_port}", proc)
            url = f"http://127.0.0.1:{ingest_port}/"
            falco_s, answered_s, falco_lat = await through_falco(stage.bus, url, batch, concurrency)
        finally:
            proc.send_signal(signal.SIGTERM)
            await proc.wait()
    return {
        "base_rate": count / base_s,
        "base_p50": pct(base_lat, 0.5),
        "base_p99": pct(base_lat, 0.99),
        "rate": count / falco_s,
        "ingest_rate": count / answered_s,
        "p50": pct(falco_lat, 0.5),
        "p99": pct(falco_lat, 0.99),
    }


async def main(count: int, runs: int, concurrency: int, priority: str, log_level: str) -> None:
    configure_logging("warning", "console")
    results = [await one_run(count, priority, concurrency, log_level) for _ in range(runs)]

    def med(key: str) -> float:
        return statistics.median(r[key] for r in results)

    print(f"alerts per run:        {count} ({priority}: {RULES[priority]!r}), {runs} runs, medians")
    print(
        f"baseline (raw NATS, ack only):  {med('base_rate'):8.0f} alerts/s   "
        f"p50 {med('base_p50') * 1000:7.1f} ms   p99 {med('base_p99') * 1000:7.1f} ms"
    )
    print(
        f"falco (HTTP -> audited):        {med('rate'):8.0f} alerts/s   "
        f"p50 {med('p50') * 1000:7.1f} ms   p99 {med('p99') * 1000:7.1f} ms   "
        f"(concurrency {concurrency})"
    )
    print(f"ingest alone (POST answered):   {med('ingest_rate'):8.0f} alerts/s")
    print(f"throughput ratio falco/baseline: {med('rate') / med('base_rate'):.3f}")


if __name__ == "__main__":
    parser = options(__doc__, alerts=500, runs=3, concurrency=16)
    parser.add_argument("--priority", choices=sorted(RULES), default="notice")
    parser.add_argument(
        "--log-level", default="info", help="the service's (info: a line per action, as deployed)"
    )
    args = parser.parse_args()
    asyncio.run(main(args.alerts, args.runs, args.concurrency, args.priority, args.log_level))
