"""A Critical alert's latency alone and behind a flood of Notices, and the memory the flood
costs: the falco service as shipped against the same service read through one lane with an
unbounded ingest (what nodeward did before the urgent lane and back-pressure).

The flood comes from a process of its own, as it does from Falco on other machines: posted
from the measuring process, its 50 clients' work delayed the Critical alert's own POST in
that process's event loop, which the figures then blamed on the service.

Each case starts a fresh NATS and sim cluster and `nodeward service falco` in a process of
its own, with the shipped rules and limits. Then:
- alone: `--criticals` Critical alerts POSTed one at a time, each timed from POST to its
  first `remediation.v1` on AUDIT (the decision, whatever it is);
- flood: `--notices` distinct Notice alerts POSTed `--concurrency` at a time (or, with
  `--via nats`, published on NATS as Falcosidekick's output does: faster than the handlers,
  so a backlog builds), and from
  `--delay` seconds in, the same number of Critical alerts, one every `--spacing` seconds,
  timed the same way; what the ingest answered (200, 429) is counted;
- memory: the RSS of the falco process and of nats-server before the flood, at its peak
  (sampled every 0.2 s) and once every stored Notice is handled.
Cases: `lanes` (as shipped: `falco-urgent` apart, 429 over `max_backlog`) and `one-lane`
(`urgent_from: Emergency`, so Critical alerts share the Notices' consumer, and no bound).
Prints medians over the runs of each case's p50, p99 and max latency.

    python bench/falco_flood.py [--notices 20000] [--criticals 10] [--runs 1]
                                [--concurrency 50] [--delay 5] [--spacing 1]
                                [--via http|nats] [--cases lanes,one-lane]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import json
import signal
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from benchlib import PeakRss, options
from falco import TOKEN, alerts, free_port, pct, ready, staged

from nodeward.bus import Bus
from nodeward.config import BusSettings
from nodeward.logs import configure_logging
from sim.falco_samples import sidekick_subject

CASES = {
    "lanes": {},
    "one-lane": {"urgent_from": "Emergency", "ingest": {"max_backlog": 10**9}},
}


@dataclass
class Clock:
    """POST times and each trigger's first audit: the latency of a decision."""

    sent: dict[str, float] = field(default_factory=dict)
    audited: dict[str, float] = field(default_factory=dict)
    news: asyncio.Event = field(default_factory=asyncio.Event)

    async def on_audit(self, msg: Any) -> None:
        trigger = json.loads(msg.data).get("trigger_event_id")
        if trigger and trigger not in self.audited:
            self.audited[trigger] = time.monotonic()
            self.news.set()

    async def latencies(self, ids: list[str], timeout: float) -> list[float]:
        """Each one's POST to its first audit (inf: none within `timeout`)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while not all(i in self.audited for i in ids):
                    self.news.clear()
                    await self.news.wait()
        return [self.audited.get(i, float("inf")) - self.sent[i] for i in ids]


async def post(
    client: httpx.AsyncClient, url: str, alert: dict[str, Any], token: str = TOKEN
) -> httpx.Response:
    return await client.post(url, json=alert, headers={"Authorization": f"Bearer {token}"})


async def criticals(
    client: httpx.AsyncClient, url: str, batch: list[dict[str, Any]], spacing: float, clock: Clock
) -> list[str]:
    ids = []
    for alert in batch:
        at = time.monotonic()
        answer = await post(client, url, alert)
        answer.raise_for_status()  # a Critical alert is never refused
        [event_id] = answer.json()["published"]
        clock.sent[event_id] = at
        ids.append(event_id)
        await asyncio.sleep(spacing)
    return ids


async def one_case(case: str, args: argparse.Namespace) -> dict[str, Any]:
    async with staged("falco-flood-", "flood") as stage:
        uid, server, bus = stage.uid, stage.server, stage.bus
        clock = Clock()
        sub = await bus.nc.subscribe("remediation.>", cb=clock.on_audit)
        try:
            ingest_port, daemon_port = free_port(), free_port()
            overrides: dict[str, Any] = copy.deepcopy(CASES[case])
            falco = {
                **overrides,
                "ingest": {
                    "host": "127.0.0.1",
                    "port": ingest_port,
                    "token_file": str(stage.token),
                    **overrides.get("ingest", {}),
                },
            }
            proc = await stage.spawn_falco(falco, daemon_port, "info")
            assert server.proc is not None
            pids = {"falco": proc.pid, "nats": server.proc.pid}
            try:
                await ready(f"http://127.0.0.1:{daemon_port}", proc)
                url = f"http://127.0.0.1:{ingest_port}/"
                limits = httpx.Limits(max_connections=args.concurrency + 4)
                async with httpx.AsyncClient(limits=limits, timeout=60) as client:
                    alone_ids = await criticals(
                        client, url, alerts(args.criticals, "critical", uid, "a"), 0.2, clock
                    )
                    alone = await clock.latencies(alone_ids, 60)
                    memory = PeakRss(pids)
                    memory.start()
                    began = time.monotonic()
                    flooder = await asyncio.create_subprocess_exec(
                        sys.executable, __file__, "--flood-worker", url, "--notices",
                        str(args.notices), "--concurrency", str(args.concurrency), "--uid", uid,
                        *(["--nats", server.url] if args.via == "nats" else []),
                        stdout=asyncio.subprocess.PIPE,
                    )  # fmt: skip
                    await asyncio.sleep(args.delay)
                    batch = alerts(args.criticals, "critical", uid, "f")
                    flood_ids = await criticals(client, url, batch, args.spacing, clock)
                    out, _ = await flooder.communicate()
                    last = out.decode().strip().splitlines()[-1]  # after any log line
                    codes = {int(k): v for k, v in json.loads(last).items()}
                    posted_s = time.monotonic() - began
                    behind = await clock.latencies(flood_ids, 900)
                    await drained(bus)
                    drained_s = time.monotonic() - began
                    await memory.stop()
            finally:
                proc.send_signal(signal.SIGTERM)
                await proc.wait()
        finally:
            await sub.unsubscribe()
    return {
        "alone": alone,
        "behind": behind,
        "codes": codes,
        "posted_s": posted_s,
        "drained_s": drained_s,
        "before": memory.before,
        "peak": memory.peak,
        "after": memory.after,
    }


async def flood_worker(args: argparse.Namespace) -> None:
    """The flood, from a process of its own (Falco runs on other machines): `--notices`
    distinct Notices, `--concurrency` at a time, POSTed to the ingest or (`--nats`)
    published as Falcosidekick's NATS output does; prints the answers' codes as JSON."""
    codes: dict[int, int] = {}
    queue = list(reversed(alerts(args.notices, "notice", args.uid, "n")))
    if args.nats:
        bus = await Bus.connect(BusSettings(url=args.nats, provision=False), source="sidekick")

        async def publisher() -> None:
            while queue:
                alert = queue.pop()
                await bus.js.publish(sidekick_subject(alert), json.dumps(alert).encode())
                codes[0] = codes.get(0, 0) + 1  # 0: stored (no HTTP answer)

        await asyncio.gather(*(publisher() for _ in range(args.concurrency)))
        await bus.close()
        print(json.dumps(codes))
        return
    limits = httpx.Limits(max_connections=args.concurrency)
    async with httpx.AsyncClient(limits=limits, timeout=60) as client:

        async def poster() -> None:
            while queue:
                answer = await post(client, args.flood_worker, queue.pop(), args.token)
                codes[answer.status_code] = codes.get(answer.status_code, 0) + 1

        await asyncio.gather(*(poster() for _ in range(args.concurrency)))
    print(json.dumps(codes))


async def drained(bus: Bus) -> None:
    """Until every falco consumer has nothing pending or unacknowledged."""
    while True:
        names = [c.name async for c in _consumers(bus)]
        infos = [await bus.js.consumer_info("SECURITY", n) for n in names]
        if all((i.num_pending or 0) + (i.num_ack_pending or 0) == 0 for i in infos):
            return
        await asyncio.sleep(0.5)


async def _consumers(bus: Bus) -> Any:
    for info in await bus.js.consumers_info("SECURITY"):
        if info.name.startswith("falco"):
            yield info


async def main(args: argparse.Namespace) -> None:
    configure_logging("warning", "console")
    print(
        f"{args.notices} Notices at concurrency {args.concurrency}; {args.criticals} Critical "
        f"alerts alone, then one every {args.spacing}s from {args.delay}s into the flood; "
        f"{args.runs} run(s), medians; the flood from a process of its own, via {args.via}"
    )
    for case in [c for c in CASES if c in args.cases.split(",")]:
        results = [await one_case(case, args) for _ in range(args.runs)]

        def med(key: str, q: float, results: list[dict[str, Any]] = results) -> float:
            return statistics.median(pct(r[key], q) for r in results)

        def mem(when: str, who: str, results: list[dict[str, Any]] = results) -> float:
            return statistics.median(r[when][who] for r in results)

        codes = results[-1]["codes"]
        print(f"\n{case}:")
        for key in ("alone", "behind"):
            print(
                f"  critical {key:7s} p50 {med(key, 0.5):7.2f} s   p99 {med(key, 0.99):7.2f} s"
                f"   max {med(key, 1.0):7.2f} s"
            )
        print(
            f"  flood: answered {dict(sorted(codes.items()))} in "
            f"{statistics.median(r['posted_s'] for r in results):.0f} s, all handled after "
            f"{statistics.median(r['drained_s'] for r in results):.0f} s"
        )
        for who in ("falco", "nats"):
            print(
                f"  rss {who:5s} before {mem('before', who):6.0f} MiB   peak "
                f"{mem('peak', who):6.0f} MiB   after {mem('after', who):6.0f} MiB"
            )


if __name__ == "__main__":
    parser = options(
        __doc__, notices=20000, criticals=10, runs=1, concurrency=50, delay=5.0, spacing=1.0
    )
    parser.add_argument("--cases", default=",".join(CASES), help="which cases, comma-separated")
    parser.add_argument("--flood-worker", metavar="URL", help=argparse.SUPPRESS)
    parser.add_argument("--uid", default="flood", help=argparse.SUPPRESS)
    parser.add_argument("--token", default=TOKEN, help=argparse.SUPPRESS)
    parser.add_argument("--nats", help=argparse.SUPPRESS)
    parser.add_argument(
        "--via",
        choices=("http", "nats"),
        default="http",
        help="the flood through the ingest, or straight onto NATS as Falcosidekick's output",
    )
    parsed = parser.parse_args()
    asyncio.run(flood_worker(parsed) if parsed.flood_worker else main(parsed))
