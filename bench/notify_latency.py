"""A page's latency through the notifier: with no storm, and right behind a storm of info notices.

Runs an embedded nats-server and the notifier as its own process (`nodeward service
notifier`, as a Deployment runs it), with the shipped shape of routes (users to their
owners; on-call's route to the outbox and a JSON webhook) and the demo's digest wait
(`group_wait` 3s). The webhook is a receiver in this process, which timestamps each
notice's arrival. Each trial publishes one critical notice of a new incident and measures
from the start of its publish (the decision) to its arrival at the webhook:

- quiet: nothing else in flight;
- storm: published right after `--storm` info notices (2,000), which the notifier must take
  in (and hold for their digest) first: the page is behind them on the stream.

Trials alternate, and each storm trial waits until its digest has gone out and every notice
is acked. Prints p50/p99 (p99 of fewer than 100 trials is their maximum) of both, side by
side, with the storm/quiet ratio; target: storm p99 under 2 s.

    python bench/notify_latency.py [--trials 20] [--storm 2000]
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from aiohttp import web
from benchlib import options

from nodeward.bus import Bus
from nodeward.bus.server import EmbeddedNats
from nodeward.config import BusSettings
from nodeward.logs import configure_logging
from schemas import Event, make_event
from schemas.common import ObjectRef
from schemas.notify import Notification, Severity

TOPIC = "bench"
CONSUMER = "notifier-bench"  # and notifier-bench-critical, its pages


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def page(trial: int) -> Event[Notification]:
    node = f"gpu-bench-{trial:03d}"
    data = Notification(
        severity=Severity.CRITICAL,
        topic=TOPIC,
        title=f"{node}: quarantine applied",
        body="GPU 0 failed: XID 79 (fallen off the bus)",
        targets=[ObjectRef(kind="Node", name=node)],
        dedup_key=f"quarantine/node/{node}",
        incident=f"{TOPIC}/node/{node}",
    )
    return make_event(data, source="bench/cordon")


def storm(trial: int, size: int) -> list[Event[Notification]]:
    return [
        make_event(
            Notification(
                severity=Severity.INFO,
                topic=TOPIC,
                title=f"ml-{i % 50:02d}/explore-{i}: idle session left alone (trial {trial})",
                dedup_key=f"skip/pod/ml-{i % 50:02d}/explore-{i}",
            ),
            source="bench/culler",
        )
        for i in range(size)
    ]


class Arrivals:
    """A webhook receiver: when each notice id arrived (monotonic)."""

    def __init__(self) -> None:
        self.at: dict[str, float] = {}
        self.new = asyncio.Event()

    async def keep(self, request: web.Request) -> web.Response:
        now = time.monotonic()
        body = await request.json()
        for notice in body["notifications"]:
            self.at.setdefault(notice["id"], now)
        self.new.set()
        return web.json_response({"ok": True})

    async def wait(self, event_id: str, timeout: float = 60.0) -> float:
        deadline = time.monotonic() + timeout
        while event_id not in self.at:
            self.new.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"notice {event_id} never arrived")
            await asyncio.wait_for(self.new.wait(), left)
        return self.at[event_id]


async def settled(bus: Bus) -> bool:
    for consumer in (CONSUMER, CONSUMER + "-critical"):
        info = await bus.js.consumer_info("NOTIFY", consumer)
        if info.num_pending or info.num_ack_pending:
            return False
    return True


async def until(condition: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def notifier_config(tmp: Path, hook: str, nats_url: str) -> Path:
    routes = tmp / "routes.yaml"
    routes.write_text(
        json.dumps(
            {
                "routes": [
                    {
                        "name": "users",
                        "match": {"audience": ["user"]},
                        "to_owner": True,
                        "channels": ["outbox"],
                    },
                    {"name": "oncall", "channels": ["outbox", "hook"]},
                ]
            }
        )
    )
    config = tmp / "notifier.yaml"
    config.write_text(
        json.dumps(
            {
                "bus": {"url": nats_url},
                "log": {"level": "warning"},
                "services": {
                    "notifier": {
                        "consumer": CONSUMER,
                        "subjects": [f"notify.*.{TOPIC}"],
                        "owner_lookup": False,
                        "routes_file": str(routes),
                        "channels": {
                            "outbox": {"type": "outbox", "dir": str(tmp / "outbox")},
                            "hook": {"type": "webhook", "url": hook},
                        },
                        # The demo's digest wait; no interval, so each trial's digest goes
                        # out and the next trial starts from nothing held.
                        "grouping": {"group_wait": "3s", "group_interval": "0s"},
                        # Rate limits are not what is measured: every page may go at once.
                        "rate_limit": {"per_hour": 1000000, "burst": 100000},
                    }
                },
            }
        )
    )
    return config


async def main(trials: int, size: int) -> None:
    configure_logging("warning", "console")
    with tempfile.TemporaryDirectory(prefix="notify-latency-") as name:
        tmp = Path(name)
        server = EmbeddedNats(tmp / "nats")
        await server.start()
        arrivals = Arrivals()
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/hook", arrivals.keep)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        bus = await Bus.connect(BusSettings(url=server.url), source="bench")
        config = notifier_config(tmp, f"http://127.0.0.1:{port}/hook", server.url)
        log = (tmp / "notifier.log").open("wb")
        proc = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "launch", "service", "notifier", "--config", str(config)),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=os.environ | {"NODEWARD_NATS_URL": server.url},
            cwd=tmp,
        )
        quiet: list[float] = []
        stormy: list[float] = []
        intake: list[float] = []
        try:

            async def bound() -> bool:
                try:
                    await bus.js.consumer_info("NOTIFY", CONSUMER + "-critical")
                except Exception:  # noqa: BLE001 - not there yet
                    return False
                return True

            await until(bound, 60, "the notifier's consumer")
            warm = page(999)
            await bus.publish(warm)
            await arrivals.wait(warm.id)
            for trial in range(trials):
                for stormed in (False, True):
                    if stormed:
                        began = time.monotonic()
                        await bus.publish_many(storm(trial, size))
                        intake.append(time.monotonic() - began)
                    notice = page(2 * trial + stormed)
                    published = time.monotonic()
                    await bus.publish(notice)
                    took = await arrivals.wait(notice.id) - published
                    (stormy if stormed else quiet).append(took)
                    await until(lambda: settled(bus), 120, "the digest sent and acked")
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 20)
            except TimeoutError:
                proc.kill()
            log.close()
            await bus.close()
            await runner.cleanup()
            await server.stop()
    ratio50 = statistics.median(stormy) / statistics.median(quiet)
    ratio99 = pct(stormy, 0.99) / pct(quiet, 0.99)
    print(f"trials: {trials} each; storm: {size} info notices published just before the page")
    print(f"publishing the storm took (median): {statistics.median(intake) * 1000:.0f} ms")
    print(f"{'':28}{'quiet (baseline)':>18}{'during the storm':>18}{'ratio':>8}")
    for label, q, s, r in (
        ("p50 decision -> channel", statistics.median(quiet), statistics.median(stormy), ratio50),
        ("p99 decision -> channel", pct(quiet, 0.99), pct(stormy, 0.99), ratio99),
    ):
        print(f"{label:<28}{q * 1000:>15.0f} ms{s * 1000:>15.0f} ms{r:>8.2f}")
    verdict = "met" if pct(stormy, 0.99) < 2.0 else "MISSED"
    print(f"target p99 under 2 s during the storm: {verdict}")


if __name__ == "__main__":
    parser = options(__doc__, trials=20, storm=2000)
    args = parser.parse_args()
    asyncio.run(main(args.trials, args.storm))
