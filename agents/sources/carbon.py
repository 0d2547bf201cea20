"""Carbon intensity for CO2e: a static value or a live provider, cached, never failing.

Providers: Electricity Maps (`auth-token`, lifecycle by default), RTE éCO2mix through the
ODRÉ open-data API (`taux_co2`, France, operational) and the UK Carbon Intensity API
(NESO, national, operational). `CarbonSource.current()` reuses a good reading for
`refresh`; when the provider fails it returns the last good value marked stale with its
age until `stale_after`, then the configured static value.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import ClassVar, Literal, Protocol, TypeVar

import httpx
import structlog
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError

from nodeward.aio import within
from nodeward.config import Section
from nodeward.durations import Duration
from schemas.energy import CarbonBasis, CarbonIntensity

log = structlog.get_logger(__name__)

J_PER_KWH = 3.6e6
# After a failure the provider is asked again this often at most (or every `refresh`).
RETRY_AFTER = timedelta(seconds=60)


def co2e_grams(energy_j: float, g_per_kwh: float) -> float:
    """CO2e in grams of `energy_j` joules at `g_per_kwh` (gCO2e per kWh)."""
    return energy_j / J_PER_KWH * g_per_kwh


class ProviderError(Exception):
    """A provider that gave no usable reading; `str()` is one line, never the token."""


class CarbonProvider(Protocol):
    name: str

    async def fetch(self) -> CarbonIntensity:
        """The provider's latest reading; raises `ProviderError`."""
        ...


def _utcnow() -> datetime:
    return datetime.now(UTC)


async def _get_json(
    http: httpx.AsyncClient,
    name: str,
    url: str,
    *,
    params: dict[str, str | int] | None = None,
    headers: dict[str, str] | None = None,
    timeout: float,
) -> object:
    """GET `url` as JSON; every failure becomes a one-line `ProviderError`."""
    try:
        response = await http.get(url, params=params, headers=headers, timeout=timeout)
    except httpx.TimeoutException:
        raise ProviderError(f"{name}: no answer within {timeout:g}s from {url}") from None
    except httpx.HTTPError as exc:
        raise ProviderError(f"{name}: cannot reach {url}: {type(exc).__name__} {exc}") from None
    if response.status_code in (401, 403):
        raise ProviderError(
            f"{name}: {url} refused the credentials (HTTP {response.status_code}); "
            "check the auth token"
        )
    if response.status_code != 200:
        raise ProviderError(f"{name}: {url} answered HTTP {response.status_code}")
    try:
        return response.json()
    except ValueError:
        raise ProviderError(f"{name}: {url} answered something that is not JSON") from None


class CarbonSettings(Section):
    """Where carbon intensity comes from. Whatever fails, `static_g_per_kwh` is the floor."""

    provider: Literal["static", "electricitymaps", "rte-eco2mix", "uk-neso"] = "static"
    static_g_per_kwh: float = Field(default=0.0, ge=0)
    static_basis: Literal["lifecycle", "operational"] = "operational"
    zone: str = "FR"
    """Electricity Maps zone / label for others"""
    url: str | None = None
    """override the provider's base URL"""
    token: SecretStr | None = None
    """Electricity Maps auth-token"""
    token_file: Path | None = None
    refresh: Duration = timedelta(minutes=15)
    """how long a reading is reused"""
    stale_after: Duration = timedelta(hours=2)
    """a failed provider's last value is used (marked stale) this long, then static"""
    timeout: Duration = timedelta(seconds=10)


M = TypeVar("M", bound=BaseModel)


def _parse(name: str, model: type[M], data: object) -> M:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        raise ProviderError(f"{name}: unexpected response ({where}: {first['msg']})") from None


class _EmLatest(BaseModel):
    """Electricity Maps `GET /v3/carbon-intensity/latest`."""

    model_config = ConfigDict(extra="ignore")
    zone: str
    carbon_intensity: float = Field(alias="carbonIntensity", ge=0)
    observed: datetime = Field(alias="datetime")
    emission_factor_type: Literal["lifecycle", "direct"] = Field(
        default="lifecycle", alias="emissionFactorType"
    )
    is_estimated: bool = Field(default=False, alias="isEstimated")


class _HttpProvider:
    """A provider read with one GET of `PATH` from its `BASE` URL (or the configured one)."""

    name: str
    BASE: ClassVar[str]
    PATH: ClassVar[str]

    def __init__(self, http: httpx.AsyncClient, *, base: str | None, timeout: float) -> None:
        self.http, self.timeout = http, timeout
        self.url = f"{(base or self.BASE).rstrip('/')}{self.PATH}"

    async def _get(
        self,
        *,
        params: dict[str, str | int] | None = None,
        headers: dict[str, str] | None = None,
    ) -> object:
        return await _get_json(
            self.http, self.name, self.url, params=params, headers=headers, timeout=self.timeout
        )


class ElectricityMaps(_HttpProvider):
    """Electricity Maps' latest carbon intensity for a zone (header `auth-token`)."""

    name = "electricitymaps"
    BASE = "https://api.electricitymap.org"
    PATH = "/v3/carbon-intensity/latest"

    def __init__(
        self,
        http: httpx.AsyncClient,
        zone: str,
        token: str | None,
        *,
        base: str | None,
        timeout: float,
    ) -> None:
        super().__init__(http, base=base, timeout=timeout)
        self.zone, self._token = zone, token

    async def fetch(self) -> CarbonIntensity:
        if not self._token:
            raise ProviderError(f"{self.name}: no auth token configured (token or token_file)")
        data = await self._get(params={"zone": self.zone}, headers={"auth-token": self._token})
        em = _parse(self.name, _EmLatest, data)
        return CarbonIntensity(
            g_per_kwh=em.carbon_intensity,
            zone=em.zone,
            provider=self.name,
            # "direct" counts only combustion at the plant: the operational basis.
            basis=CarbonBasis.LIFECYCLE
            if em.emission_factor_type == "lifecycle"
            else CarbonBasis.OPERATIONAL,
            estimated=em.is_estimated,
            observed_at=em.observed,
        )


class _OdreRecord(BaseModel):
    model_config = ConfigDict(extra="ignore")
    date_heure: datetime
    taux_co2: float | None = Field(default=None, ge=0)


class _OdreRecords(BaseModel):
    """ODRÉ (Opendatasoft) explore v2.1 `records` answer."""

    model_config = ConfigDict(extra="ignore")
    results: list[_OdreRecord]


class RteEco2mix(_HttpProvider):
    """RTE éCO2mix national real-time `taux_co2` (gCO2/kWh, production-based) via ODRÉ."""

    name = "rte-eco2mix"
    BASE = "https://odre.opendatasoft.com"
    PATH = "/api/explore/v2.1/catalog/datasets/eco2mix-national-tr/records"

    async def fetch(self) -> CarbonIntensity:
        # The real-time dataset carries rows without taux_co2 yet: ask for filled ones,
        # and skip empty ones anyway.
        data = await self._get(
            params={
                "select": "date_heure,taux_co2",
                "where": "taux_co2 >= 0",
                "order_by": "date_heure desc",
                "limit": 4,
            }
        )
        records = _parse(self.name, _OdreRecords, data).results
        latest = next((r for r in records if r.taux_co2 is not None), None)
        if latest is None or latest.taux_co2 is None:
            raise ProviderError(f"{self.name}: no record with taux_co2 in the answer")
        return CarbonIntensity(
            g_per_kwh=latest.taux_co2,
            zone="FR",
            provider=self.name,
            basis=CarbonBasis.OPERATIONAL,
            observed_at=latest.date_heure,
        )


class _UkIntensity(BaseModel):
    forecast: float | None = Field(default=None, ge=0)
    actual: float | None = Field(default=None, ge=0)


class _UkPeriod(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    start: datetime = Field(alias="from")
    intensity: _UkIntensity


class _UkAnswer(BaseModel):
    data: list[_UkPeriod] = Field(min_length=1)


class UkNeso(_HttpProvider):
    """The UK Carbon Intensity API's current half-hour (national; `actual`, else forecast)."""

    name = "uk-neso"
    BASE = "https://api.carbonintensity.org.uk"
    PATH = "/intensity"

    async def fetch(self) -> CarbonIntensity:
        data = await self._get()
        period = _parse(self.name, _UkAnswer, data).data[0]
        value = period.intensity.actual
        estimated = value is None  # `actual` is null until the half-hour closes
        if value is None:
            value = period.intensity.forecast
        if value is None:
            raise ProviderError(f"{self.name}: neither actual nor forecast intensity given")
        return CarbonIntensity(
            g_per_kwh=value,
            zone="GB",
            provider=self.name,
            basis=CarbonBasis.OPERATIONAL,
            estimated=estimated,
            observed_at=period.start,
        )


def _token(settings: CarbonSettings) -> str | None:
    if settings.token_file is not None:
        try:
            return settings.token_file.read_text().strip() or None
        except OSError as exc:
            log.error(
                "carbon: cannot read the token file",
                path=str(settings.token_file),
                error=exc.strerror,
            )
            return None
    return settings.token.get_secret_value() if settings.token else None


def provider_for(settings: CarbonSettings, http: httpx.AsyncClient) -> CarbonProvider | None:
    """The live provider the settings name; None for `static`."""
    timeout = settings.timeout.total_seconds()
    if settings.provider == "electricitymaps":
        return ElectricityMaps(
            http, settings.zone, _token(settings), base=settings.url, timeout=timeout
        )
    if settings.provider == "rte-eco2mix":
        return RteEco2mix(http, base=settings.url, timeout=timeout)
    if settings.provider == "uk-neso":
        return UkNeso(http, base=settings.url, timeout=timeout)
    return None


class CarbonSource:
    """The carbon intensity to use now. `current()` never raises.

    `clock` (monotonic seconds) times the cache and staleness; `wall` stamps static values.
    `last_error` holds the provider's latest failure (one line) until it answers again.
    """

    def __init__(
        self,
        settings: CarbonSettings,
        http: httpx.AsyncClient,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = _utcnow,
    ) -> None:
        self.settings = settings
        self.provider = provider_for(settings, http)
        self._clock, self._wall = clock, wall
        self._good: CarbonIntensity | None = None
        self._good_at = 0.0
        self._retry_at: float | None = None
        self._asking = asyncio.Lock()  # one provider request at a time
        self.last_error: str | None = None

    def static(self) -> CarbonIntensity:
        """The configured floor value."""
        return CarbonIntensity(
            g_per_kwh=self.settings.static_g_per_kwh,
            zone=self.settings.zone,
            provider="static",
            basis=CarbonBasis(self.settings.static_basis),
            observed_at=self._wall(),
        )

    async def current(self) -> CarbonIntensity:
        """A fresh or cached reading; on failure the last good one (stale), then static."""
        if self.provider is None:
            return self.static()
        async with self._asking:
            return await self._current(self.provider)

    async def _current(self, provider: CarbonProvider) -> CarbonIntensity:
        now = self._clock()
        if self._good is not None and now - self._good_at < self.settings.refresh.total_seconds():
            return self._good
        if self._retry_at is not None and now < self._retry_at:
            return self._fallback(now)
        try:
            reading = await within(provider.fetch(), self.settings.timeout.total_seconds() + 1)
        except ProviderError as exc:
            return self._failed(now, str(exc))
        except TimeoutError:
            return self._failed(now, f"{provider.name}: no answer in time")
        except Exception as exc:  # noqa: BLE001 - carbon data must never stop energy events
            return self._failed(now, f"{provider.name}: {type(exc).__name__}: {exc}")
        if self.last_error is not None:
            log.info("carbon: provider answers again", provider=provider.name)
        self._good, self._good_at = reading, now
        self._retry_at, self.last_error = None, None
        return reading

    def _failed(self, now: float, why: str) -> CarbonIntensity:
        self.last_error = why
        retry = min(self.settings.refresh, RETRY_AFTER).total_seconds()
        self._retry_at = now + retry
        fallback = self._fallback(now)
        log.warning(
            "carbon: provider failed; using "
            + ("the last good value (stale)" if fallback.stale else "the static value"),
            error=why,
            retry_in_s=retry,
        )
        return fallback

    def _fallback(self, now: float) -> CarbonIntensity:
        if self._good is not None:
            age = now - self._good_at
            if age <= self.settings.stale_after.total_seconds():
                return self._good.model_copy(update={"stale": True, "age_s": age})
        return self.static()
