"""Daemon lifecycle: readiness checks, tasks, shutdown order and timeout, signals, logging."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from datetime import timedelta

import pytest
import structlog
from structlog.testing import capture_logs

from nodeward.config import DaemonSettings
from nodeward.daemon import Daemon, DaemonError, install_signal_handlers, serve
from nodeward.health import LoopMonitor, Readiness


def settings(shutdown_s: float = 5.0) -> DaemonSettings:
    return DaemonSettings(host="127.0.0.1", port=0, shutdown_timeout=timedelta(seconds=shutdown_s))


async def wait_until(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not cond():
            await asyncio.sleep(0.005)


async def test_readiness_sync_async_raising_and_slow_checks() -> None:
    readiness = Readiness(timeout=0.05)
    never = asyncio.Event()

    async def async_ok() -> bool:
        return True

    async def slow() -> bool:
        await never.wait()
        return True

    def broken() -> bool:
        raise RuntimeError("bus\nexploded")

    readiness.add("sync ok", lambda: True)
    readiness.add("async ok", async_ok)
    readiness.add("sync no", lambda: False)
    readiness.add("slow", slow)
    readiness.add("broken", broken)
    report = await readiness.evaluate()
    assert not report.ready
    assert report.failing == ["sync no", "slow", "broken"]
    body = report.to_json()
    assert body["checks"] == {
        "sync ok": True,
        "async ok": True,
        "sync no": False,
        "slow": False,
        "broken": False,
    }
    assert body["errors"]["slow"] == "timed out after 0.05s"
    assert body["errors"]["broken"] == "RuntimeError: bus exploded"
    with pytest.raises(ValueError, match="already registered"):
        readiness.add("slow", slow)
    for name in ("sync no", "slow", "broken"):
        readiness.remove(name)
    assert (await readiness.evaluate()).ready


async def test_no_checks_means_ready() -> None:
    assert (await Readiness().evaluate()).ready


async def test_readiness_flips_when_check_passes() -> None:
    connected = False
    async with Daemon("t", settings()) as d:
        d.add_readiness_check("bus connected", lambda: connected)
        assert (await d.readiness()).failing == ["bus connected"]
        connected = True
        assert (await d.readiness()).ready


async def test_hooks_run_in_reverse_order_after_tasks_end() -> None:
    order: list[str] = []
    started = asyncio.Event()

    async def loop_task() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            order.append("task ended")

    def hook(name: str) -> Callable[[], asyncio.Future[None]]:
        async def run() -> None:
            order.append(name)

        return lambda: asyncio.ensure_future(run())

    d = Daemon("t", settings())
    d.add_task(loop_task, name="loop")
    for name in ("first", "second", "third"):
        d.add_shutdown_hook(hook(name))
    async with d:
        await asyncio.wait_for(started.wait(), 5)
        assert d.task_names == ["loop"]
    assert order == ["task ended", "third", "second", "first"]
    assert not d.task_names


async def test_shutdown_respects_timeout_with_stubborn_task_and_hook() -> None:
    release = asyncio.Event()
    handle: list[asyncio.Task[object]] = []
    hooks_ran: list[str] = []

    async def stubborn() -> None:
        task = asyncio.current_task()
        assert task is not None
        handle.append(task)
        while not release.is_set():
            try:
                await release.wait()
            except asyncio.CancelledError:
                continue

    async def slow_hook() -> None:
        await release.wait()

    async def last_hook() -> None:
        hooks_ran.append("last")

    d = Daemon("t", settings(shutdown_s=0.4))
    d.add_task(stubborn, name="stubborn")
    d.add_shutdown_hook(last_hook)
    d.add_shutdown_hook(slow_hook)
    await d.start()
    await wait_until(lambda: bool(handle))
    loop = asyncio.get_running_loop()
    began = loop.time()
    await d.stop()
    elapsed = loop.time() - began
    assert elapsed < 30  # liveness: stop() ends although a task and a hook never do
    print(f"stopped in {elapsed:.2f}s (budget 0.4s)")
    # The stubborn task used 3/4 of the budget, the slow hook the rest: last_hook is skipped.
    assert hooks_ran == []
    release.set()
    await asyncio.wait_for(handle[0], 5)


async def test_hooks_share_what_tasks_leave() -> None:
    ran: list[str] = []

    async def hook() -> None:
        ran.append("hook")

    d = Daemon("t", settings(shutdown_s=0.2))
    d.add_shutdown_hook(hook)
    async with d:
        pass
    assert ran == ["hook"]


async def test_graceful_task_returns_on_stopping_instead_of_cancel() -> None:
    d = Daemon("t", settings())
    outcome: list[str] = []
    in_flight = asyncio.Event()

    async def consumer() -> None:
        while not d.stopping.is_set():
            in_flight.set()
            await d.stopping.wait()  # stands for "fetch and handle one batch"
            outcome.append("finished in-flight work")
        outcome.append("returned")

    d.add_task(consumer, graceful=True, name="consumer")
    async with d:
        await asyncio.wait_for(in_flight.wait(), 5)
    assert outcome == ["finished in-flight work", "returned"]


async def test_task_added_after_start_runs_at_once() -> None:
    ran = asyncio.Event()

    async def job() -> None:
        ran.set()

    async with Daemon("t", settings()) as d:
        d.add_task(job)
        await asyncio.wait_for(ran.wait(), 5)
    with pytest.raises(DaemonError, match="stopping"):
        d.add_task(job)


async def test_failing_task_stops_daemon_and_run_raises() -> None:
    hooked: list[str] = []

    async def boom() -> None:
        raise ValueError("bad\nthing")

    async def hook() -> None:
        hooked.append("hook")

    d = Daemon("svc", settings())
    d.add_task(boom, name="boom")
    d.add_shutdown_hook(hook)
    with capture_logs() as logs:
        async with d:
            with pytest.raises(DaemonError) as err:
                await asyncio.wait_for(d.run_until_stopped(), 5)
    assert str(err.value) == "svc: task boom failed: ValueError: bad thing"
    assert isinstance(d.failure, ValueError)
    assert hooked == ["hook"]
    assert any(e["event"] == "task failed" and e["task"] == "boom" for e in logs)


async def test_request_stop_ends_run_until_stopped() -> None:
    d = Daemon("t", settings())

    async def stopper() -> None:
        d.request_stop("done")

    d.add_task(stopper)
    await asyncio.wait_for(d.run_until_stopped(), 5)
    assert d.stopping.is_set()
    assert d.failure is None
    await d.stop()  # idempotent


async def test_concurrent_stops_share_one_shutdown() -> None:
    calls: list[int] = []

    async def hook() -> None:
        calls.append(1)

    d = Daemon("t", settings())
    d.add_shutdown_hook(hook)
    await d.start()
    await asyncio.gather(d.stop(), d.stop(), d.stop())
    assert calls == [1]


async def test_start_twice_and_port_in_use() -> None:
    async with Daemon("a", settings()) as a:
        with pytest.raises(DaemonError, match="already started"):
            await a.start()
        taken = DaemonSettings(host="127.0.0.1", port=a.port)
        b = Daemon("b", taken)
        with pytest.raises(DaemonError, match=f"b: cannot listen on 127.0.0.1:{a.port}"):
            await b.start()
    with pytest.raises(DaemonError, match="not started"):
        _ = Daemon("c").port


def _signals_handled_by_loop() -> bool:
    handler = signal.getsignal(signal.SIGTERM)
    return handler not in (signal.SIG_DFL, signal.SIG_IGN, None)


async def test_sigterm_stops_a_daemon_that_owns_signals() -> None:
    d = Daemon("t", settings(), handle_signals=True)
    await d.start()
    if not _signals_handled_by_loop():
        await d.stop()
        pytest.skip("the event loop cannot handle signals here (not the main thread)")
    signal.raise_signal(signal.SIGTERM)
    await asyncio.wait_for(d.run_until_stopped(), 5)
    assert d.stopping.is_set()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # handler removed again


async def test_install_signal_handlers_undo() -> None:
    got: list[str] = []
    remove = install_signal_handlers(got.append, signals=(signal.SIGUSR1,))
    try:
        if signal.getsignal(signal.SIGUSR1) in (signal.SIG_DFL, None):
            pytest.skip("the event loop cannot handle signals here")
        signal.raise_signal(signal.SIGUSR1)
        await wait_until(lambda: bool(got))
        assert got == ["SIGUSR1"]
    finally:
        remove()
    assert signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL


async def test_serve_stops_all_when_one_stops() -> None:
    a, b = Daemon("a", settings()), Daemon("b", settings())

    async def stop_a() -> None:
        a.request_stop("finished")

    a.add_task(stop_a)
    await asyncio.wait_for(serve([a, b], handle_signals=False), 10)
    assert a.stopping.is_set() and b.stopping.is_set()
    assert not a.started and not b.started and a.failure is None


async def test_serve_raises_on_task_failure() -> None:
    a, b = Daemon("a", settings()), Daemon("b", settings())

    async def boom() -> None:
        raise RuntimeError("kaput")

    b.add_task(boom, name="boom")
    with capture_logs(), pytest.raises(DaemonError, match="b: RuntimeError: kaput"):
        await asyncio.wait_for(serve([a, b], handle_signals=False), 10)
    assert a.stopping.is_set()


async def test_task_logs_carry_daemon_name() -> None:
    logged = asyncio.Event()

    async def job() -> None:
        structlog.get_logger().info("working")
        logged.set()

    with capture_logs(processors=[structlog.contextvars.merge_contextvars]) as logs:
        async with Daemon("culler", settings()) as d:
            d.add_task(job, name="job")
            await asyncio.wait_for(logged.wait(), 5)
    working = [e for e in logs if e["event"] == "working"]
    assert working and working[0]["daemon"] == "culler" and working[0]["task"] == "job"
    assert all(e.get("daemon") == "culler" for e in logs if e["event"].startswith("daemon "))
    assert structlog.contextvars.get_contextvars().get("daemon") is None  # not leaked to the caller


async def test_loop_monitor_reports_overdue_heartbeat() -> None:
    monitor = LoopMonitor(interval=0.01, max_lag=0.05)
    assert monitor.problem() is None  # not running yet
    task = asyncio.create_task(monitor.run())
    await wait_until(lambda: monitor._last_beat is not None)
    assert monitor.problem() is None
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await wait_until(lambda: monitor.problem() is not None, timeout=5)
    assert "overdue" in (monitor.problem() or "")


async def test_a_stopped_daemon_does_not_restart() -> None:
    d = Daemon("t", settings())
    await d.stop()
    with pytest.raises(DaemonError, match="already stopped"):
        await d.start()


async def test_serve_stops_started_daemons_when_a_later_one_cannot_start() -> None:
    a = Daemon("a", settings())
    async with Daemon("holder", settings()) as holder:
        b = Daemon("b", DaemonSettings(host="127.0.0.1", port=holder.port))
        with pytest.raises(DaemonError, match="b: cannot listen"):
            await asyncio.wait_for(serve([a, b], handle_signals=False), 10)
    assert a.port > 0 and a.stopping.is_set() and not a.started  # started, then stopped again
