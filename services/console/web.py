"""The console's HTTP server: server-rendered pages, one event stream, a token off loopback.

Every page is drawn from the shared picture (`Live`); the event stream sends each viewer the
picture's changes. Every response carries a strict Content-Security-Policy: scripts and
styles come only from `static/` on this server (no inline script, no `eval`), nothing is
framed, nothing is fetched elsewhere. Templates autoescape every value, so what an event
says (a Falco alert's `output` is written by whoever ran the process) is shown as text, and
the script writes updates with `textContent` only.
"""

from __future__ import annotations

import contextlib
import hmac
import time
from collections import defaultdict
from datetime import UTC, datetime
from importlib.resources import files
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import structlog
from aiohttp import web
from jinja2 import Environment, PackageLoader, select_autoescape
from pydantic import ValidationError

from nodeward.aio import within
from nodeward.bus.snapshot import Reads
from nodeward.daemon import listen, local_url
from nodeward.durations import format_age
from nodeward.fleet_status import GpuSeen, actions_on
from schemas import DecodeError, decode
from schemas.gpu import GpuHealth, GpuXid
from schemas.tokens import token
from services.console import pages
from services.console.history import Trends
from services.console.live import Live, marks_of
from services.console.settings import ConsoleSettings, loopback
from services.console.trends import Range, RangeError, range_named

COOKIE = "nodeward_console"
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
PING_S = 15.0
LIVE: web.AppKey[Live] = web.AppKey("live", Live)


class ConsoleError(ValueError):
    """The console cannot start as configured (one line)."""


def read_token(path: Path) -> str:
    try:
        token = path.read_text().strip()
    except OSError as exc:
        raise ConsoleError(f"cannot read the console token file {path}: {exc.strerror}") from None
    if len(token) < 16:
        raise ConsoleError(f"the console token in {path} is shorter than 16 characters")
    return token


def check(settings: ConsoleSettings) -> str | None:
    """The viewers' token, if any; ConsoleError when the console may not start so."""
    token = read_token(settings.token_file) if settings.token_file else None
    if token is None and not loopback(settings.host):
        raise ConsoleError(
            f"the console binds {settings.host}, off loopback: it needs "
            "services.console.token_file (viewers then send the token)"
        )
    return token


def _age(value: datetime | None, now: datetime) -> str:
    if value is None:
        return "-"
    return format_age((now - value).total_seconds())


def _clock(value: datetime | None) -> str:
    return "-" if value is None else value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


async def gpu_said(reads: Reads, node: str) -> tuple[list[GpuHealth], list[GpuXid]]:
    """What the bus last said of each GPU of `node`: its last change (`gpu.health`, with the
    pods holding it: the console's mirror has it) and its last XID (one last-per-subject
    read of the GPU stream), newest first; nothing when it cannot be read now (the page is
    drawn without them)."""
    tok = token(node)
    try:
        stored = [
            *(await reads.last("GPU", [f"gpu.health.{tok}.>"]) or []),
            *(await reads.last("GPU", [f"gpu.xid.{tok}.>"]) or []),
        ]
    except Exception:  # noqa: BLE001 - the page is drawn without them
        return [], []
    changes: list[GpuHealth] = []
    xids: list[GpuXid] = []
    for m in stored:
        try:
            data = decode(m.subject, m.headers, m.data).data
        except (DecodeError, ValidationError, ValueError):
            continue
        if isinstance(data, GpuHealth) and data.node == node:
            changes.append(data)
        elif isinstance(data, GpuXid) and data.node == node:
            xids.append(data)
    return changes, sorted(xids, key=lambda x: x.observed_at, reverse=True)


def environment() -> Environment:
    env = Environment(
        loader=PackageLoader("services.console", "templates"),
        autoescape=select_autoescape(default=True, default_for_string=True),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["clock"] = _clock
    return env


class Console:
    """The aiohttp application around one `Live` picture."""

    def __init__(self, live: Live, settings: ConsoleSettings, token: str | None) -> None:
        self.live = live
        self.settings = settings
        self.token = token
        self.env = environment()
        self.trends = Trends(live.nc, settings)
        """The one reader of stored history for every viewer's trends."""
        self.log = structlog.get_logger().bind(component="console")
        self._runner: web.AppRunner | None = None
        self._port: int | None = None

    # -- the application ------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._guard])
        app[LIVE] = self.live
        app.on_response_prepare.append(_secure)
        r = app.router
        r.add_get("/", self.fleet)
        r.add_get("/node/{name}", self.node)
        r.add_get("/actions", self.actions)
        r.add_get("/security", self.security)
        r.add_get("/capacity", self.capacity)
        r.add_get("/energy", self.energy)
        r.add_get("/sessions", self.sessions)
        r.add_get("/events", self.events)
        r.add_get("/favicon.ico", _no_icon)
        r.add_static("/static/", Path(str(files("services.console") / "static")))
        return app

    async def start(self) -> None:
        self._runner, self._port = await listen(
            self.app(),
            self.settings.host,
            self.settings.port,
            lambda why: ConsoleError(f"the console {why}"),
        )
        self.log.info("console.listening", url=self.url, token=self.token is not None)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        await self.trends.stop()

    @property
    def url(self) -> str:
        if self._port is None:
            raise ConsoleError("the console is not started")
        return f"{local_url(self.settings.host, self._port)}/"

    # -- who may look ---------------------------------------------------------------------

    def _offered(self, request: web.Request) -> str | None:
        scheme, _, value = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
        return request.cookies.get(COOKIE)

    def _good(self, offered: str | None) -> bool:
        assert self.token is not None
        return offered is not None and hmac.compare_digest(offered.encode(), self.token.encode())

    @web.middleware
    async def _guard(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """Without a token configured (loopback only) anyone local may look; with one, a
        bearer header or the cookie set from `?token=` (then the URL is cleaned of it)."""
        if self.token is None:
            return await handler(request)  # type: ignore[no-any-return]
        given = request.query.get("token")
        if given is not None and self._good(given):
            rest = {k: v for k, v in request.query.items() if k != "token"}
            # Relative, so it holds behind a proxy that serves the console under a prefix.
            to = "./" + request.path.rsplit("/", 1)[-1] + (f"?{urlencode(rest)}" if rest else "")
            found = web.HTTPSeeOther(to)
            secure = request.secure or request.headers.get("X-Forwarded-Proto") == "https"
            found.set_cookie(COOKIE, given, httponly=True, samesite="Strict", secure=secure)
            return found
        if not self._good(self._offered(request)):
            return web.Response(
                status=401,
                text="401: this console needs its token: Authorization: Bearer <token>, "
                "or open it once with ?token=<token>\n",
                headers={"WWW-Authenticate": 'Bearer realm="nodeward-console"'},
            )
        return await handler(request)  # type: ignore[no-any-return]

    # -- pages ----------------------------------------------------------------------------

    async def _picture(self) -> None:
        if not self.live.ready.is_set():
            await within(self.live.ready.wait(), 30)

    def _page(
        self, request: web.Request, template: str, *, status: int = 200, **context: Any
    ) -> web.Response:
        depth = request.path.count("/") - 1
        now = datetime.now(UTC)
        fleet = self.live.fleet
        body = self.env.get_template(template).render(
            root="../" * depth,
            path=request.path,
            now=now,
            age=lambda t: _age(t, now),
            until=lambda t: format_age((t - now).total_seconds()),
            read_at=self.live.read_at,
            breaker=fleet.breaker if fleet else None,
            dlq_total=sum(fleet.dlq.values()) if fleet else 0,
            **context,
        )
        return web.Response(text=body, status=status, content_type="text/html", charset="utf-8")

    async def fleet(self, request: web.Request) -> web.Response:
        await self._picture()
        q = request.query
        state = q.get("state", "all")
        page = pages.fleet_page(
            self.live.nodes.values(),
            self.live.models,
            query=q.get("q", ""),
            state=state if state in pages.STATE_FILTERS else "all",
            model=q.get("model", ""),
            detail_limit=self.settings.detail_limit,
        )
        return self._page(
            request,
            "fleet.html",
            page=page,
            q=q.get("q", ""),
            state=state,
            model=q.get("model", ""),
            states=pages.STATE_FILTERS,
            rows=self.live.fleet.rows if self.live.fleet is not None else [],
        )

    async def node(self, request: web.Request) -> web.Response:
        await self._picture()
        name = request.match_info["name"]
        node = self.live.nodes.get(name)
        if node is None:
            return self._page(request, "missing.html", name=name, status=404)
        health: dict[str, GpuHealth | GpuSeen] = {
            key: h for key in node.gpus if (h := self.live.health.get((name, key))) is not None
        }
        changes, xids = await gpu_said(self.live.mirrors, name)
        energy = [p for p in self.live.pods_energy if p.node == name]
        actions = actions_on(node, self.live.actions)
        return self._page(
            request,
            "node.html",
            node=node,
            model=self.live.model(name),
            gpus=pages.gpu_rows(node, health, changes, xids),
            escalation=pages.escalation(node, actions),
            marks=marks_of(node),
            actions=actions[:100],
            pods_energy=sorted(energy, key=lambda p: (p.namespace, p.pod)),
            xids=xids,
        )

    async def actions(self, request: web.Request) -> web.Response:
        await self._picture()
        q = request.query
        f = pages.ActionFilter(
            action=q.get("action", ""),
            outcome=q.get("outcome", ""),
            actor=q.get("actor", ""),
            text=q.get("q", ""),
        )
        kinds, outcomes = pages.choices(self.live.actions)
        fleet = self.live.fleet
        return self._page(
            request,
            "actions.html",
            f=f,
            rows=pages.filtered_actions(self.live.actions, f, 300),
            kinds=kinds,
            outcomes=outcomes,
            dlq=fleet.dlq if fleet else {},
            dead=list(self.live.dead),
        )

    async def security(self, request: web.Request) -> web.Response:
        await self._picture()
        nodes = list(self.live.nodes.values())
        isolated = sorted((i for n in nodes for i in n.part("isolated") or []), key=lambda i: i.pod)
        marked = [(n, m) for n in nodes for m in n.marks if m.owner == "falco"]
        return self._page(
            request,
            "security.html",
            isolated=isolated,
            marked=marked,
            alerts=list(self.live.alerts),
        )

    async def capacity(self, request: web.Request) -> web.Response:
        rng = _range(request)
        await self._picture()
        snap = self.live.capacity
        held = await self.trends.get("capacity", rng)
        return self._page(
            request,
            "capacity.html",
            snapshot=snap,
            totals=snap.totals() if snap else [],
            held=[n for n in snap.nodes if n.blocked] if snap else [],
            trend=pages.capacity_trend(held, time.time()),
        )

    async def energy(self, request: web.Request) -> web.Response:
        rng = _range(request)
        await self._picture()
        nodes = [n for n in self.live.nodes.values() if n.energy is not None]
        power = [(n.name, n.energy.avg_power_w or 0.0) for n in nodes if n.energy]
        co2 = [(n.name, n.energy.co2e_total_g or 0.0) for n in nodes if n.energy]
        ns_power: dict[str, float] = defaultdict(float)
        ns_co2: dict[str, float] = defaultdict(float)
        for p in self.live.pods_energy:
            span = (p.interval.end - p.interval.start).total_seconds()
            if span > 0:
                ns_power[p.namespace] += p.energy_j / span
            ns_co2[p.namespace] += p.co2e_g or 0.0
        return self._page(
            request,
            "energy.html",
            power=pages.bars(sorted(power, key=lambda kv: -kv[1])[:40], unit="W"),
            co2=pages.bars(sorted(co2, key=lambda kv: -kv[1])[:40], unit="g"),
            ns_power=pages.bars(list(ns_power.items()), unit="W"),
            ns_co2=pages.bars(list(ns_co2.items()), unit="g"),
            nodes=len(nodes),
            trend=pages.energy_trend(await self.trends.get("energy", rng), time.time()),
        )

    async def sessions(self, request: web.Request) -> web.Response:
        rng = _range(request)
        await self._picture()
        held = await self.trends.get("sessions", rng)
        return self._page(
            request,
            "sessions.html",
            sessions=pages.sessions(self.live.nodes.values()),
            trend=pages.sessions_trend(held, time.time()),
        )

    # -- live -----------------------------------------------------------------------------

    async def events(self, request: web.Request) -> web.StreamResponse:
        """Server-Sent Events: each change of the picture as one JSON `data:` line."""
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "X-Accel-Buffering": "no"}
        )
        await response.prepare(request)
        viewer = self.live.join()
        try:
            await response.write(b"retry: 2000\n: live\n\n")
            while not viewer.dropped.is_set():
                try:
                    text = await within(viewer.queue.get(), PING_S)
                except TimeoutError:
                    await response.write(b": ping\n\n")
                    continue
                await response.write(f"data: {text}\n\n".encode())
        except ConnectionResetError:
            pass  # the viewer went away
        finally:
            self.live.leave(viewer)
        with contextlib.suppress(Exception):
            await response.write_eof()
        return response


def _range(request: web.Request) -> Range:
    """The page's `?range=` (the last hour when absent); anything else is a 400, in one line."""
    try:
        return range_named(request.query.get("range"))
    except RangeError as exc:
        raise web.HTTPBadRequest(text=f"400: {exc}\n") from None


async def _no_icon(request: web.Request) -> web.Response:
    return web.Response(status=204)


async def _secure(request: web.Request, response: web.StreamResponse) -> None:
    for name, value in HEADERS.items():
        response.headers.setdefault(name, value)
