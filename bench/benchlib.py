"""What the benches share: a NATS server with every stream (and agent KV bucket)
provisioned, measuring each case in a child process that prints one JSON line, and the
memory of processes under load, and `nodeward up` launched from a checkout."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import tomllib
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def options(description: str, **numbers: float) -> argparse.ArgumentParser:
    """A bench's command line: one `--name` option per number (`_` read `-`), of the type
    of its default."""
    parser = argparse.ArgumentParser(description=description)
    for name, default in numbers.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(default), default=default)
    return parser


@contextlib.contextmanager
def exported(ref: str) -> Iterator[Path]:
    """`ref` of this repository as a plain directory tree (nothing in the repository changes)."""
    with tempfile.TemporaryDirectory(prefix="nodeward-baseline-") as tmp:
        data = subprocess.run(
            ["git", "-C", str(REPO), "archive", "--format=tar", ref],
            capture_output=True,
            check=True,
        ).stdout
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            tar.extractall(tmp, filter="data")
        _metadata(Path(tmp))
        yield Path(tmp)


def module_at(rev: str, path: str, name: str) -> ModuleType:
    """The module `path` (e.g. `nodeward/fleet_status.py`) as it was at git revision `rev`,
    loaded as a module of its own called `name`."""
    source = subprocess.run(
        ["git", "-C", str(REPO), "show", f"{rev}:{path}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    spec = importlib.util.spec_from_loader(name, loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pydantic look their module up
    exec(compile(source, f"{rev}:{path}", "exec"), module.__dict__)
    return module


def sim_cluster_command(seed_file: Path, kubeconfig: Path, *more: str) -> list[str]:
    """The command that serves the sim cluster of `seed_file` and writes its `kubeconfig`
    (it prints `kubeconfig:` once it serves); `more`: further options."""
    return [
        *(sys.executable, "-m", "launch", "sim", "cluster"),
        *("--seed", str(seed_file), "--kubeconfig", str(kubeconfig), *more),
    ]


def _metadata(tree: Path) -> None:
    """The tree's own entry points, as an install of it would write them: a `nodeward`
    dist-info at its root, which (first on `PYTHONPATH`) shadows the installed one, so a
    baseline runs with the services, agents and components it registered, not this tree's."""
    project = tomllib.loads((tree / "pyproject.toml").read_text())["project"]
    dist = tree / "nodeward-0.0.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: nodeward\nVersion: 0.0.0\n")
    groups = project.get("entry-points", {})
    (dist / "entry_points.txt").write_text(
        "".join(
            f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in entries.items()) + "\n"
            for group, entries in groups.items()
        )
    )


def xid79(node: str, sequence: int = 1) -> Any:
    """A failed gpu.health.v1 of GPU 0 of `node`: XID 79, fallen off the bus."""
    from datetime import UTC, datetime

    from schemas import make_event
    from schemas.gpu import GpuHealth, HealthReason, HealthState, RecommendedAction

    reason = HealthReason(
        code="xid",
        xid=79,
        message="GPU has fallen off the bus",
        action=RecommendedAction.REBOOT_NODE,
    )
    data = GpuHealth(
        node=node,
        gpu_index=0,
        gpu_uuid=f"GPU-{node}-0",
        state=HealthState.FAILED,
        reasons=[reason],
        recommended_action=RecommendedAction.REBOOT_NODE,
        observed_at=datetime.now(UTC),
        agent_boot_id="bench",
        sequence=sequence,
    )
    return make_event(data, source=f"agent/gpu/{node}")


def wide_cordon(nats_url: str, kubeconfig: Path) -> Any:
    """Settings of a cordon service (as its ServiceAccount) whose breaker and rate limit let
    every node be quarantined: a bench measures the path, not the policy's pacing."""
    from nodeward.config import Settings

    return Settings(
        bus={"url": nats_url},
        cluster={"kubeconfig": kubeconfig, "context": "nodeward-cordon"},
        services={
            "cordon": {
                "breaker": {"max_percent": 100, "max_nodes": 100000},
                "rate_limit": {"per_minute": 1e6, "burst": 100000},
                "concurrency": 64,
            }
        },
    )


def run_child(script: str, argv: list[str]) -> dict[str, float]:
    """Run `script` with `argv` in a fresh interpreter; its last stdout line is JSON."""
    out = subprocess.run(
        [sys.executable, script, *argv], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


async def with_server(fn: Callable[[str], Any]) -> Any:
    """`fn(nats_url)` in a thread while an embedded, provisioned nats-server runs."""
    from nodeward.bus import Bus
    from nodeward.bus.server import EmbeddedNats
    from nodeward.config import BusSettings

    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedNats(Path(tmp))
        await server.start()
        try:
            bus = await Bus.connect(BusSettings(url=server.url), source="bench/provision")
            await bus.close(grace=1)
            return await asyncio.to_thread(fn, server.url)
        finally:
            await server.stop()


def rss_mb(pid: int) -> float:
    """A process's resident memory in MiB (0 when it is gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class PeakRss:
    """The RSS of named processes before, at the peak (sampled every `every` s from
    `start()` to `stop()`) and after."""

    def __init__(self, pids: Mapping[str, int], every: float = 0.2) -> None:
        self.pids = dict(pids)
        self.every = every
        self.before = {k: rss_mb(p) for k, p in self.pids.items()}
        self.peak = dict(self.before)
        self.after: dict[str, float] = {}
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._sample())

    async def _sample(self) -> None:
        while True:
            for k, p in self.pids.items():
                self.peak[k] = max(self.peak[k], rss_mb(p))
            await asyncio.sleep(self.every)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.after = {k: rss_mb(p) for k, p in self.pids.items()}


@dataclass
class LaunchedUp:
    """A `nodeward up` started by a bench: its process, state dir and endpoints."""

    proc: asyncio.subprocess.Process
    state: Path
    endpoints: dict[str, Any]
    output: Path
    """Its stdout and stderr, together."""


async def _all_ready(endpoints: dict[str, Any]) -> None:
    import httpx

    async with httpx.AsyncClient() as client:
        while True:
            states = []
            for url in endpoints["metrics"].values():
                try:
                    states.append((await client.get(f"{url}/readyz", timeout=2)).status_code)
                except httpx.HTTPError:
                    states.append(0)
            if all(s == 200 for s in states):
                return
            await asyncio.sleep(0.5)


@contextlib.asynccontextmanager
async def launched_up(repo: Path, *args: str) -> AsyncIterator[LaunchedUp]:
    """`nodeward up` from checkout `repo` (with `args`) in a temp dir, once every daemon is
    ready; stopped with SIGINT (killed after 60 s) and its temp dir removed at the end."""
    tmp = Path(tempfile.mkdtemp(prefix="bench-up-"))
    state, output = tmp / "state", tmp / "output"
    env = {k: v for k, v in os.environ.items() if not k.startswith("NODEWARD_")}
    env["PYTHONPATH"] = str(repo)
    with output.open("w") as out:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "launch", "up", "--state-dir", str(state), *args,
            cwd=tmp, env=env, stdout=out, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
    try:
        endpoints_file = state / "endpoints.json"
        async with asyncio.timeout(180):
            while not endpoints_file.exists():  # noqa: ASYNC110 - another process writes it
                await asyncio.sleep(0.2)
            endpoints = json.loads(endpoints_file.read_text())
            await _all_ready(endpoints)
        yield LaunchedUp(proc, state, endpoints, output)
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGINT)
            try:
                async with asyncio.timeout(60):
                    await proc.wait()
            except TimeoutError:
                proc.kill()
                await proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)
