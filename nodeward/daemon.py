"""The process every agent and service runs in: HTTP health and metrics, tasks, shutdown.

A `Daemon` serves `/healthz`, `/readyz` and `/metrics` on its own port, runs long-lived
tasks, and stops gracefully: readiness turns 503, tasks are cancelled (or, if `graceful`,
asked to return through `daemon.stopping`), shutdown hooks run in reverse order, and the
HTTP server closes, all within `DaemonSettings.shutdown_timeout`.

Several daemons can share one event loop (`nodeward up`). Signal handling therefore
belongs to whoever owns the process: `serve(...)`, `install_signal_handlers(...)`, or
`Daemon(handle_signals=True)` for a daemon alone in its process.
"""

from __future__ import annotations

import asyncio
import signal
import ssl
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from types import TracebackType
from typing import Any, Self

import structlog
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, Gauge, generate_latest
from prometheus_client.exposition import choose_encoder

from nodeward.aio import any_set, within
from nodeward.config import DaemonSettings
from nodeward.health import LoopMonitor, Readiness, ReadinessCheck, ReadinessReport
from nodeward.logs import get_logger
from nodeward.metrics import Exposed, Metrics

TaskFactory = Callable[[], Coroutine[Any, Any, Any]]
ShutdownHook = Callable[[], Awaitable[Any]]

# How long aiohttp waits for in-flight HTTP requests when the server closes.
_HTTP_CLOSE_TIMEOUT = 1.0


class DaemonError(RuntimeError):
    """A daemon could not start, or stopped because one of its tasks failed. One line."""

    def __str__(self) -> str:
        return " ".join(super().__str__().split())


def install_signal_handlers(
    on_signal: Callable[[str], None],
    signals: Iterable[signal.Signals] = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP),
) -> Callable[[], None]:
    """Call `on_signal(<signal name>)` on SIGTERM, SIGINT or SIGHUP (the terminal closed) in
    the running loop; returns an undo.

    Where the loop cannot handle signals (not the main thread, Windows) nothing is installed.
    """
    loop = asyncio.get_running_loop()
    installed: list[signal.Signals] = []
    for sig in signals:
        try:
            loop.add_signal_handler(sig, on_signal, sig.name)
        except (NotImplementedError, RuntimeError, ValueError):
            continue
        installed.append(sig)

    def remove() -> None:
        for sig in installed:
            loop.remove_signal_handler(sig)

    return remove


def _name_of(obj: object) -> str:
    return str(getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or repr(obj))


class Daemon:
    """One agent's or service's lifecycle, health endpoints and metrics.

    Use as `async with Daemon("cordon", settings) as d: ...; await d.run_until_stopped()`.
    A daemon runs once. Give each daemon its own `Metrics` (the default): the daemon adds
    `nodeward_event_loop_lag_seconds` to that registry.
    """

    def __init__(
        self,
        name: str,
        settings: DaemonSettings | None = None,
        *,
        metrics: Metrics | None = None,
        logger: Any = None,
        handle_signals: bool = False,
        readiness_timeout: float = 2.0,
        heartbeat_interval: float = 1.0,
        max_loop_lag: float = 10.0,
    ) -> None:
        self.name = name
        self.settings = settings or DaemonSettings()
        self.metrics = metrics or Metrics(name)
        self.log: Any = logger if logger is not None else get_logger(daemon=name)
        self.stopping = asyncio.Event()
        """Set as soon as a stop is requested; `graceful` tasks return when they see it."""
        self._handle_signals = handle_signals
        self._readiness = Readiness(readiness_timeout)
        self._loop_lag = Gauge(
            "nodeward_event_loop_lag_seconds",
            "How late the event loop ran the daemon's last heartbeat",
            registry=self.metrics.registry,
        )
        self._monitor = LoopMonitor(heartbeat_interval, max_loop_lag, on_beat=self._loop_lag.set)
        self._factories: list[tuple[str, TaskFactory, bool]] = []
        self._tasks: dict[asyncio.Task[None], tuple[str, bool]] = {}
        self._hooks: list[ShutdownHook] = []
        self._runner: web.AppRunner | None = None
        self._port: int | None = None
        self._monitor_task: asyncio.Task[None] | None = None
        self._stop_task: asyncio.Future[None] | None = None
        self._stop_reason: str | None = None
        self._failure: tuple[str, BaseException] | None = None
        self._remove_signal_handlers: Callable[[], None] = lambda: None

    # -- registration -----------------------------------------------------------------

    def add_readiness_check(self, name: str, check: ReadinessCheck) -> None:
        """Register a check (`() -> bool` or `async () -> bool`); /readyz is 200 only if all pass."""
        self._readiness.add(name, check)

    def remove_readiness_check(self, name: str) -> None:
        self._readiness.remove(name)

    def add_task(
        self, factory: TaskFactory, *, name: str | None = None, graceful: bool = False
    ) -> None:
        """Run `factory()` as a long-lived task from `start()` (at once if already started).

        On stop the task is cancelled; a `graceful` task is instead expected to return once
        `daemon.stopping` is set, and is cancelled only after half the shutdown timeout.
        A task that raises stops the daemon, and `run_until_stopped()` raises `DaemonError`.
        """
        if self.stopping.is_set():
            raise DaemonError(f"{self.name}: cannot add a task while stopping")
        entry = (name or _name_of(factory), factory, graceful)
        self._factories.append(entry)
        if self._runner is not None:
            self._spawn(*entry)

    def add_shutdown_hook(self, hook: ShutdownHook) -> None:
        """Run `await hook()` on stop, after the tasks have ended; hooks run last-added first."""
        self._hooks.append(hook)

    # -- state ------------------------------------------------------------------------

    @property
    def started(self) -> bool:
        """True from `start()` until the HTTP server closes at the end of `stop()`."""
        return self._runner is not None

    @property
    def port(self) -> int:
        """The port the HTTP server is (or was last) bound to; the one picked when settings say 0."""
        if self._port is None:
            raise DaemonError(f"{self.name}: not started")
        return self._port

    @property
    def url(self) -> str:
        """Base URL of the HTTP endpoints, e.g. `http://127.0.0.1:40123`."""
        return local_url(self.settings.host, self.port)

    @property
    def failure(self) -> BaseException | None:
        """The exception of the task that stopped the daemon, if one did."""
        return self._failure[1] if self._failure else None

    @property
    def stop_cause(self) -> str | None:
        """Why the daemon is stopping, in one line: the task that failed, or the reason given."""
        if self._failure is not None:
            name, exc = self._failure
            text = " ".join(str(exc).split())
            return f"task {name} failed: {type(exc).__name__}" + (f": {text}" if text else "")
        return self._stop_reason

    @property
    def task_names(self) -> list[str]:
        return [name for name, _ in self._tasks.values()]

    async def readiness(self) -> ReadinessReport:
        """Evaluate every readiness check now."""
        return await self._readiness.evaluate()

    def liveness_problem(self) -> str | None:
        """Why /healthz fails now (stopping, event loop wedged), or None."""
        if self.stopping.is_set():
            return "shutting down"
        return self._monitor.problem()

    # -- lifecycle --------------------------------------------------------------------

    async def start(self, *, port: int | None = None) -> None:
        """Bind the HTTP server, start the heartbeat and every registered task.

        `port` binds that port instead of the settings' (a restarted daemon takes back its
        predecessor's).
        """
        if self._runner is not None:
            raise DaemonError(f"{self.name}: already started")
        if self._stop_task is not None:
            raise DaemonError(f"{self.name}: already stopped; a daemon runs once")
        app = web.Application()
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/metrics", self._metrics)
        port = self.settings.port if port is None else port
        self._runner, self._port = await listen(
            app, self.settings.host, port, lambda why: DaemonError(f"{self.name}: {why}")
        )
        self._monitor_task = asyncio.create_task(self._monitor.run(), name=f"{self.name}:heartbeat")
        for entry in self._factories:
            self._spawn(*entry)
        if self._handle_signals:
            self._remove_signal_handlers = install_signal_handlers(self.request_stop)
        self.log.info("daemon started", url=self.url, tasks=self.task_names)

    def request_stop(self, reason: str = "requested") -> None:
        """Ask the daemon to stop (safe from signal handlers); `run_until_stopped` then returns."""
        if not self.stopping.is_set():
            self._stop_reason = reason
            self.stopping.set()

    async def run_until_stopped(self) -> None:
        """Start if needed, wait for a stop request, stop gracefully.

        Raises `DaemonError` if a task failed.
        """
        if self._runner is None and self._stop_task is None:
            await self.start()
        await self.stopping.wait()
        await self.stop()
        if self._failure is not None:
            name, exc = self._failure
            raise DaemonError(
                f"{self.name}: task {name} failed: {type(exc).__name__}: {exc}"
            ) from exc

    async def stop(self) -> None:
        """Stop gracefully within `shutdown_timeout`; idempotent, and safe to call concurrently."""
        if self._stop_task is None:
            self.request_stop()
            self._stop_task = asyncio.ensure_future(self._shutdown())
        await asyncio.shield(self._stop_task)

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    # -- internals --------------------------------------------------------------------

    def _spawn(self, name: str, factory: TaskFactory, graceful: bool) -> None:
        task = asyncio.create_task(self._supervise(name, factory), name=f"{self.name}:{name}")
        self._tasks[task] = (name, graceful)
        task.add_done_callback(lambda t: self._tasks.pop(t, None))

    async def _supervise(self, name: str, factory: TaskFactory) -> None:
        # This task runs in its own copy of the context: the binding stays inside it.
        structlog.contextvars.bind_contextvars(daemon=self.name, task=name)
        try:
            await factory()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.log.exception("task failed", task=name)
            if not self.stopping.is_set() and self._failure is None:
                self._failure = (name, exc)
                self.request_stop(f"task {name} failed")
        else:
            if not self.stopping.is_set():
                self.log.info("task finished", task=name)

    async def _shutdown(self) -> None:
        loop = asyncio.get_running_loop()
        timeout = self.settings.shutdown_timeout.total_seconds()
        began = loop.time()
        self.log.info("daemon stopping", reason=self._stop_reason, timeout_s=timeout)
        try:
            await self._stop_tasks(began, timeout)
            for hook in reversed(self._hooks):
                await self._run_hook(hook, began + timeout - loop.time())
        finally:
            if self._monitor_task is not None:
                self._monitor_task.cancel()
                await asyncio.gather(self._monitor_task, return_exceptions=True)
            if self._runner is not None:
                await self._runner.cleanup()
                self._runner = None
            self._remove_signal_handlers()
            self.log.info("daemon stopped", seconds=round(loop.time() - began, 3))

    async def _stop_tasks(self, began: float, budget: float) -> None:
        loop = asyncio.get_running_loop()
        tasks = dict(self._tasks)
        for task, (_, graceful) in tasks.items():
            if not graceful:
                task.cancel()
        pending = set(tasks)
        # Graceful tasks get half the budget to return; cancelled ones unwind until 3/4.
        for share in (0.5, 0.75):
            if not pending:
                return
            _, pending = await asyncio.wait(
                pending, timeout=max(0.0, began + share * budget - loop.time())
            )
            for task in pending:
                task.cancel()
        if pending:
            names = sorted(tasks[t][0] for t in pending)
            self.log.warning("tasks did not stop within the shutdown timeout", tasks=names)

    async def _run_hook(self, hook: ShutdownHook, remaining: float) -> None:
        name = _name_of(hook)
        if remaining <= 0:
            self.log.warning("shutdown hook skipped: shutdown timeout spent", hook=name)
            return
        try:
            await within(hook(), remaining)
        except TimeoutError:
            self.log.warning("shutdown hook timed out", hook=name, timeout_s=round(remaining, 3))
        except Exception:
            self.log.exception("shutdown hook failed", hook=name)

    async def _healthz(self, request: web.Request) -> web.Response:
        problem = self.liveness_problem()
        if problem is not None:
            status = "stopping" if self.stopping.is_set() else "unhealthy"
            return web.json_response(
                {"status": status, "daemon": self.name, "reason": problem}, status=503
            )
        return web.json_response({"status": "ok", "daemon": self.name})

    async def _readyz(self, request: web.Request) -> web.Response:
        if self.stopping.is_set():
            body = {"status": "stopping", "daemon": self.name, "failing": ["shutting down"]}
            return web.json_response(body, status=503)
        report = await self._readiness.evaluate()
        return web.json_response(
            {**report.to_json(), "daemon": self.name}, status=200 if report.ready else 503
        )

    async def _metrics(self, request: web.Request) -> web.Response:
        accept = request.headers.get("Accept", "")
        exposed = Exposed(self.metrics.registry)  # no `_created` series
        if "application/openmetrics-text" in accept:
            encoder, content_type = choose_encoder(accept)
            body = encoder(exposed)
        else:
            body, content_type = generate_latest(exposed), CONTENT_TYPE_LATEST
        return web.Response(body=body, headers={"Content-Type": content_type})


async def listen(
    app: web.Application,
    host: str,
    port: int,
    fail: Callable[[str], Exception],
    *,
    ssl_context: ssl.SSLContext | None = None,
) -> tuple[web.AppRunner, int]:
    """Serve `app` on `host`:`port` (0: a free port): its runner, and the port it bound.

    Raises `fail("cannot listen on HOST:PORT: WHY")`, the runner cleaned up, when it cannot.
    """
    runner = web.AppRunner(
        app, access_log=None, handle_signals=False, shutdown_timeout=_HTTP_CLOSE_TIMEOUT
    )
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=ssl_context)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        raise fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    return runner, int(runner.addresses[0][1])


def local_url(host: str, port: int) -> str:
    """The URL a client on this machine reaches a server listening on `host`:`port` by
    (a wildcard address as loopback, an IPv6 address in brackets), without a path."""
    host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


async def serve(daemons: Sequence[Daemon], *, handle_signals: bool = True) -> None:
    """Run several daemons in this loop until SIGTERM/SIGINT or until any of them stops.

    Daemons already started (to learn their ports, say) are taken as they are.

    Then every daemon stops (concurrently, each within its own timeout). Raises
    `DaemonError` if a daemon failed to start or one of their tasks failed.
    """
    signalled = asyncio.Event()
    remove = (
        install_signal_handlers(lambda _: signalled.set()) if handle_signals else (lambda: None)
    )
    started: list[Daemon] = []
    try:
        for daemon in daemons:
            if not daemon.started:
                await daemon.start()
            started.append(daemon)
        await any_set([*(d.stopping for d in started), signalled])
    finally:
        await asyncio.gather(*(d.stop() for d in started))
        remove()
    failed = [d for d in started if d.failure is not None]
    if failed:
        d = failed[0]
        raise DaemonError(f"{d.name}: {type(d.failure).__name__}: {d.failure}") from d.failure
