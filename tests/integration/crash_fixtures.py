"""An acting service as a separate process, killed at a failpoint or at random, restarted."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from nodeward.failpoints import ENV as FAILPOINT_ENV


class _HasSettings(Protocol):
    settings: Any  # its `Settings`


E = TypeVar("E", bound=_HasSettings)


@dataclass
class ServiceProcess:
    """`python -m launch service <name> --config <file>`; one process at a time."""

    name: str
    config: dict[str, Any]
    workdir: Path
    nats_url: str
    proc: subprocess.Popen[bytes] | None = None
    runs: int = 0
    logs: list[Path] = field(default_factory=list)

    @classmethod
    def of(cls, name: str, settings: Any, workdir: Path, nats_url: str) -> ServiceProcess:
        """The service `name` as a test env set it up (`settings`: its `Settings`), run as
        its own process against the same NATS and sim cluster."""
        config = {
            "bus": {"url": nats_url, "publish_timeout": "2s"},
            "cluster": {"kubeconfig": str(settings.cluster.kubeconfig), "retries": 1},
            "daemon": {"shutdown_timeout": "4s"},
            "services": {name: dict(settings.services[name])},
        }
        return cls(name, config, workdir, nats_url)

    def start(self, failpoint: str | None = None) -> None:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        path = self.workdir / f"{self.name}-crash.yaml"
        path.write_text(json.dumps(self.config))  # JSON is YAML
        env = os.environ | {"NODEWARD_NATS_URL": self.nats_url}
        env.pop(FAILPOINT_ENV, None)
        if failpoint:
            env[FAILPOINT_ENV] = failpoint
        self.runs += 1
        log = self.workdir / f"{self.name}-{self.runs}.log"
        self.logs.append(log)
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "launch", "service", self.name, "--config", str(path)],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.workdir,
            )

    async def exited(self, timeout: float = 30) -> int:
        """Wait for the process to end by itself (a failpoint's SIGKILL: -9)."""
        assert self.proc is not None
        proc = self.proc
        try:
            return await asyncio.to_thread(proc.wait, timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.name} did not exit; log: {self.tail()}") from None

    def kill(self) -> None:
        """SIGKILL now (no shutdown hooks) and reap."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    def tail(self, lines: int = 40) -> str:
        if not self.logs:
            return ""
        text = self.logs[-1].read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])


@asynccontextmanager
async def processes_of(
    name: str, make_env: Callable[..., Awaitable[E]], workdir: Path, nats_url: str
) -> AsyncIterator[Callable[..., Awaitable[tuple[E, ServiceProcess]]]]:
    """A factory of (env, the service `name` as its own process) pairs, the env made by
    `make_env`; every process it made is killed on the way out."""
    made: list[ServiceProcess] = []

    async def make(**service: Any) -> tuple[E, ServiceProcess]:
        env = await make_env(**service)
        proc = ServiceProcess.of(name, env.settings, workdir, nats_url)
        made.append(proc)
        return env, proc

    try:
        yield make
    finally:
        for proc in made:
            proc.kill()
