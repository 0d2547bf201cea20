"""The console alone (`nodeward console`), in a real browser: a 5,000-node fleet seeded
straight onto a nats-server paints in under 3 s; off loopback it answers 401 without its
token, and the token (bearer header, or `?token=` once, then a cookie) opens it."""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import pytest

from nodeward.bus import Bus
from nodeward.bus.server import EmbeddedNats, free_port
from nodeward.config import BusSettings
from schemas.base import make_event
from schemas.gpu import GpuHealth, HealthState
from tests.browser import browser, screenshot
from tests.conftest import REPO
from tests.e2e.test_cli import NODEWARD, run, wait_until

pytestmark = [pytest.mark.timeout(240), pytest.mark.xdist_group("console")]

NODES = 5000
GPUS = 8
FAILED_EVERY = 97
"""Every 97th node has GPU 3 failed."""
MODELS = ("NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB")


FIRST_PAINT = """new Promise(done => new PerformanceObserver(list => {
  for (const e of list.getEntries()) if (e.name === "first-contentful-paint") done(e.startTime);
}).observe({type: "paint", buffered: true}))"""
"""Milliseconds from the navigation's start to the first contentful paint."""


def _name(i: int) -> str:
    return f"gpu-{i:05d}"


async def _seed(url: str) -> None:
    """Each node's GPU health as its agent would have published it, straight onto the bus."""
    bus = await Bus.connect(BusSettings(url=url), source="test/seed")
    try:
        now = datetime.now(UTC)
        batch = []
        for i in range(NODES):
            for g in range(GPUS):
                failed = i % FAILED_EVERY == 0 and g == 3
                health = GpuHealth(
                    node=_name(i),
                    gpu_index=g,
                    gpu_uuid=f"GPU-{i:05d}-{g}",
                    model=MODELS[i % 2],
                    state=HealthState.FAILED if failed else HealthState.HEALTHY,
                    observed_at=now,
                    heartbeat=not failed,
                )
                batch.append(make_event(health, source=f"agent/gpu/{_name(i)}"))
                if len(batch) == 2000:
                    await bus.publish_many(batch, timeout=30)
                    batch = []
        if batch:
            await bus.publish_many(batch, timeout=30)
    finally:
        await bus.close(grace=2)


@pytest.fixture(scope="module")
def big_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    server = EmbeddedNats(tmp_path_factory.mktemp("nats-5000"))
    asyncio.run(server.start())
    try:
        began = time.monotonic()
        asyncio.run(_seed(server.url))
        print(f"seeded {NODES} nodes x {GPUS} GPUs in {time.monotonic() - began:.1f}s")
        yield server.url
    finally:
        asyncio.run(server.stop())


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], str]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, dict(answer.headers), answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read().decode()


@contextmanager
def console(tmp: Path, nats: str, *args: str) -> Iterator[subprocess.Popen[str]]:
    """`nodeward console` in a subprocess, stopped with SIGTERM at the end."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NODEWARD_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    log = (tmp / "console.log").open("w")
    proc = subprocess.Popen(
        [*NODEWARD, "console", "--nats", nats, *args],
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=tmp,
        env=env,
    )
    try:
        yield proc
    finally:
        proc.terminate()
        code = proc.wait(timeout=30)
        log.close()
        assert code == 0, (tmp / "console.log").read_text()[-2000:]


def _up(url: str, headers: dict[str, str] | None = None) -> bool:
    try:
        return _get(url, headers)[0] == 200
    except OSError:
        return False


def test_a_5000_node_fleet_paints_in_under_3s(big_fleet: str, tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    with console(tmp_path, big_fleet, "--port", str(port)), browser() as chromium:
        wait_until(lambda: _up(url), timeout=90, what="the console's first read of 5,000 nodes")
        page = chromium.new_page(viewport={"width": 1280, "height": 900})
        began = time.monotonic()
        page.goto(url, wait_until="load")
        loaded = time.monotonic() - began
        paint = page.evaluate(FIRST_PAINT)
        print(f"console: {NODES} nodes, first contentful paint {paint:.0f} ms, load {loaded:.2f}s")
        assert paint < 3000 and loaded < 3
        assert page.locator("#shown").inner_text() == str(NODES)
        assert page.locator("[data-node]").count() == NODES  # every node has its cell
        failed = [_name(i) for i in range(0, NODES, FAILED_EVERY)]
        for name in failed[:5]:
            assert page.locator(f"[id='g:{name}:3']").get_attribute("data-state") == "failed"
        screenshot(page, tmp_path, "fleet-5000")
        page.goto(url + "?state=failed", wait_until="load")
        assert page.locator("a.node").count() == len(failed)
        assert page.locator("#shown").inner_text() == str(len(failed))
        screenshot(page, tmp_path, "fleet-5000-failed")
    log = (tmp_path / "console.log").read_text()
    read = next(line for line in log.splitlines() if "console.read" in line)
    print(f"console: its first read {read}")


def test_off_loopback_it_answers_401_without_the_token(nats_url: str, tmp_path: Path) -> None:
    refused = run("console", "--nats", nats_url, "--host", "0.0.0.0", "--port", "0")
    assert refused.returncode == 1
    assert refused.stderr.strip().endswith(
        "needs services.console.token_file (viewers then send the token)"
    )
    assert len(refused.stderr.strip().splitlines()) == 1
    token = "console-test-token-0123456789"
    (tmp_path / "token").write_text(token + "\n")
    port = free_port("0.0.0.0")
    url = f"http://127.0.0.1:{port}/"
    args = ("--host", "0.0.0.0", "--port", str(port), "--token-file", str(tmp_path / "token"))
    with console(tmp_path, nats_url, *args), browser() as chromium:
        bearer = {"Authorization": f"Bearer {token}"}
        wait_until(lambda: _up(url, bearer), timeout=60, what="the console")
        for path in ("", "node/x", "actions", "events", "static/console.js"):
            status, headers, body = _get(url + path)
            assert status == 401, path
            assert headers["WWW-Authenticate"].startswith("Bearer")
            assert token not in body
        assert _get(url, {"Authorization": "Bearer wrong-token-0123456789"})[0] == 401
        status, headers, body = _get(url, bearer)
        assert status == 200 and "Content-Security-Policy" in headers and token not in body

        page = chromium.new_page()
        answer = page.goto(url + "security", wait_until="domcontentloaded")
        assert answer is not None and answer.status == 401
        answer = page.goto(url + f"security?token={token}", wait_until="domcontentloaded")
        assert answer is not None and answer.status == 200
        assert page.url == url + "security"  # the token is out of the address bar
        assert token not in page.content()
        page.locator("body[data-live=on]").wait_for(timeout=5000)  # the stream, by cookie
        cookie = next(c for c in page.context.cookies() if c["name"] == "nodeward_console")
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
        screenshot(page, tmp_path, "security-token")


async def test_under_its_nats_user_it_reads_live_and_writes_nothing(tmp_path: Path) -> None:
    """The chart's console user on a nats-server with the chart's authorization: the picture
    is read and kept live, and a KV write or an event from that user is refused."""
    from nodeward.bus.errors import BusError
    from services.console.service import assemble
    from tests.conftest import wait_for
    from tests.helpers.console_user import console_user

    async with console_user(tmp_path) as (writer, settings):
        cordon = await writer.js.create_key_value(bucket="cordon")
        assembled = await assemble(settings)
        daemon, live = assembled.daemon, assembled.live
        await daemon.start()
        try:
            await wait_for(live.ready.is_set, timeout=20, what="the first read")
            import httpx

            async with httpx.AsyncClient() as client:
                metrics = (await client.get(f"{daemon.url}/metrics", timeout=5)).text
                ready = await client.get(f"{daemon.url}/readyz", timeout=5)
            assert ready.status_code == 200
            assert "nodeward_console_viewers 0.0" in metrics
            assert "nodeward_console_read_seconds " in metrics
            health = GpuHealth.example().model_copy(update={"node": "gpu-perm-01"})
            failed = health.model_copy(update={"state": HealthState.FAILED})
            await writer.publish(make_event(failed, source="agent/gpu/gpu-perm-01"))
            node = await wait_for(
                lambda: live.nodes.get("gpu-perm-01"), timeout=10, what="the node, live"
            )
            assert node.health == "failed"
            await cordon.put("node.gpu-perm-01", b"{}")  # a KV change reaches it as well
            reader_settings = BusSettings.model_validate(
                settings.bus.model_dump()
                | {"provision": False, "publish_timeout": "1s", "publish_retries": 0}
            )
            reader = await Bus.connect(reader_settings, source="test/console-user")
            try:
                with pytest.raises(BusError):
                    await reader.publish(make_event(health, source="agent/gpu/gpu-perm-01"))
                with pytest.raises(Exception):  # noqa: B017 - any refusal will do
                    await reader.js.publish("$KV.cordon.node.forged", b"{}", timeout=1)
            finally:
                await reader.close(grace=1)
            with pytest.raises(Exception):  # noqa: B017 - not found
                await cordon.get("node.forged")
        finally:
            await daemon.stop()
