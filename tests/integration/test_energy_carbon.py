"""Carbon intensity providers against a local HTTP server speaking each provider's format.

The server answers as the real APIs do (bodies modelled on their documented answers);
`Peer.mode` switches it to garbage, slow or 401 answers. Staleness is driven by a hand
clock, never by sleeping.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
from aiohttp import web

from agents.sources.carbon import CarbonSettings, CarbonSource, co2e_grams
from nodeward.bus.server import free_port
from schemas.energy import CarbonBasis
from tests.helpers.net import served

TOKEN = "em-secret-token-123"
WALL = datetime(2026, 11, 29, 21, 0, tzinfo=UTC)

EM_LATEST = {
    "zone": "FR",
    "carbonIntensity": 32,
    "datetime": "2026-11-29T20:00:00.000Z",
    "updatedAt": "2026-11-29T20:41:07.617Z",
    "createdAt": "2026-11-26T20:46:11.417Z",
    "emissionFactorType": "lifecycle",
    "isEstimated": True,
    "estimationMethod": "TIME_SLICER_AVERAGE",
    "temporalGranularity": "hourly",
}
ODRE_RECORDS = {
    "total_count": 3,
    "results": [
        # the real-time dataset has rows not filled in yet
        {"date_heure": "2026-11-29T20:45:00+00:00", "taux_co2": None},
        {"date_heure": "2026-11-29T20:30:00+00:00", "taux_co2": 27},
        {"date_heure": "2026-11-29T20:15:00+00:00", "taux_co2": 28},
    ],
}
UK_INTENSITY = {
    "data": [
        {
            "from": "2026-11-29T20:30Z",
            "to": "2026-11-29T21:00Z",
            "intensity": {"forecast": 181, "actual": None, "index": "moderate"},
        }
    ]
}


@dataclass
class Peer:
    """The fake provider's behaviour and what it was asked."""

    mode: str = "ok"  # ok | garbage | slow | unauthorized
    uk_actual: int | None = None
    requests: list[web.Request] = field(default_factory=list)


def _app(peer: Peer) -> web.Application:
    async def answer(request: web.Request, body: object) -> web.StreamResponse:
        peer.requests.append(request)
        if peer.mode == "garbage":
            return web.Response(text='{"zone": "FR", "carbonInt', content_type="application/json")
        if peer.mode == "slow":
            await asyncio.sleep(30)  # the peer hangs; the client's timeout must act
        if peer.mode == "unauthorized":
            return web.json_response({"message": "Invalid authentication"}, status=401)
        return web.json_response(body)

    async def em(request: web.Request) -> web.StreamResponse:
        if request.headers.get("auth-token") != TOKEN:
            peer.requests.append(request)
            return web.json_response({"message": "Invalid authentication"}, status=401)
        return await answer(request, {**EM_LATEST, "zone": request.query["zone"]})

    async def odre(request: web.Request) -> web.StreamResponse:
        return await answer(request, ODRE_RECORDS)

    async def uk(request: web.Request) -> web.StreamResponse:
        body = json.loads(json.dumps(UK_INTENSITY))
        body["data"][0]["intensity"]["actual"] = peer.uk_actual
        return await answer(request, body)

    app = web.Application()
    app.router.add_get("/v3/carbon-intensity/latest", em)
    app.router.add_get("/api/explore/v2.1/catalog/datasets/eco2mix-national-tr/records", odre)
    app.router.add_get("/intensity", uk)
    return app


@pytest_asyncio.fixture
async def provider() -> AsyncIterator[tuple[str, Peer]]:
    peer = Peer()
    async with served(_app(peer), shutdown_timeout=0.1) as url:
        yield url, peer


@pytest_asyncio.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as client:
        yield client


class Clock:
    def __init__(self) -> None:
        self.now = 500.0

    def __call__(self) -> float:
        return self.now


def settings(**kw: object) -> CarbonSettings:
    base: dict[str, object] = {
        "static_g_per_kwh": 50.0,
        "static_basis": "operational",
        "refresh": "15m",
        "stale_after": "2h",
        "timeout": "2s",
    }
    return CarbonSettings.model_validate({**base, **kw})


def source(cfg: CarbonSettings, http: httpx.AsyncClient, clock: Clock) -> CarbonSource:
    return CarbonSource(cfg, http, clock=clock, wall=lambda: WALL)


def clocked(http: httpx.AsyncClient, **cfg: object) -> tuple[CarbonSource, Clock]:
    """A source with `cfg`'s settings, and the clock it reads (the test moves it)."""
    clock = Clock()
    return source(settings(**cfg), http, clock), clock


def test_co2e_grams_hand_computed() -> None:
    assert co2e_grams(3.6e6, 50) == pytest.approx(50.0)  # 1 kWh at 50 g/kWh
    assert co2e_grams(840.0, 50) == pytest.approx(0.011666667)  # 420 W x 2 s
    assert co2e_grams(231000.0, 21) == pytest.approx(1.3475)  # the schema's example
    assert co2e_grams(0.0, 500) == 0.0


async def test_static(http: httpx.AsyncClient) -> None:
    ci = await source(settings(zone="CH"), http, Clock()).current()
    assert (ci.g_per_kwh, ci.provider, ci.basis, ci.zone) == (50.0, "static", "operational", "CH")
    assert ci.observed_at == WALL and not ci.stale


async def test_electricity_maps(provider: tuple[str, Peer], http: httpx.AsyncClient) -> None:
    url, peer = provider
    cfg = settings(provider="electricitymaps", url=url, zone="FR", token=TOKEN)
    ci = await source(cfg, http, Clock()).current()
    assert ci.g_per_kwh == 32 and ci.zone == "FR" and ci.provider == "electricitymaps"
    assert ci.basis is CarbonBasis.LIFECYCLE and ci.estimated and not ci.stale
    assert ci.observed_at == datetime(2026, 11, 29, 20, 0, tzinfo=UTC)
    (request,) = peer.requests
    assert request.headers["auth-token"] == TOKEN and request.query["zone"] == "FR"


async def test_electricity_maps_direct_is_operational(
    provider: tuple[str, Peer], http: httpx.AsyncClient, tmp_path: Path
) -> None:
    url, _ = provider
    EM_LATEST["emissionFactorType"] = "direct"
    try:
        token_file = tmp_path / "token"
        token_file.write_text(TOKEN + "\n")
        cfg = settings(provider="electricitymaps", url=url, token_file=str(token_file))
        ci = await source(cfg, http, Clock()).current()
    finally:
        EM_LATEST["emissionFactorType"] = "lifecycle"
    assert ci.basis is CarbonBasis.OPERATIONAL and ci.provider == "electricitymaps"


async def test_rte_eco2mix(provider: tuple[str, Peer], http: httpx.AsyncClient) -> None:
    url, peer = provider
    ci = await source(settings(provider="rte-eco2mix", url=url), http, Clock()).current()
    assert (ci.g_per_kwh, ci.zone, ci.provider, ci.basis) == (
        27,
        "FR",
        "rte-eco2mix",
        CarbonBasis.OPERATIONAL,
    )
    assert ci.observed_at == datetime(2026, 11, 29, 20, 30, tzinfo=UTC)
    assert peer.requests[0].query["order_by"] == "date_heure desc"


async def test_uk_neso_forecast_then_actual(
    provider: tuple[str, Peer], http: httpx.AsyncClient
) -> None:
    url, peer = provider
    src, clock = clocked(http, provider="uk-neso", url=url, refresh="30m")
    ci = await src.current()
    assert (ci.g_per_kwh, ci.zone, ci.basis, ci.estimated) == (181, "GB", "operational", True)
    assert ci.observed_at == datetime(2026, 11, 29, 20, 30, tzinfo=UTC)
    peer.uk_actual = 175
    clock.now += 29 * 60
    assert (await src.current()).g_per_kwh == 181  # cached for `refresh`
    assert len(peer.requests) == 1
    clock.now += 60
    ci = await src.current()
    assert (ci.g_per_kwh, ci.estimated) == (175, False)
    assert len(peer.requests) == 2


@pytest.mark.parametrize(
    ("mode", "why"),
    [
        ("garbage", "not JSON"),
        ("unauthorized", "refused the credentials (HTTP 401)"),
        ("slow", "no answer within 0.3s"),
    ],
)
async def test_failure_keeps_last_value_stale_then_static(
    provider: tuple[str, Peer],
    http: httpx.AsyncClient,
    capsys: pytest.CaptureFixture[str],
    mode: str,
    why: str,
) -> None:
    url, peer = provider
    clock = Clock()
    cfg = settings(provider="electricitymaps", url=url, token=TOKEN, timeout="300ms", refresh="10m")
    src = source(cfg, http, clock)
    good = await src.current()
    assert good.g_per_kwh == 32 and not good.stale

    peer.mode = mode
    clock.now += 11 * 60  # past refresh: the provider is asked and fails
    stale = await src.current()
    assert stale.stale and stale.age_s == pytest.approx(660.0)
    assert (stale.g_per_kwh, stale.provider, stale.basis) == (32, "electricitymaps", "lifecycle")
    assert src.last_error is not None and why in src.last_error
    assert "\n" not in src.last_error

    asked = len(peer.requests)
    clock.now += 30  # within the retry pause: not asked again, still stale
    assert (await src.current()).age_s == pytest.approx(690.0)
    assert len(peer.requests) == asked

    clock.now += 2 * 3600  # asked again, fails; the last good value is past stale_after
    fallback = await src.current()
    assert (fallback.g_per_kwh, fallback.provider, fallback.basis) == (
        50.0,
        "static",
        "operational",
    )
    assert not fallback.stale and fallback.observed_at == WALL

    peer.mode = "ok"
    clock.now += 61  # past the retry pause: the provider answers again
    back = await src.current()
    assert back.provider == "electricitymaps" and not back.stale and src.last_error is None

    out = capsys.readouterr()
    logged = out.out + out.err
    # one line per failed ask (none while paused): first stale, then static
    assert logged.count("carbon: provider failed; using the last good value (stale)") == 1
    assert logged.count("carbon: provider failed; using the static value") == 1
    assert why in logged
    assert TOKEN not in logged


async def test_outage_without_a_good_value_is_static(http: httpx.AsyncClient) -> None:
    cfg = settings(provider="uk-neso", url=f"http://127.0.0.1:{free_port()}")
    ci = await source(cfg, http, Clock()).current()
    assert ci.provider == "static" and ci.g_per_kwh == 50.0


async def test_outage_after_a_good_value_is_stale(
    provider: tuple[str, Peer], http: httpx.AsyncClient
) -> None:
    url, _ = provider
    src, clock = clocked(http, provider="rte-eco2mix", url=url, refresh="1m")
    assert (await src.current()).g_per_kwh == 27
    src.provider.url = src.provider.url.replace(url, f"http://127.0.0.1:{free_port()}")  # type: ignore[union-attr]
    clock.now += 120
    ci = await src.current()
    assert ci.stale and ci.age_s == pytest.approx(120.0) and ci.g_per_kwh == 27
    assert src.last_error is not None and "cannot reach" in src.last_error


async def test_missing_token_falls_back_without_calling(
    provider: tuple[str, Peer], http: httpx.AsyncClient
) -> None:
    url, peer = provider
    src = source(settings(provider="electricitymaps", url=url), http, Clock())
    ci = await src.current()
    assert ci.provider == "static" and peer.requests == []
    assert src.last_error == "electricitymaps: no auth token configured (token or token_file)"


async def test_stale_after_counts_from_the_fetch(
    provider: tuple[str, Peer], http: httpx.AsyncClient
) -> None:
    """Exactly at stale_after the last value is still used; just past it, static."""
    url, peer = provider
    clock = Clock()
    cfg = settings(provider="uk-neso", url=url, refresh="5m", stale_after="1h")
    src = source(cfg, http, clock)
    await src.current()
    peer.mode = "unauthorized"
    clock.now += timedelta(hours=1).total_seconds()
    assert (await src.current()).stale
    clock.now += 61
    assert (await src.current()).provider == "static"


async def test_concurrent_callers_share_one_request(
    provider: tuple[str, Peer], http: httpx.AsyncClient
) -> None:
    url, peer = provider
    src = source(settings(provider="rte-eco2mix", url=url), http, Clock())
    readings = await asyncio.gather(*(src.current() for _ in range(5)))
    assert {r.g_per_kwh for r in readings} == {27}
    assert len(peer.requests) == 1
