"""Debian's docker-registry (distribution 2.x) as a peer: where `nodeward up` and the tests
push checkpoint images. Started on loopback with deletes enabled (retention needs them), and
optionally htpasswd auth; ready once `GET /v2/` answers."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import signal
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import structlog

from nodeward.bus.server import exit_reason, free_port


class RegistryUnavailable(RuntimeError):
    """docker-registry is not installed or did not become ready: tests skip, `up` warns."""


def find_registry() -> str:
    found = shutil.which("docker-registry")
    if found is None:
        raise RegistryUnavailable(
            "docker-registry not found (Debian package docker-registry; scripts/system-deps.sh)"
        )
    return found


def registry_config(
    root: Path, address: str, *, htpasswd: Path | None = None, level: str = "warn"
) -> dict[str, object]:
    """distribution's config: filesystem storage under `root`, deletes on, `address` to serve."""
    config: dict[str, object] = {
        "version": 0.1,
        "log": {"level": level, "accesslog": {"disabled": True}},
        "storage": {
            "filesystem": {"rootdirectory": str(root)},
            "delete": {"enabled": True},
            "maintenance": {"uploadpurging": {"enabled": False}},
        },
        "http": {"addr": address, "secret": "nodeward-local-registry"},
    }
    if htpasswd is not None:
        config["auth"] = {"htpasswd": {"realm": "nodeward", "path": str(htpasswd)}}
    return config


async def _ready(proc: subprocess.Popen[bytes], url: str, timeout: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    async with httpx.AsyncClient(timeout=1.0) as client:
        while True:
            if proc.poll() is not None:
                raise RegistryUnavailable(f"docker-registry {exit_reason(proc.returncode)}")
            with contextlib.suppress(httpx.HTTPError):
                response = await client.get(url)
                if response.status_code == 401 or (
                    response.status_code == 200 and response.json() == {}
                ):
                    return
            if loop.time() > deadline:
                raise RegistryUnavailable(f"docker-registry did not answer {url} in {timeout}s")
            await asyncio.sleep(0.02)


def _last_line(log_file: Path) -> str:
    with contextlib.suppress(OSError):
        lines = [ln for ln in log_file.read_text(errors="replace").splitlines() if ln.strip()]
        return lines[-1][:300] if lines else ""
    return ""


@contextlib.asynccontextmanager
async def run_registry(
    state_dir: Path,
    *,
    port: int = 0,
    host: str = "127.0.0.1",
    htpasswd: Path | None = None,
    startup_timeout: float = 15.0,
    dies_with_parent: bool = False,
) -> AsyncIterator[str]:
    """docker-registry serving `state_dir`/storage on `host:port` (0: a free port) until the
    block ends; yields its `host:port`. `RegistryUnavailable` when it is missing or does not
    start. `dies_with_parent`: as `EmbeddedNats`'s, for `nodeward up`."""
    binary = find_registry()
    log = structlog.get_logger().bind(component="docker-registry")
    log_file = state_dir / "registry.log"
    tries = 1 if port else 3  # a free port taken by someone else before the registry binds it
    for attempt in range(tries):
        address = f"{host}:{port or free_port(host)}"
        config = await asyncio.to_thread(_write_config, state_dir, address, htpasswd)
        proc = _spawn(binary, config, log_file, dies_with_parent)
        try:
            await _ready(proc, f"http://{address}/v2/", startup_timeout)
        except RegistryUnavailable as exc:
            await _stop(proc)
            if attempt + 1 < tries and "address already in use" in _last_line(log_file):
                continue
            raise RegistryUnavailable(f"{exc}: {_last_line(log_file)}") from None
        break
    log.info("registry.started", address=address, pid=proc.pid, storage=str(state_dir))
    try:
        yield address
    finally:
        await _stop(proc)
        log.info("registry.stopped", address=address)


def _write_config(state_dir: Path, address: str, htpasswd: Path | None) -> Path:
    state_dir.mkdir(parents=True, exist_ok=True)
    config = state_dir / "config.yml"
    config.write_text(  # JSON is YAML
        json.dumps(registry_config(state_dir / "storage", address, htpasswd=htpasswd))
    )
    return config


def _spawn(
    binary: str, config: Path, log_file: Path, dies_with_parent: bool
) -> subprocess.Popen[bytes]:
    """Start the registry, its output in `log_file`. `dies_with_parent`: SIGTERM when the
    thread that started it ends (util-linux setpriv), so call it on the loop's thread."""
    args = [binary, "serve", str(config)]
    setpriv = shutil.which("setpriv") if dies_with_parent else None
    if setpriv:
        args = [setpriv, "--pdeathsig", "TERM", "--", *args]
    with log_file.open("ab") as sink:
        return subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=sink, stderr=sink, start_new_session=True
        )


async def _stop(proc: subprocess.Popen[bytes], timeout: float = 5.0) -> None:
    """SIGTERM, then SIGKILL after `timeout`; waits without blocking the loop."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while proc.poll() is None:
        if loop.time() > deadline:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            deadline = loop.time() + timeout
        await asyncio.sleep(0.01)
