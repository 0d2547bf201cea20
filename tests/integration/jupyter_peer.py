"""A real Jupyter server for tests (jupyter_server + ipykernel), with kernels made busy or idle.

`jupyter_peer` is session-scoped (one server per xdist worker): tests start their own
kernels (`kernel` fixture, or `JupyterPeer.start_kernel`) and shut them down. The server runs
Kubeflow-style under the base URL `/notebook/<NAMESPACE>/<NAME>`, so `peer.pod()` is a pod
object whose IP, `notebook-port` and `NB_PREFIX` lead to it; `peer.pod(ns, name)` for any
other name points at it through the `nodeward.io/jupyter-url` annotation instead.

A kernel is made busy by an `execute_request` on its websocket (`make_busy`), running
`time.sleep(N)`; `interrupt` makes it idle again.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from nodeward.aio import within
from nodeward.bus.server import free_port
from tests.conftest import wait_for

NAMESPACE, NAME = "jupyter-peer", "nb-peer"
START_TIMEOUT = 60.0


@dataclass
class JupyterPeer:
    """A running Jupyter server: its URL, token and helpers to drive its kernels."""

    port: int
    token: str
    prefix: str
    root_dir: Path
    token_file: Path
    process: subprocess.Popen[bytes]
    log_file: Path

    @property
    def url(self) -> str:
        """The server's base URL (with the Kubeflow-style prefix), no trailing slash."""
        return f"http://127.0.0.1:{self.port}{self.prefix}"

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"token {self.token}"}

    def pod(
        self, namespace: str = NAMESPACE, name: str = NAME, *, annotate: bool | None = None
    ) -> dict[str, Any]:
        """A notebook pod object whose Jupyter server is this one.

        For the peer's own namespace/name (or `annotate=False`) it is found as Kubeflow
        runs it (pod IP, `notebook-port`, `NB_PREFIX`); otherwise through the annotation.
        """
        if annotate is None:
            annotate = (namespace, name) != (NAMESPACE, NAME)
        annotations = {"nodeward.io/jupyter-url": self.url} if annotate else {}
        return {
            "metadata": {
                "namespace": namespace,
                "name": name,
                "uid": str(uuid.uuid4()),
                "labels": {"notebook-name": name},
                "annotations": annotations,
            },
            "spec": {
                "containers": [
                    {
                        "name": name,
                        "image": "kubeflownotebookswg/jupyter-scipy",
                        "env": [{"name": "NB_PREFIX", "value": self.prefix}],
                        "ports": [
                            {"name": "notebook-port", "containerPort": self.port, "protocol": "TCP"}
                        ],
                    }
                ]
            },
            "status": {"phase": "Running", "podIP": "127.0.0.1"},
        }

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self.url, headers=self.headers, timeout=30, trust_env=False
        )

    async def kernels(self) -> list[dict[str, Any]]:
        async with self.client() as c:
            r = await c.get("/api/kernels")
            r.raise_for_status()
            return list(r.json())

    async def kernel(self, kernel_id: str) -> dict[str, Any]:
        async with self.client() as c:
            r = await c.get(f"/api/kernels/{kernel_id}")
            r.raise_for_status()
            return dict(r.json())

    async def wait_state(self, kernel_id: str, state: str, timeout: float = 30.0) -> dict[str, Any]:
        """Wait until the server reports the kernel in `state` (idle, busy, ...)."""

        async def reached() -> dict[str, Any] | None:
            k = await self.kernel(kernel_id)
            return k if k.get("execution_state") == state else None

        result: dict[str, Any] = await wait_for(
            reached, timeout=timeout, interval=0.1, what=f"kernel {kernel_id} {state}"
        )
        return result

    async def start_kernel(self, name: str = "python3") -> str:
        """Start a kernel and wait until it is idle; returns its ID."""
        async with self.client() as c:
            r = await c.post("/api/kernels", json={"name": name})
            r.raise_for_status()
            kernel_id = str(r.json()["id"])
        await self.say_hello(kernel_id)
        await self.wait_state(kernel_id, "idle", timeout=START_TIMEOUT)
        return kernel_id

    async def shutdown_kernel(self, kernel_id: str) -> None:
        async with self.client() as c:
            r = await c.delete(f"/api/kernels/{kernel_id}")
            if r.status_code not in (204, 404):
                r.raise_for_status()

    async def shutdown_all(self) -> None:
        for k in await self.kernels():
            await self.shutdown_kernel(str(k["id"]))

    async def request(
        self,
        kernel_id: str,
        msg_type: str,
        content: dict[str, Any],
        *,
        until: Callable[[dict[str, Any], str], bool],
        timeout: float = 30.0,
    ) -> str:
        """Send one shell request on the kernel's websocket and read until `until(msg,
        msg_id)` holds for a message the server relays. Returns the request's message ID."""
        from tornado.httpclient import HTTPRequest
        from tornado.websocket import websocket_connect

        session = uuid.uuid4().hex
        msg_id = uuid.uuid4().hex
        request = HTTPRequest(
            f"ws://127.0.0.1:{self.port}{self.prefix}/api/kernels/{kernel_id}/channels"
            f"?session_id={session}",
            headers=self.headers,
        )
        message = {
            "header": {
                "msg_id": msg_id,
                "msg_type": msg_type,
                "username": "test",
                "session": session,
                "date": datetime.now(UTC).isoformat(),
                "version": "5.3",
            },
            "parent_header": {},
            "metadata": {},
            "content": content,
            "channel": "shell",
            "buffers": [],
        }
        conn = await within(websocket_connect(request), timeout)
        try:
            await conn.write_message(json.dumps(message))

            async def answered() -> None:
                while True:
                    raw = await conn.read_message()
                    if raw is None:
                        raise AssertionError(f"kernel {kernel_id}: websocket closed")
                    if until(json.loads(raw), msg_id):
                        return

            await within(answered(), timeout)
        finally:
            conn.close()
        return msg_id

    async def execute(self, kernel_id: str, code: str) -> str:
        """Send `code` to the kernel; return once the kernel says it is busy with it (the
        code keeps running). Returns the request's message ID."""

        def busy_with_it(msg: dict[str, Any], msg_id: str) -> bool:
            return (
                msg.get("channel") == "iopub"
                and msg.get("msg_type") == "status"
                and msg.get("parent_header", {}).get("msg_id") == msg_id
                and msg.get("content", {}).get("execution_state") == "busy"
            )

        content = {
            "code": code,
            "silent": False,
            "store_history": False,
            "user_expressions": {},
            "allow_stdin": False,
            "stop_on_error": True,
        }
        return await self.request(kernel_id, "execute_request", content, until=busy_with_it)

    async def say_hello(self, kernel_id: str) -> None:
        """A kernel_info exchange, as a frontend does on connecting: until a client has
        talked to it, Jupyter reports a REST-started kernel as `starting`."""

        def replied(msg: dict[str, Any], msg_id: str) -> bool:
            return (
                msg.get("msg_type") == "kernel_info_reply"
                and msg.get("parent_header", {}).get("msg_id") == msg_id
            )

        await self.request(
            kernel_id, "kernel_info_request", {}, until=replied, timeout=START_TIMEOUT
        )

    async def make_busy(self, kernel_id: str, seconds: float = 60.0) -> None:
        """Run `time.sleep(seconds)` in the kernel; return when the server reports it busy."""
        await self.execute(kernel_id, f"import time; time.sleep({seconds})")
        await self.wait_state(kernel_id, "busy")

    async def interrupt(self, kernel_id: str) -> None:
        """Interrupt what the kernel runs; return when the server reports it idle again."""
        async with self.client() as c:
            r = await c.post(f"/api/kernels/{kernel_id}/interrupt")
            r.raise_for_status()
        await self.wait_state(kernel_id, "idle")


def _log_tail(path: Path, lines: int = 30) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return "(no log)"


def start_jupyter(base: Path, *, prefix: str = f"/notebook/{NAMESPACE}/{NAME}") -> JupyterPeer:
    """Start `jupyter server` on a free loopback port in `base`; wait for `/api/status`."""
    try:
        import ipykernel  # noqa: F401 - the kernels the server starts need it
        import jupyter_server  # noqa: F401 - the peer itself
    except ImportError as exc:
        pytest.skip(f"jupyter peer: {exc.name} is not installed (pip install -e '.[test]')")
    root = base / "root"
    root.mkdir(parents=True, exist_ok=True)
    token = uuid.uuid4().hex
    token_file = base / "token"
    token_file.write_text(token + "\n")
    port = free_port()
    env = dict(os.environ)
    for var, sub in (
        ("JUPYTER_CONFIG_DIR", "config"),
        ("JUPYTER_DATA_DIR", "data"),
        ("JUPYTER_RUNTIME_DIR", "runtime"),
        ("IPYTHONDIR", "ipython"),
    ):
        (base / sub).mkdir(exist_ok=True)
        env[var] = str(base / sub)
    env.pop("JUPYTER_TOKEN", None)
    log_file = base / "jupyter.log"
    with log_file.open("wb") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "jupyter_server",
                "--no-browser",
                "--allow-root",
                "--ServerApp.ip=127.0.0.1",
                f"--ServerApp.port={port}",
                "--ServerApp.port_retries=0",
                f"--ServerApp.token={token}",
                f"--ServerApp.root_dir={root}",
                f"--ServerApp.base_url={prefix}/",
            ],
            cwd=root,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    peer = JupyterPeer(port, token, prefix, root, token_file, process, log_file)
    deadline = time.monotonic() + START_TIMEOUT
    with httpx.Client(headers=peer.headers, timeout=2, trust_env=False) as c:
        while True:
            if process.poll() is not None:
                raise RuntimeError(
                    f"jupyter server exited with {process.returncode}:\n{_log_tail(log_file)}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if c.get(f"{peer.url}/api/status").status_code == 200:
                    return peer
            if time.monotonic() > deadline:
                stop_jupyter(peer)
                raise RuntimeError(
                    f"jupyter server not up within {START_TIMEOUT}s:\n{_log_tail(log_file)}"
                )
            time.sleep(0.1)  # polling a starting process, not synchronising a test


def stop_jupyter(peer: JupyterPeer) -> None:
    """Stop the server and its kernels (its own process group)."""
    if peer.process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(peer.process.pid, signal.SIGTERM)
        try:
            peer.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(peer.process.pid, signal.SIGKILL)
            peer.process.wait(timeout=5)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(peer.process.pid, signal.SIGKILL)  # kernels left in the group


@pytest.fixture(scope="session")
def jupyter_peer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[JupyterPeer]:
    """One Jupyter server per test session (per xdist worker)."""
    peer = start_jupyter(tmp_path_factory.mktemp("jupyter"))
    yield peer
    stop_jupyter(peer)


@pytest_asyncio.fixture
async def jupyter_kernel(jupyter_peer: JupyterPeer) -> AsyncIterator[str]:
    """A kernel of its own for one test, idle when the test starts; shut down after."""
    kernel_id = await jupyter_peer.start_kernel()
    yield kernel_id
    with contextlib.suppress(httpx.HTTPError):
        await jupyter_peer.shutdown_kernel(kernel_id)


__all__ = ["JupyterPeer", "jupyter_kernel", "jupyter_peer", "start_jupyter"]
