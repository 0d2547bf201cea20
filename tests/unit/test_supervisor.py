"""The supervisor `nodeward up` runs its daemons under: a unit whose daemon dies is rebuilt
and started again on the same port; past its limit it is given up and the rest run on; a
core daemon dying stops everything."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta

import pytest
from structlog.testing import capture_logs

from nodeward.config import DaemonSettings
from nodeward.daemon import Daemon, DaemonError
from nodeward.supervisor import Restart, RestartPolicy, Supervisor, Unit

FAST = RestartPolicy(backoff=0.01, backoff_max=0.05, limit=2, window=60.0)


def settings() -> DaemonSettings:
    return DaemonSettings(host="127.0.0.1", port=0, shutdown_timeout=timedelta(seconds=5))


async def wait_until(cond: Callable[[], bool], timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not cond():
            await asyncio.sleep(0.01)


def failing_unit(name: str, failures: int) -> tuple[Unit, list[Daemon]]:
    """A unit whose first `failures` builds get a daemon whose task raises at once."""
    built: list[Daemon] = []

    async def build() -> list[Daemon]:
        daemon = Daemon(name, settings())
        if len(built) < failures:

            async def boom() -> None:
                raise RuntimeError("boom")

            daemon.add_task(boom, name="consume")
        built.append(daemon)
        return [daemon]

    return Unit(name, build), built


async def test_a_dead_daemon_is_rebuilt_on_its_port_and_reported() -> None:
    core = Daemon("platform", settings())
    unit, built = failing_unit("cordon", failures=1)
    unit.daemons = await unit.build()
    reports: list[Restart] = []
    supervisor = Supervisor([core], [unit], FAST, on_restart=reports.append)
    with capture_logs():
        running = asyncio.create_task(supervisor.run(handle_signals=False))
        await wait_until(lambda: bool(reports))
    first, second = built
    assert not first.started and second.started and second.port == first.port
    assert supervisor.daemons == [core, second]
    (report,) = reports
    assert report.cause == "task consume failed: RuntimeError: boom"
    assert report.result == "restarted (1st time in 1 min)"
    assert report.urls == {"cordon": second.url}
    core.request_stop("test over")
    await asyncio.wait_for(running, 10)
    assert not second.started


async def test_past_its_limit_a_unit_is_given_up_and_the_rest_run_on() -> None:
    core = Daemon("platform", settings())
    doomed, built = failing_unit("cordon", failures=10)
    doomed.daemons = await doomed.build()
    steady, _ = failing_unit("culler", failures=0)
    steady.daemons = await steady.build()
    reports: list[Restart] = []
    supervisor = Supervisor([core], [doomed, steady], FAST, on_restart=reports.append)
    with capture_logs() as logs:
        running = asyncio.create_task(supervisor.run(handle_signals=False))
        await wait_until(lambda: "cordon" in supervisor.given_up)
    assert len(built) == 3  # the first and two restarts
    assert [r.gave_up for r in reports] == [False, False, True]
    assert reports[-1].result == "gave up after 2 restarts in 1 min; the rest keep running"
    assert [e["cause"] for e in logs if e["event"] == "up.gave_up"] == [reports[-1].cause]
    assert not running.done() and core.started and steady.daemons[0].started
    assert supervisor.daemons == [core, steady.daemons[0]]
    core.request_stop("test over")
    await asyncio.wait_for(running, 10)


async def test_a_core_daemon_dying_stops_everything() -> None:
    core = Daemon("platform", settings())

    async def boom() -> None:
        raise RuntimeError("kaput")

    core.add_task(boom, name="story")
    unit, _ = failing_unit("cordon", failures=0)
    unit.daemons = await unit.build()
    supervisor = Supervisor([core], [unit], FAST)
    with capture_logs(), pytest.raises(DaemonError, match="platform: RuntimeError: kaput"):
        await asyncio.wait_for(supervisor.run(handle_signals=False), 10)
    assert not unit.daemons[0].started


async def test_a_stop_during_the_back_off_ends_at_once() -> None:
    core = Daemon("platform", settings())
    unit, built = failing_unit("cordon", failures=1)
    unit.daemons = await unit.build()
    slow = RestartPolicy(backoff=60.0, backoff_max=60.0, limit=5, window=600.0)
    supervisor = Supervisor([core], [unit], slow)
    with capture_logs():
        running = asyncio.create_task(supervisor.run(handle_signals=False))
        await wait_until(lambda: not built[0].started)
        core.request_stop("test over")
        await asyncio.wait_for(running, 10)
    assert len(built) == 1


async def test_a_suspended_unit_stays_down_until_resumed_then_runs_on_its_port() -> None:
    core = Daemon("platform", settings())
    unit, built = failing_unit("agent-gpu-a", failures=0)
    unit.daemons = await unit.build()
    reports: list[Restart] = []
    supervisor = Supervisor([core], [unit], FAST, on_restart=reports.append)
    with capture_logs():
        running = asyncio.create_task(supervisor.run(handle_signals=False))
        await wait_until(lambda: built[0].started)
        port = built[0].port
        assert await supervisor.suspend("agent-gpu-a")
        assert not await supervisor.suspend("agent-gpu-a")  # once
        await asyncio.sleep(0.1)  # no restart: a suspension is not a death
        assert not built[0].started and len(built) == 1 and not reports
        assert supervisor.daemons == [core] and supervisor.suspended == {
            "agent-gpu-a": {"agent-gpu-a": port}
        }
        assert await supervisor.resume("agent-gpu-a")
        assert not await supervisor.resume("agent-gpu-a")
        fresh = built[1]
        assert fresh.started and fresh.port == port and supervisor.daemons == [core, fresh]
        fresh.request_stop("dies")  # watched again: a death is restarted
        await wait_until(lambda: bool(reports))
    assert len(built) == 3 and built[2].started
    assert not await supervisor.suspend("nothing-such")
    core.request_stop("test over")
    await asyncio.wait_for(running, 10)
    assert not built[2].started
