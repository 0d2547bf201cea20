"""The daemon's HTTP endpoints, over real sockets on free ports, with httpx."""

from __future__ import annotations

import asyncio
import contextlib
import time
from datetime import timedelta
from typing import Any

import httpx
from prometheus_client import CONTENT_TYPE_LATEST
from structlog.testing import capture_logs

from nodeward.config import DaemonSettings
from nodeward.daemon import Daemon


def settings() -> DaemonSettings:
    return DaemonSettings(host="127.0.0.1", port=0, shutdown_timeout=timedelta(seconds=5))


async def test_readyz_flips_from_503_to_200() -> None:
    bus = asyncio.Event()
    consumer_bound = False

    async def bus_connected() -> bool:
        return bus.is_set()

    async with Daemon("cordon", settings()) as d, httpx.AsyncClient(base_url=d.url) as http:
        d.add_readiness_check("bus connected", bus_connected)
        d.add_readiness_check("consumer bound", lambda: consumer_bound)
        r = await http.get("/readyz")
        assert r.status_code == 503
        body = r.json()
        assert body["failing"] == ["bus connected", "consumer bound"]
        assert body["checks"] == {"bus connected": False, "consumer bound": False}
        assert body["daemon"] == "cordon"

        bus.set()
        r = await http.get("/readyz")
        assert r.status_code == 503 and r.json()["failing"] == ["consumer bound"]

        consumer_bound = True
        r = await http.get("/readyz")
        assert r.status_code == 200
        assert r.json()["status"] == "ready" and r.json()["failing"] == []

        r = await http.get("/healthz")
        assert r.status_code == 200 and r.json() == {"status": "ok", "daemon": "cordon"}


async def test_metrics_exposes_the_daemons_own_registry() -> None:
    async with Daemon("gpu", settings()) as d, httpx.AsyncClient(base_url=d.url) as http:
        d.metrics.published.labels(type="gpu.health.v1").inc(3)
        r = await http.get("/metrics")
        assert r.status_code == 200
        assert r.headers["content-type"] == CONTENT_TYPE_LATEST
        text = r.text
        assert 'nodeward_events_published_total{type="gpu.health.v1"} 3.0' in text
        for name in (
            "nodeward_events_handled",
            "nodeward_bus_connected",
            "nodeward_event_loop_lag_seconds",
        ):
            assert name in text
        om = await http.get(
            "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}
        )
        assert om.headers["content-type"].startswith("application/openmetrics-text")
        assert om.text.rstrip().endswith("# EOF")


async def test_two_daemons_in_one_loop_on_different_ports() -> None:
    async with (
        Daemon("cordon", settings()) as a,
        Daemon("culler", settings()) as b,
        httpx.AsyncClient() as http,
    ):
        assert a.port != b.port
        a.metrics.published.labels(type="remediation.v1").inc()
        a.add_readiness_check("never", lambda: False)
        ra, rb = await asyncio.gather(http.get(f"{a.url}/metrics"), http.get(f"{b.url}/metrics"))
        assert 'type="remediation.v1"' in ra.text
        assert 'type="remediation.v1"' not in rb.text  # separate registries
        ya, yb = await asyncio.gather(http.get(f"{a.url}/readyz"), http.get(f"{b.url}/readyz"))
        assert (ya.status_code, yb.status_code) == (503, 200)
        ha, hb = await asyncio.gather(http.get(f"{a.url}/healthz"), http.get(f"{b.url}/healthz"))
        assert ha.json()["daemon"] == "cordon" and hb.json()["daemon"] == "culler"
    # Both closed their ports.
    async with httpx.AsyncClient() as http:
        for d in (a, b):
            try:
                await http.get(f"{d.url}/healthz")
            except httpx.ConnectError:
                continue
            raise AssertionError(f"{d.name} still serving after stop")


async def test_healthz_and_readyz_503_while_stopping() -> None:
    d = Daemon("t", settings())
    hook_entered = asyncio.Event()
    release = asyncio.Event()
    seen: dict[str, int] = {}

    async def hook() -> None:
        hook_entered.set()
        await release.wait()

    d.add_shutdown_hook(hook)
    await d.start()
    async with httpx.AsyncClient(base_url=d.url) as http:
        stopping = asyncio.create_task(d.stop())
        await asyncio.wait_for(hook_entered.wait(), 5)
        for path in ("/healthz", "/readyz"):
            r = await http.get(path)
            seen[path] = r.status_code
            assert r.json()["status"] == "stopping"
        release.set()
        await asyncio.wait_for(stopping, 5)
    assert seen == {"/healthz": 503, "/readyz": 503}


async def test_healthz_503_after_the_loop_was_blocked() -> None:
    d = Daemon("t", settings(), heartbeat_interval=0.25, max_loop_lag=0.25)
    async with d, httpx.AsyncClient(base_url=d.url) as http:
        assert (await http.get("/healthz")).status_code == 200
        time.sleep(0.6)
        r = await http.get("/healthz")
        assert r.status_code == 503
        assert r.json()["status"] == "unhealthy" and "blocked" in r.json()["reason"]


async def test_a_service_is_not_ready_until_its_consumer_is_bound(
    bus_settings: Any, node: str
) -> None:
    """Before the consume task has run, `bus.consumers` is empty: that is not "all bound"."""
    from nodeward.bus import ConsumerSpec
    from nodeward.config import Settings
    from nodeward.platform import bus_daemon

    config = Settings(bus=bus_settings, daemon=settings())
    daemon, bus = await bus_daemon("svc", config, source="test/svc", consumers=1)
    await daemon.start()
    try:
        report = await daemon.readiness()
        assert not report.ready
        spec = ConsumerSpec(name=f"svc-{node}", stream="GPU", subjects=(f"gpu.health.{node}.>",))

        async def handler(_event: Any, _delivery: Any) -> None:
            return None

        await bus.consume(spec, handler)
        assert (await daemon.readiness()).ready
    finally:
        await daemon.stop()


async def test_failure_counters_have_their_series_at_0_before_any_failure(
    bus_settings: Any, node: str
) -> None:
    """Scraped over HTTP before anything failed: each reason a bound consumer may
    dead-letter for, and each event type the daemon may publish (from the subjects it is
    granted), at 0, so the first failure is an increase Prometheus sees."""
    from prometheus_client.parser import text_string_to_metric_families

    from nodeward.bus import ConsumerSpec
    from nodeward.config import Settings
    from nodeward.platform import bus_daemon

    config = Settings(bus=bus_settings, daemon=settings())
    durable = f"svc-{node}"
    daemon, bus = await bus_daemon(
        "svc",
        config,
        source="test/svc",
        consumers=1,
        publishes=("gpu.health.*.>", "notify.*.power-cap", f"dlq.GPU.{durable}", "$KV.x.>"),
    )
    await daemon.start()
    try:
        spec = ConsumerSpec(name=durable, stream="GPU", subjects=(f"gpu.health.{node}.>",))

        async def handler(_event: Any, _delivery: Any) -> None:
            return None

        await bus.consume(spec, handler)
        async with httpx.AsyncClient(base_url=daemon.url) as http:
            text = (await http.get("/metrics")).text
        found = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }
        reasons = ("invalid", "permanent", "exhausted", "identity_mismatch", "future")
        for reason in (*reasons, "terminated"):
            key = (("consumer", durable), ("reason", reason))
            assert found[("nodeward_events_dead_lettered_total", key)] == 0.0
        failures = {
            dict(labels)["type"]: value
            for (name, labels), value in found.items()
            if name == "nodeward_publish_failures_total"
        }
        assert failures == {"dlq.v1": 0.0, "gpu.health.v1": 0.0, "notify.v1": 0.0}
    finally:
        await daemon.stop()


async def test_readyz_fails_while_the_nats_server_is_hung_and_recovers_after(
    own_nats: Any, node: str
) -> None:
    """A SIGSTOPped server keeps the TCP session open (`is_connected` stays true); the
    daemon's pings and its consumer's pull requests go unanswered, and `/readyz` says so
    within the deadline, then is 200 again once the server runs on."""
    import os
    import signal

    from nodeward.bus import ConsumerSpec
    from nodeward.config import BusSettings, Settings
    from nodeward.platform import bus_daemon
    from tests.conftest import wait_for

    bus_settings = BusSettings(
        url=own_nats.url,
        ready_deadline=timedelta(seconds=2),
        ping_interval=timedelta(milliseconds=250),
    )
    config = Settings(bus=bus_settings, daemon=settings())
    logs = contextlib.ExitStack()
    told = logs.enter_context(capture_logs())  # before the bus binds its logger
    daemon, bus = await bus_daemon("svc", config, source="test/svc", consumers=1)
    await daemon.start()
    pid = own_nats.proc.pid
    stopped = False
    try:
        spec = ConsumerSpec(name=f"svc-{node}", stream="GPU", subjects=(f"gpu.health.{node}.>",))

        async def handler(_event: Any, _delivery: Any) -> None:
            return None

        await bus.consume(spec, handler)
        async with httpx.AsyncClient(base_url=daemon.url) as http:

            async def status() -> tuple[int, dict[str, Any]]:
                r = await http.get("/readyz")
                return r.status_code, r.json()

            await wait_for(
                lambda: bus.responsive.last_problem is None, timeout=10, what="answering"
            )
            assert (await status())[0] == 200
            os.kill(pid, signal.SIGSTOP)
            stopped = True
            started = time.monotonic()
            seen: dict[str, Any] = {}

            async def not_ready() -> bool:
                code, body = await status()
                seen.update(body)
                return code == 503

            await wait_for(not_ready, timeout=20, what="/readyz to fail")
            took = time.monotonic() - started
            assert bus.connected  # the connection alone never noticed
            assert seen["failing"] == ["bus"], seen
            error = seen["errors"]["bus"]
            assert error.startswith("BusNotAnswering: "), error
            assert "has not answered a ping" in error or "heard nothing" in error, error
            assert took < 10, took
            os.kill(pid, signal.SIGCONT)
            stopped = False

            async def ready() -> bool:
                return (await status())[0] == 200

            await wait_for(ready, timeout=20, what="/readyz to pass again")

            # One line when it stopped answering, one when it answered again.
            def changes() -> list[dict[str, Any]]:
                events = ("bus.not_answering", "bus.answering")
                return [e for e in told if e["event"] in events]

            await wait_for(lambda: len(changes()) >= 2, timeout=10, what=f"two lines in {told}")
            assert [e["event"] for e in changes()] == ["bus.not_answering", "bus.answering"]
            assert changes()[0]["log_level"] == "warning" and changes()[0]["deadline_s"] == 2.0

            # Hung again, then killed and restarted: the ping sent to the hung server dies
            # with its connection, and a new one is sent on the next.
            os.kill(pid, signal.SIGSTOP)
            await wait_for(not_ready, timeout=20, what="/readyz to fail again")
            await own_nats.kill()
            await own_nats.start()
            await wait_for(ready, timeout=30, what="/readyz to pass after the restart")
            assert bus.nc.stats["reconnects"] >= 1
    finally:
        logs.close()
        if stopped:
            os.kill(pid, signal.SIGCONT)
        await daemon.stop()
