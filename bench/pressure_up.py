"""Issue 30's five reproductions, played against `nodeward up` as a user would run it.

Each starts its own `nodeward up --scenario none --quiet` in a temp dir (the demo profile,
the sim cluster, simulated agents), waits until every daemon is ready, plays one
reproduction through the platform's own doors (the Falco ingest over HTTP, the simulated
GPUs' fault injection, a raw publish where an agent's clock is the fault, a SIGSTOPped
nats-server), and prints what the platform did, read from the bus (`remediation.>`,
`notify.>`, `dlq.>`), the on-call outbox and the daemons' `/readyz`:

1. flood: `--notices` distinct Notice alerts POSTed `--concurrency` at a time from a
   process of its own, and 15 s in one Critical alert: how long to its `isolate` decision,
   what the ingest answered, the memory of `up` and nats-server, how many audit records
   and notices the flood left;
2. future: a `gpu.health.v1` dated an hour ahead, with a fresh boot id and then with the
   agent's own boot id, each followed by a real XID 79 on that GPU;
3. flap: `--flaps` failed/healthy turns of one GPU within about 10 s;
4. storm: XID 79 on six nodes at once: the pages on-call receives, and when;
5. hung bus: nats-server stopped (SIGSTOP) for 25 s: the daemons' `/readyz`.

    python bench/pressure_up.py [--only 1,2,3,4,5] [--notices 20000] [--concurrency 50]
                                [--flaps 5000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from benchlib import PeakRss, launched_up
from falco import alerts

from nodeward.bus import Bus
from nodeward.config import BusSettings
from nodeward.logs import configure_logging
from schemas import make_event
from schemas.cloudevents import decode
from schemas.gpu import GpuHealth, HealthReason, HealthState, RecommendedAction

REPO = Path(__file__).resolve().parent.parent


@dataclass
class Seen:
    """Every decision, notice and dead letter published while a reproduction ran."""

    records: list[tuple[float, str, dict[str, Any]]] = field(default_factory=list)

    async def on_msg(self, msg: Any) -> None:
        try:
            data = json.loads(msg.data)
        except ValueError:
            data = {}
        self.records.append((time.monotonic(), msg.subject, data))

    def on(self, prefix: str, since: float = 0.0) -> list[tuple[float, str, dict[str, Any]]]:
        return [r for r in self.records if r[1].startswith(prefix) and r[0] >= since]


@dataclass
class Platform:
    proc: asyncio.subprocess.Process
    state: Path
    endpoints: dict[str, Any]
    bus: Bus
    seen: Seen

    @property
    def outbox(self) -> Path:
        return Path(self.endpoints["outbox"])

    def nats_pid(self) -> int:
        """The nats-server `up` started (its child)."""
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError):
                pid, rest = stat.read_text().split(" (", 1)
                comm, fields = rest.rsplit(") ", 1)
                if comm.startswith("nats-server") and int(fields.split()[1]) == self.proc.pid:
                    return int(pid)
        raise RuntimeError("no nats-server under nodeward up")

    def pages(self) -> list[tuple[float, str, str]]:
        """The on-call outbox: (mtime, severity, subject) of each message, oldest first."""
        out = []
        for path in self.outbox.glob("*.txt"):
            head = dict(
                line.split(": ", 1)
                for line in path.read_text().split("\n\n", 1)[0].splitlines()
                if ": " in line
            )
            if head.get("To") == "on-call":
                out.append((path.stat().st_mtime, head.get("Severity", ""), head["Subject"]))
        return sorted(out)

    async def inject(self, node: str, **request: Any) -> dict[str, Any]:
        reply = await self.bus.nc.request(
            f"sim.inject.{node}", json.dumps(request).encode(), timeout=10
        )
        return dict(json.loads(reply.data))

    async def unready(self, client: httpx.AsyncClient) -> list[str]:
        async def one(name: str, url: str) -> str | None:
            try:
                answer = await client.get(f"{url}/readyz", timeout=2)
                return None if answer.status_code == 200 else name
            except httpx.HTTPError:
                return name

        found = await asyncio.gather(*(one(n, u) for n, u in self.endpoints["metrics"].items()))
        return sorted(n for n in found if n)


@contextlib.asynccontextmanager
async def platform() -> AsyncIterator[Platform]:
    async with launched_up(REPO, "--scenario", "none", "--quiet") as launched:
        bus = await Bus.connect(
            BusSettings(url=launched.endpoints["nats_url"]), source="bench/pressure"
        )
        seen = Seen()
        up = Platform(launched.proc, launched.state, launched.endpoints, bus, seen)
        subs = [
            await bus.nc.subscribe(s, cb=seen.on_msg)
            for s in ("remediation.>", "notify.>", "dlq.>")
        ]
        try:
            yield up
        finally:
            for sub in subs:
                await sub.unsubscribe()
            await bus.close()


async def until(what: str, check: Any, timeout: float) -> float | None:
    """Seconds until `check()` holds (polled every 0.1 s), or None after `timeout`."""
    began = time.monotonic()
    while time.monotonic() - began < timeout:
        if check():
            return time.monotonic() - began
        await asyncio.sleep(0.1)
    print(f"  (no {what} within {timeout:.0f} s)")
    return None


def decisions(seen: Seen, action: str, node: str, since: float = 0.0) -> Counter[str]:
    """Outcome (and guard) of each `action` decision about `node` since `since`."""
    return Counter(
        f"{d.get('outcome')}" + (f"/{d['guard']}" if d.get("guard") else "")
        for _, _, d in seen.on(f"remediation.{action}.", since)
        if (d.get("target") or {}).get("name") == node
    )


# 1 ---------------------------------------------------------------------------------------
async def flood(up: Platform, args: argparse.Namespace) -> None:
    url = up.endpoints["falco_ingest_url"]
    token = Path(up.endpoints["falco_token_file"]).read_text().strip()  # noqa: ASYNC240
    pids = {"up": up.proc.pid, "nats-server": up.nats_pid()}
    memory = PeakRss(pids)
    memory.start()
    began = time.monotonic()
    flooder = await asyncio.create_subprocess_exec(
        sys.executable, str(REPO / "bench" / "falco_flood.py"), "--flood-worker", url,
        "--notices", str(args.notices), "--concurrency", str(args.concurrency), "--uid", "",
        "--token", token, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    await asyncio.sleep(15)
    [critical] = alerts(1, "critical", "", "c")
    async with httpx.AsyncClient() as client:
        sent = time.monotonic()
        answer = await client.post(url, json=critical, headers={"Authorization": f"Bearer {token}"})
        stored = time.monotonic() - sent
    [event_id] = answer.json()["published"]

    def isolated() -> dict[str, Any] | None:
        for _, _, d in up.seen.on("remediation.isolate."):
            if d.get("trigger_event_id") == event_id:
                return d
        return None

    took = await until("isolate decision", isolated, 300)
    decided = isolated()
    out, _ = await flooder.communicate()
    posted = time.monotonic() - began
    codes = json.loads(out)
    # Until every stored Notice is handled: the low lane has nothing pending.
    while True:
        info = await up.bus.js.consumer_info("SECURITY", "falco")
        if not (info.num_pending or 0) + (info.num_ack_pending or 0):
            break
        await asyncio.sleep(0.5)
    handled = time.monotonic() - began
    await memory.stop()
    falco_audits = [
        d for _, _, d in up.seen.on("remediation.") if d.get("actor") == "service/falco"
    ]
    notices = up.seen.on("notify.")
    print(f"  Critical alert: stored in {stored:.2f} s (HTTP {answer.status_code}); isolate "
          f"{(decided or {}).get('outcome', 'never decided')} {took if took is None else round(took + stored, 2)} s after its POST")  # fmt: skip
    print(
        f"  flood: {args.notices} Notices answered {codes} in {posted:.0f} s; all stored handled after {handled:.0f} s"
    )
    print(f"  falco's audit records during the flood: {len(falco_audits)} "
          f"({dict(Counter(str(d.get('action')) + '/' + str(d.get('outcome')) for d in falco_audits))}); notices: {len(notices)}")  # fmt: skip
    for k in pids:
        print(
            f"  rss {k:11s} before {memory.before[k]:5.0f} MiB  peak {memory.peak[k]:5.0f} MiB  after {memory.after[k]:5.0f} MiB"
        )


# 2 ---------------------------------------------------------------------------------------
def health(node: str, state: HealthState, *, boot: str, seq: int, ahead: timedelta) -> Any:
    failed = state is HealthState.FAILED
    reasons = [HealthReason(code="xid", xid=79, message="GPU has fallen off the bus",
                            action=RecommendedAction.REBOOT_NODE)] if failed else []  # fmt: skip
    data = GpuHealth(
        node=node, gpu_index=0, gpu_uuid=f"GPU-{node}-0", state=state, reasons=reasons,
        recommended_action=RecommendedAction.REBOOT_NODE if failed else RecommendedAction.NONE,
        observed_at=datetime.now(UTC) + ahead, agent_boot_id=boot, sequence=seq,
    )  # fmt: skip
    return make_event(data, source=f"agent/gpu/{node}", time=datetime.now(UTC) + ahead)


async def last_health(up: Platform, node: str) -> GpuHealth:
    msg = await up.bus.js.get_last_msg("GPU", f"gpu.health.{node}.0")
    return decode(msg.subject, msg.headers, msg.data).data  # type: ignore[no-any-return]


async def future(up: Platform, _args: argparse.Namespace) -> None:
    for node, fresh in (("gpu-h100-02", True), ("gpu-a100-01", False)):
        own = await last_health(up, node)
        boot = "boot-from-the-future" if fresh else (own.agent_boot_id or "")
        state = HealthState.HEALTHY if fresh else HealthState.FAILED
        since = time.monotonic()
        event = health(node, state, boot=boot, seq=own.sequence + 1000, ahead=timedelta(hours=1))
        await up.bus.publish(event)

        def refused(event_id: str = event.id, since: float = since) -> bool:
            return any(
                d.get("reason") == "future" and event_id in json.dumps(d.get("original_headers"))
                for _, _, d in up.seen.on("dlq.", since)
            )

        await until("dead letter", refused, 20)
        dlq = Counter(f"{s} reason={d.get('reason')}" for _, s, d in up.seen.on("dlq.", since))
        audits = decisions(up.seen, "future_event", node, since)
        clock = [d.get("title") for _, _, d in up.seen.on("notify.warning.clock", since)]
        quarantined_early = decisions(up.seen, "quarantine", node, since)
        print(f"  {node}: {state.value} dated +1h with {'a fresh' if fresh else 'its own'} boot id -> "
              f"dead letters {dict(dlq)}; audits {dict(audits)}; clock notices {clock}; "
              f"quarantine decisions from it {dict(quarantined_early)}")  # fmt: skip
        await up.inject(node, gpu=0, xid=79)

        def applied(node: str = node, since: float = since) -> bool:
            return decisions(up.seen, "quarantine", node, since)["applied"] > 0

        took = await until("quarantine", applied, 30)
        pages = [p[2] for p in up.pages() if "clock" in p[2]]
        print(f"    on-call's pages about clocks so far: {pages}")
        print(f"    then a real XID 79 on GPU 0: quarantine {dict(decisions(up.seen, 'quarantine', node, since))}"
              f"{'' if took is None else f' after {took:.2f} s'}")  # fmt: skip


# 3 ---------------------------------------------------------------------------------------
async def flap(up: Platform, args: argparse.Namespace) -> None:
    node = "gpu-h100-03"
    since = time.monotonic()
    gate = asyncio.Semaphore(20)

    async def turn(i: int) -> None:
        async with gate:
            await up.inject(node, gpu=0, **({"xid": 79} if i % 2 == 0 else {"recover": True}))

    await asyncio.gather(*(turn(i) for i in range(args.flaps)))
    flapped = time.monotonic() - since
    await up.inject(node, gpu=0, recover=True)
    print(
        f"  {args.flaps} failed/healthy turns of {node} GPU 0 injected in {flapped:.1f} s; watching 90 s"
    )
    await asyncio.sleep(90)  # a window to see what recovery and cordon do of their own
    about = [
        d
        for _, _, d in up.seen.on("remediation.", since)
        if (d.get("target") or {}).get("name") == node
    ]
    tally = Counter(
        f"{d.get('action')}/{d.get('outcome')}" + (f"/{d['guard']}" if d.get("guard") else "")
        for d in about
    )
    notices = [d for _, _, d in up.seen.on("notify.", since) if node in json.dumps(d)]
    print(f"  decisions about {node}: {len(about)} records {dict(tally)}")
    print(
        f"  notices naming it: {len(notices)}; on-call pages: {len([p for p in up.pages() if node in p[2]])}"
    )


# 4 ---------------------------------------------------------------------------------------
async def storm(up: Platform, _args: argparse.Namespace) -> None:
    nodes = [
        "gpu-h100-01",
        "gpu-h100-02",
        "gpu-h100-03",
        "gpu-h100-04",
        "gpu-a100-01",
        "gpu-a100-02",
    ]
    began = time.time()
    since = time.monotonic()
    await asyncio.gather(*(up.inject(n, gpu=0, xid=79) for n in nodes))
    print(f"  XID 79 on {len(nodes)} nodes within {time.time() - began:.3f} s; watching 120 s")
    await asyncio.sleep(120)
    quarantines = Counter()
    for n in nodes:
        quarantines += decisions(up.seen, "quarantine", n, since)
    releases = {
        (d.get("target") or {}).get("name"): t
        for t, _, d in up.seen.on("remediation.release.", since)
        if d.get("outcome") == "applied"
    }
    print(f"  quarantine decisions: {dict(quarantines)}; released: {sorted(releases)}")
    pages = [p for p in up.pages() if p[0] >= began]
    for at, severity, subject in pages:
        print(f"  page +{at - began:5.1f} s [{severity}] {subject}")
    critical = [p for p in pages if p[1] == "critical"]
    print(
        f"  critical pages to on-call: {len(critical)} (first +{critical[0][0] - began:.1f} s)"
        if critical
        else "  no critical page"
    )


# 5 ---------------------------------------------------------------------------------------
async def hung_bus(up: Platform, _args: argparse.Namespace) -> None:
    pid = up.nats_pid()
    daemons = len(up.endpoints["metrics"])
    async with httpx.AsyncClient() as client:
        assert not await up.unready(client)
        os.kill(pid, signal.SIGSTOP)
        stopped = time.monotonic()
        first: dict[str, float] = {}
        worst = 0
        try:
            while time.monotonic() - stopped < 25:
                for name in await up.unready(client):
                    first.setdefault(name, time.monotonic() - stopped)
                worst = max(worst, len([n for n in first]))
                await asyncio.sleep(0.5)
        finally:
            os.kill(pid, signal.SIGCONT)
        resumed = time.monotonic()
        while await up.unready(client) and time.monotonic() - resumed < 60:  # noqa: ASYNC110
            await asyncio.sleep(0.5)
        back = time.monotonic() - resumed
        left = await up.unready(client)
    turned = sorted(first.values())
    print(f"  nats-server stopped 25 s: {len(first)} of {daemons} /readyz turned unready, "
          f"the first after {turned[0]:.1f} s, the median after {statistics.median(turned):.1f} s" if turned else
          f"  nats-server stopped 25 s: all {daemons} /readyz stayed 200")  # fmt: skip
    stayed = sorted(set(up.endpoints["metrics"]) - set(first))
    if stayed:
        print(f"  stayed ready: {', '.join(stayed)}")
    print(
        f"  resumed: every /readyz 200 again after {back:.1f} s"
        if not left
        else f"  still unready 60 s after: {left}"
    )


CASES = {
    "1": ("flood", flood),
    "2": ("future", future),
    "3": ("flap", flap),
    "4": ("storm", storm),
    "5": ("hung bus", hung_bus),
}


async def main(args: argparse.Namespace) -> None:
    configure_logging("warning", "console")
    for key in args.only.split(","):
        title, play = CASES[key]
        print(f"\n{key}. {title}")
        async with platform() as up:
            await play(up, args)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--only", default="1,2,3,4,5")
    parser.add_argument("--notices", type=int, default=20000)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--flaps", type=int, default=5000)
    asyncio.run(main(parser.parse_args()))
