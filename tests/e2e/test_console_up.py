"""The console through `nodeward up`, in a real browser (Debian's Chromium via Playwright):
every seeded node listed, an XID 79 turning its GPU cell failed within 2 s without a reload
and the recovery clearing it, a Falco alert's hostile `output` shown as text with no script
run, and a screenshot of each view."""

from __future__ import annotations

import asyncio
import re
import statistics
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from sim.cluster.seed import load_seed
from tests.browser import browser, screenshot
from tests.e2e.platform import Up, running_up
from tests.e2e.test_cli import _inject, run, wait_until
from tests.integration.falco_fixtures import DROP_AND_EXECUTE, samples

pytestmark = [pytest.mark.timeout(240), pytest.mark.xdist_group("console-up")]

NODE = "gpu-h100-03"
HOSTILE = (
    "shell in container <script>window.pwned = 'script'; alert('script')</script> "
    "<img src=x onerror=\"window.pwned = 'img'; alert('img')\"> done"
)


def _request(nats: str, request: dict[str, object]) -> dict[str, object]:
    """What `nodeward sim inject` sends, from a thread of its own (Playwright's sync API holds
    this thread's event loop)."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, _inject(nats, NODE, request)).result(timeout=10)


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    with running_up(tmp_path_factory.mktemp("console"), "--scenario", "none", "--quiet") as u:
        yield u


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    with browser() as b:
        yield b


def test_up_announces_the_console_and_it_lists_every_seeded_node(
    up: Up, chromium: Any, tmp_path: Path
) -> None:
    url = up.endpoints["console_url"]
    assert url.startswith("http://127.0.0.1:")
    page = chromium.new_page()
    page.goto(url, wait_until="domcontentloaded")
    nodes = [n.name for n in load_seed(None).nodes]
    assert len(nodes) == 11  # with the AMD and the DRA nodes
    for name in nodes:
        cell = page.locator(f"[id='n:{name}']")
        cell.wait_for(timeout=5000)
        assert cell.locator("i.gpu[data-state=healthy]").count() >= 1, name
        assert cell.locator("i.gpu:not([data-state=healthy])").count() == 0, name
    assert page.locator("a.node").count() == len(nodes)
    page.locator("body[data-live=on]").wait_for(timeout=5000)
    screenshot(page, tmp_path, "fleet")
    out = "".join(up.output.err) + "".join(up.output.out)
    assert f"console     {url}" in out  # printed with the other endpoints


def test_an_xid_turns_the_cell_failed_within_2s_live_and_recovery_clears_it(
    up: Up, chromium: Any, tmp_path: Path
) -> None:
    page = chromium.new_page()
    page.goto(up.endpoints["console_url"], wait_until="domcontentloaded")
    page.locator("body[data-live=on]").wait_for(timeout=5000)
    page.evaluate("window.notReloaded = true")
    cell = page.locator(f"[id='g:{NODE}:0']")
    assert cell.get_attribute("data-state") == "healthy"
    nats = up.endpoints["nats_url"]
    injected = run("sim", "inject", "--node", NODE, "--gpu", "0", "--xid", "79", "--nats", nats)
    assert injected.returncode == 0, injected.stderr
    page.locator(f"[id='g:{NODE}:0'][data-state=failed]").wait_for(timeout=2000)
    assert page.evaluate("window.notReloaded") is True  # the same page: no reload
    assert page.locator(f"[id='n:{NODE}']").get_attribute("data-health") == "failed"
    assert page.locator("#count-failed").inner_text() == "1"  # the totals follow
    # The quarantine follows on the next read: the node's Q mark.
    page.locator(f"[id='n:{NODE}'] b.mark[data-mark=quarantined]").wait_for(timeout=10000)
    screenshot(page, tmp_path, "fleet-failed")
    detail = chromium.new_page()
    detail.goto(up.endpoints["console_url"] + f"node/{NODE}", wait_until="domcontentloaded")
    assert detail.locator(f"[id='g:{NODE}:0']").get_attribute("data-state") == "failed"
    detail.get_by_text("quarantine", exact=False).first.wait_for(timeout=5000)

    # The GPU's last XID: its gpu.xid.v1 waits up to `confirm_wait` for the kernel log's
    # sighting, so it may follow the failed state by a second; the page is drawn per load.
    def xid_listed() -> bool:
        if detail.locator("#xids").count():
            return True
        detail.reload(wait_until="domcontentloaded")
        return False

    wait_until(xid_listed, timeout=10, what="the XID table on the node page")
    assert "79" in detail.locator("#xids").inner_text()
    screenshot(detail, tmp_path, "node")

    recovered = run("sim", "inject", "--node", NODE, "--gpu", "0", "--recover", "--nats", nats)
    assert recovered.returncode == 0, recovered.stderr
    page.locator(f"[id='g:{NODE}:0'][data-state=healthy]").wait_for(timeout=5000)
    detail.locator(f"[id='g:{NODE}:0'][data-state=healthy]").wait_for(timeout=5000)
    # The demo profile releases the node 15 s after its GPUs are healthy: the mark goes, live.
    page.locator(f"[id='n:{NODE}'][data-marks='']").wait_for(timeout=30000)
    detail.locator(f"[id='n:{NODE}'][data-marks='']").wait_for(timeout=5000)
    assert page.locator(f"[id='n:{NODE}'] b.mark").count() == 0
    took = []
    for gpu in (1, 2, 3):  # the request `sim inject` sends, timed from before it is sent
        began = time.monotonic()
        reply = _request(nats, {"gpu": gpu, "xid": 79})
        assert reply.get("ok"), reply
        page.locator(f"[id='g:{NODE}:{gpu}'][data-state=failed]").wait_for(timeout=2000)
        took.append(time.monotonic() - began)
        _request(nats, {"gpu": gpu, "recover": True})
        page.locator(f"[id='g:{NODE}:{gpu}'][data-state=healthy]").wait_for(timeout=5000)
    print(f"console: fault to red cell, median {statistics.median(took):.3f}s of {took}")
    assert page.evaluate("window.notReloaded") is True


def _post(up: Up, alert: dict[str, Any]) -> None:
    """One alert to the Falco ingest, as Falco's http_output sends it."""
    token = Path(up.endpoints["falco_token_file"]).read_text().strip()
    answer = httpx.post(
        up.endpoints["falco_ingest_url"],
        json=alert,
        headers={"Authorization": f"Bearer {token}"},
        timeout=5,
    )
    assert answer.status_code == 200, answer.text


def test_a_hostile_falco_alert_renders_as_text_and_runs_nothing(
    up: Up, chromium: Any, tmp_path: Path
) -> None:
    page = chromium.new_page()
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.goto(up.endpoints["console_url"] + "security", wait_until="domcontentloaded")
    page.locator("body[data-live=on]").wait_for(timeout=5000)
    alert = next(a for a in samples() if a["rule"] == DROP_AND_EXECUTE)
    alert = {**alert, "rule": "Console escaping check", "output": HOSTILE, "priority": "Notice"}
    _post(up, alert)
    live_row = page.locator("#alerts td.output", has_text="window.pwned")
    live_row.first.wait_for(timeout=5000)  # arrived over the event stream
    assert "<script>" in live_row.first.inner_text()
    assert "<img src=x onerror=" in live_row.first.inner_text()
    page.reload(wait_until="domcontentloaded")  # and as the server renders it
    drawn = page.locator("#alerts td.output", has_text="window.pwned").first
    drawn.wait_for(timeout=5000)
    assert drawn.inner_text() == HOSTILE
    assert page.locator("#alerts script, #alerts img").count() == 0
    assert page.evaluate("window.pwned") is None
    assert dialogs == []
    screenshot(page, tmp_path, "security")


def test_the_other_views_render(up: Up, chromium: Any, tmp_path: Path) -> None:
    page = chromium.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    base = up.endpoints["console_url"]
    for view, expect in (
        ("actions", "#actions"),
        ("capacity", "h1"),
        ("energy", "h1"),
        ("sessions", "h1"),
    ):
        answer = page.goto(base + view, wait_until="domcontentloaded")
        assert answer is not None and answer.status == 200, view
        page.locator(expect).first.wait_for(timeout=5000)
        page.locator("body[data-live=on]").wait_for(timeout=5000)
        screenshot(page, tmp_path, view)
        if view == "actions" and page.locator("#actions tbody tr").count():
            # The time and the target were wrapped over three lines each.
            styles = page.evaluate(
                "[1, 3].map(i => getComputedStyle("
                "document.querySelector(`#actions tbody td:nth-child(${i})`)).whiteSpace)"
            )
            assert styles == ["nowrap", "nowrap"], styles
    assert errors == []  # no CSP violation, no script error


def test_a_node_page_says_its_energy_in_one_clean_line(up: Up, tmp_path: Path) -> None:
    """The node page read `kg CO2e in all· 50 g/kWh` and, beside an energy table of pods,
    `No pod nodeward watches`."""
    url = up.endpoints["console_url"] + "node/gpu-h100-02"

    def energy() -> str | None:
        page = httpx.get(url, timeout=5).text
        line = next((x for x in page.splitlines() if "W over the last" in x), None)
        return line

    wait_until(lambda: energy() is not None, timeout=60, what="the node's energy on its page")
    line = energy()
    assert line is not None
    assert re.search(r"\d+ W over the last \d+ s · [\d.]+ kg CO2e in all · \d+ g/kWh", line), line
    page = httpx.get(url, timeout=5).text
    assert "No pod nodeward watches" not in page


def test_an_isolation_shows_live_and_a_repeated_alert_once(
    up: Up, chromium: Any, tmp_path: Path
) -> None:
    """Isolations arriving live did not reach the Security page's isolated pods until a
    reload, and an alert sent again (Falcosidekick and the ingest) showed once per send."""
    page = chromium.new_page()
    page.goto(up.endpoints["console_url"] + "security", wait_until="domcontentloaded")
    page.locator("body[data-live=on]").wait_for(timeout=5000)
    alert = next(a for a in samples() if a["rule"] == DROP_AND_EXECUTE)
    pod = f"{alert['output_fields']['k8s.ns.name']}/{alert['output_fields']['k8s.pod.name']}"
    assert page.locator(f"#isolated tr[data-pod='{pod}']").count() == 0
    for _ in range(3):  # the same alert three times: stored once (its stable id)
        _post(up, alert)
    page.locator(f"#isolated tr[data-pod='{pod}']").wait_for(timeout=20000)  # no reload
    shown = page.locator("#alerts tr", has_text=alert["rule"])
    shown.first.wait_for(timeout=5000)
    assert shown.count() == 1, shown.count()
    screenshot(page, tmp_path, "security-live")


ESCALATED = "gpu-h100-02"
HOLDER = "ml-nlp/llm-pretrain-worker-0"
"""The seed's pod on every GPU of `ESCALATED`."""


def test_an_escalated_node_says_so_at_the_top_and_its_gpus_name_their_pods(
    up: Up, chromium: Any, tmp_path: Path
) -> None:
    """The node page of a node recovery gave up on did not say so at the top, and its GPU
    table's pods column was empty while "Last XID" named the pod (the heartbeats restating
    each GPU's state name no pods)."""
    nats = up.endpoints["nats_url"]
    page = chromium.new_page(viewport={"width": 1280, "height": 900})
    url = up.endpoints["console_url"] + f"node/{ESCALATED}"
    page.goto(url, wait_until="domcontentloaded")
    page.locator("body[data-live=on]").wait_for(timeout=30000)
    assert page.locator("#escalated").count() == 0
    # XID 64 starts a reset; the row-remap failure that follows is the catalog's RMA.
    injected = run(
        "sim", "inject", "--node", ESCALATED, "--gpu", "1", "--fault", "row-remap-failure",
        "--nats", nats,
    )  # fmt: skip
    assert injected.returncode == 0, injected.stderr
    # The open page says so as the escalation arrives; drawn again, it has the banner.
    page.locator("#banner:not([hidden])", has_text="needs a human").wait_for(timeout=60000)

    def drawn() -> bool:
        page.reload(wait_until="domcontentloaded")
        return bool(page.locator("#escalated").count() == 1 and page.locator("#xids").count())

    wait_until(drawn, timeout=30, what="the escalation and the XID on the node page")
    banner = page.locator("#escalated")
    assert page.evaluate("document.querySelector('main').firstElementChild.id") == "escalated"
    top = banner.bounding_box()
    assert top is not None and top["y"] < 120, top  # under the header, above the fold
    said = " ".join(banner.inner_text().split())
    assert f"{ESCALATED} needs a human: RMA suggested for GPU 1" in said, said
    assert re.search(r"Recovery gave up \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC \(\d+s ago\)", said)
    assert "row remapping failed" in said and "needs a human:" not in said.split("ago")[1]
    assert f'nodeward quarantine release {ESCALATED} --reason "GPU 1 replaced"' in said
    assert "stays quarantined" in said
    # The last XID names the pod; so does the GPU's row, and every GPU's the pod holds.
    assert HOLDER in page.locator("#xids tbody tr").first.inner_text()
    pods = page.locator("tr[data-gpu] td.pods").all_inner_texts()
    assert len(pods) == 8 and all(p == HOLDER for p in pods), pods
    screenshot(page, tmp_path, "node-escalated")

    # Released by an operator, the node no longer says it needs a human.
    released = run("quarantine", "release", ESCALATED, "--reason", "GPU 1 replaced", "--nats", nats)
    assert released.returncode == 0, released.stderr

    def gone() -> bool:
        page.goto(url, wait_until="domcontentloaded")
        return not page.locator("#escalated").count()

    wait_until(gone, timeout=30, what="the banner gone after the release")


async def _publish_failed(nats: str, error: str) -> None:
    from nodeward.bus import Bus
    from nodeward.config import BusSettings
    from schemas.base import make_event
    from schemas.credentials import CredentialFailed, CredentialKind

    bus = await Bus.connect(BusSettings(url=nats, provision=False), source="test/credentials")
    try:
        failed = CredentialFailed(
            namespace="ml-escape",
            secret="eve-oauth",
            kind=CredentialKind.OAUTH2,
            error=error,
            retryable=False,
        )
        await bus.publish(make_event(failed, source="service/credentials"))
    finally:
        await bus.close(grace=2)


def test_a_service_views_rows_show_live_on_the_fleet_page_as_text(
    up: Up, chromium: Any, tmp_path: Path
) -> None:
    """The credentials service's view (`services/credentials/view.py`): a failed renewal
    joins its `credentials` rows on the open fleet page over the event stream, its hostile
    error shown as text, and again as the server draws it."""
    page = chromium.new_page()
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.goto(up.endpoints["console_url"], wait_until="domcontentloaded")
    page.locator("body[data-live=on]").wait_for(timeout=5000)
    with ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, _publish_failed(up.endpoints["nats_url"], HOSTILE)).result(10)
    failed = page.locator("#fleet-rows li[data-severity=critical]", has_text="ml-escape/eve-oauth")
    failed.first.wait_for(timeout=10000)  # arrived over the event stream
    assert failed.first.inner_text().endswith(HOSTILE)
    assert "1 failed" in page.locator("#fleet-rows").inner_text()
    page.reload(wait_until="domcontentloaded")
    drawn = page.locator("#fleet-rows li", has_text="ml-escape/eve-oauth").first
    drawn.wait_for(timeout=5000)
    assert drawn.inner_text().endswith(HOSTILE)
    assert page.locator("#fleet-rows script, #fleet-rows img").count() == 0
    assert page.evaluate("window.pwned") is None
    assert dialogs == []
    screenshot(page, tmp_path, "fleet-rows")
