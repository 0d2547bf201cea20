"""The idleness agent's kernel source against a real Jupyter server, and against servers that
answer wrongly: only a 200 kernel list is known; everything else is unknown, never idle."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web

from agents.sources.activity import KernelsReading
from agents.sources.jupyter import JupyterKernels, JupyterSettings
from nodeward.bus.server import free_port
from tests.helpers.net import served
from tests.integration.jupyter_peer import JupyterPeer, start_jupyter, stop_jupyter

pytestmark = pytest.mark.peer("jupyter")


def source(token_file: Path | None, **kw: Any) -> JupyterKernels:
    return JupyterKernels(JupyterSettings(token_file=token_file, **kw))


async def read_once(kernels: JupyterKernels, pod: dict[str, Any]) -> KernelsReading:
    """One reading of `pod`'s kernels; `kernels` closed after it."""
    try:
        return await kernels.kernels(pod)
    finally:
        await kernels.aclose()


async def test_an_idle_kernel_is_known_with_its_last_activity(
    jupyter_peer: JupyterPeer, jupyter_kernel: str
) -> None:
    # Found as Kubeflow runs it: pod IP, the `notebook-port` port and NB_PREFIX.
    reading = await read_once(source(jupyter_peer.token_file), jupyter_peer.pod())
    assert reading.known, reading.error
    assert reading.error is None
    assert reading.kernels is not None
    mine = next(k for k in reading.kernels if k.id == jupyter_kernel)
    assert mine.execution_state == "idle"
    assert mine.name == "python3"
    assert mine.last_activity is not None
    assert datetime.now(UTC) - mine.last_activity < timedelta(minutes=2)


async def test_a_busy_kernel_reads_busy_then_idle_after_an_interrupt(
    jupyter_peer: JupyterPeer, jupyter_kernel: str
) -> None:
    kernels = source(jupyter_peer.token_file)
    pod = jupyter_peer.pod("user-alice", "nb-alice")  # through the URL annotation
    try:
        await jupyter_peer.make_busy(jupyter_kernel, seconds=120)
        busy = await kernels.kernels(pod)
        assert busy.kernels is not None, busy.error
        assert {k.id: k.execution_state for k in busy.kernels}[jupyter_kernel] == "busy"

        await jupyter_peer.interrupt(jupyter_kernel)
        idle = await kernels.kernels(pod)
        assert idle.kernels is not None, idle.error
        after = next(k for k in idle.kernels if k.id == jupyter_kernel)
        assert after.execution_state == "idle"
        mine_busy = next(k for k in busy.kernels if k.id == jupyter_kernel)
        assert after.last_activity is not None and mine_busy.last_activity is not None
        assert after.last_activity >= mine_busy.last_activity  # the run counted as activity
    finally:
        await kernels.aclose()


def test_no_kernels_is_known_and_a_stopped_server_is_unknown(tmp_path: Path) -> None:
    """A server of its own (the shared one may hold other tests' kernels), stopped after."""
    peer = start_jupyter(tmp_path)

    async def read() -> KernelsReading:
        return await read_once(source(peer.token_file), peer.pod())

    try:
        empty = asyncio.run(read())
    finally:
        stop_jupyter(peer)
    assert empty.known
    assert empty.kernels == []
    stopped = asyncio.run(read())
    assert not stopped.known
    assert stopped.error is not None
    assert "cannot connect" in stopped.error


@pytest.mark.parametrize("token", ["not-the-token", None])
async def test_a_refused_token_is_unknown_and_the_token_stays_out_of_the_error(
    jupyter_peer: JupyterPeer, tmp_path: Path, token: str | None
) -> None:
    token_file = None
    if token is not None:
        token_file = tmp_path / "token"
        token_file.write_text(token)
    reading = await read_once(source(token_file), jupyter_peer.pod())
    assert not reading.known
    assert reading.error is not None
    assert "HTTP 403" in reading.error
    assert "\n" not in reading.error
    assert "not-the-token" not in reading.error
    assert jupyter_peer.token not in reading.error


async def test_a_stopped_server_is_unknown(jupyter_peer: JupyterPeer) -> None:
    pod = jupyter_peer.pod()
    pod["spec"]["containers"][0]["ports"][0]["containerPort"] = free_port()  # nothing listens
    reading = await read_once(source(jupyter_peer.token_file), pod)
    assert not reading.known
    assert reading.error is not None
    assert "cannot connect" in reading.error
    assert "\n" not in reading.error


async def test_a_missing_token_file_is_unknown(jupyter_peer: JupyterPeer, tmp_path: Path) -> None:
    reading = await read_once(source(tmp_path / "absent"), jupyter_peer.pod())
    assert not reading.known
    assert reading.error is not None
    assert "token file" in reading.error


# -- servers that answer, but not with a kernel list ------------------------------------


@pytest_asyncio.fixture
async def odd_server() -> AsyncIterator[str]:
    """An HTTP server whose `/<case>/api/kernels` answers each wrong way; yields its URL."""
    release = asyncio.Event()  # lets the slow answer end at teardown

    async def handle(request: web.Request) -> web.StreamResponse:
        case = request.match_info["case"]
        if case == "html":
            return web.Response(text="<html>sign in</html>", content_type="text/html")
        if case == "object":
            return web.json_response({"kernels": []})
        if case == "bad-item":
            return web.json_response([{"id": "k1", "execution_state": "idle", "connections": -1}])
        if case == "scalars":
            return web.json_response(["k1"])
        if case == "error":
            return web.Response(status=503, text="upstream connect error")
        if case == "redirect":
            raise web.HTTPFound("/hub/login")
        if case == "slow":
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(release.wait(), 5)  # past the source's timeout
        return web.json_response([])

    app = web.Application()
    app.router.add_get("/{case}/api/kernels", handle)
    async with served(app) as url:
        yield url
        release.set()


def annotated(url: str) -> dict[str, Any]:
    return {
        "metadata": {
            "namespace": "user-bob",
            "name": "nb-bob",
            "annotations": {"nodeward.io/jupyter-url": url},
        },
        "status": {"podIP": "10.0.0.9"},
    }


@pytest.mark.parametrize(
    ("case", "says"),
    [
        ("html", "not JSON (text/html"),
        ("object", "not a kernel list: expected a list of kernels, got dict"),
        ("bad-item", "not a kernel list: kernel 0: connections"),
        ("scalars", "not a kernel list: kernel 0 is a str"),
        ("error", "HTTP 503"),
        ("redirect", "HTTP 302"),
        ("slow", "no answer within 0.3s"),
    ],
)
async def test_an_answer_that_is_not_a_kernel_list_is_unknown(
    odd_server: str, case: str, says: str
) -> None:
    # Only the slow case is about the timeout: the others have time for a loaded machine.
    reading = await read_once(
        source(None, timeout="0.3s" if case == "slow" else "10s"), annotated(f"{odd_server}/{case}")
    )
    assert not reading.known
    assert reading.kernels is None
    assert reading.error is not None
    assert says in reading.error
    assert f"{odd_server}/{case}/api/kernels" in reading.error
    assert "\n" not in reading.error


async def test_the_odd_server_does_answer_a_valid_empty_list(odd_server: str) -> None:
    """The control: the same server's valid answer is known (so the cases above are real)."""
    reading = await read_once(source(None), annotated(f"{odd_server}/valid"))
    assert reading.known
    assert reading.kernels == []
