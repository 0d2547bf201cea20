"""Real peers for the notifier tests: an SMTP server (aiosmtpd), Alertmanager, an HTTP receiver,
and a way to run the notifier against them with its own consumer and topic."""

from __future__ import annotations

import shutil
import subprocess
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from email import message_from_bytes
from email.message import Message
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword

from nodeward.bus import Bus
from nodeward.bus.server import free_port
from nodeward.config import Settings
from nodeward.daemon import Daemon
from schemas import Event, make_event
from schemas.common import ObjectRef
from schemas.notify import Notification, Severity
from services.notifier.service import build
from sim.cluster.tls import make_serving_cert
from tests.conftest import wait_for
from tests.helpers.net import served, terminate

SMTP_USER, SMTP_PASSWORD = "nodeward", "s3cret-smtp-pw"


@dataclass
class Mail:
    sender: str
    recipients: list[str]
    message: Message

    @property
    def subject(self) -> str:
        return str(self.message["Subject"])

    @property
    def body(self) -> str:
        part = self.message.get_payload(decode=True)
        assert isinstance(part, bytes)
        return part.decode().replace("\r\n", "\n")


class _Keeper:
    def __init__(self) -> None:
        self.mails: list[Mail] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        self.mails.append(
            Mail(envelope.mail_from, list(envelope.rcpt_tos), message_from_bytes(envelope.content))
        )
        return "250 OK"


@dataclass
class SmtpServer:
    port: int
    ca_file: Path
    mails: list[Mail]
    logins: list[str]

    def channel(self, **more: Any) -> dict[str, Any]:
        """An email channel to this server, signing in as SMTP_USER (`more`: its password,
        sender, recipients...)."""
        base = {
            "type": "email",
            "port": self.port,
            "tls_ca_file": str(self.ca_file),
            "username": SMTP_USER,
        }
        return base | more


@pytest.fixture
def smtp_server(tmp_path: Path) -> Iterator[SmtpServer]:
    """aiosmtpd on a free port that requires STARTTLS (a self-signed CA) and AUTH."""
    cert = make_serving_cert("127.0.0.1")
    ca_file = tmp_path / "smtp-ca.pem"
    ca_file.write_bytes(cert.ca_pem)
    keeper = _Keeper()
    logins: list[str] = []

    def authenticate(server: Any, session: Any, envelope: Any, mechanism: str, auth: Any) -> Any:
        ok = (
            isinstance(auth, LoginPassword)
            and auth.login.decode() == SMTP_USER
            and auth.password.decode() == SMTP_PASSWORD
        )
        if ok:
            logins.append(auth.login.decode())
        return AuthResult(success=ok)

    port = free_port()
    controller = Controller(
        keeper,
        hostname="127.0.0.1",
        port=port,
        tls_context=cert.ssl_context(),
        require_starttls=True,
        authenticator=authenticate,
        auth_required=True,
    )
    controller.start()
    yield SmtpServer(port, ca_file, keeper.mails, logins)
    controller.stop()


@dataclass
class Receiver:
    """A local HTTP server that keeps every JSON body POSTed to it, by path."""

    url: str
    posts: dict[str, list[Any]] = field(default_factory=dict)

    def at(self, path: str) -> list[Any]:
        return self.posts.setdefault(path, [])

    def chat(self, path: str = "/chat") -> dict[str, Any]:
        """A chat channel posting to `path` here."""
        return {"type": "chat", "url": f"{self.url}{path}"}

    def webhook(self, path: str) -> dict[str, Any]:
        """A JSON webhook channel posting to `path` here."""
        return {"type": "webhook", "url": f"{self.url}{path}"}


def oncall(*channels: str) -> list[dict[str, Any]]:
    """One route, `oncall`, taking every notice to `channels`."""
    return [{"name": "oncall", "channels": list(channels)}]


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    received = Receiver("")

    async def keep(request: web.Request) -> web.Response:
        received.at(request.path).append(await request.json())
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_post("/{tail:.*}", keep)
    async with served(app) as received.url:
        yield received


@pytest.fixture
async def alertmanager(tmp_path: Path) -> AsyncIterator[str]:
    """A real Alertmanager (Debian `prometheus-alertmanager`) on a free port; its URL."""
    binary = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
    if binary is None:
        pytest.skip("prometheus-alertmanager is not installed (scripts/system-deps.sh installs it)")
    config = tmp_path / "am.yml"
    config.write_text("route:\n  receiver: keep\n  group_wait: 1h\nreceivers:\n  - name: keep\n")
    port = free_port()
    log = (tmp_path / "am.log").open("w")
    proc = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.path={tmp_path / 'am-data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"

    async def ready() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"alertmanager exited: {(tmp_path / 'am.log').read_text()[-500:]}")
        try:
            async with httpx.AsyncClient() as client:
                return (await client.get(f"{url}/-/ready")).status_code == 200
        except httpx.HTTPError:
            return False

    try:
        await wait_for(ready, timeout=20, interval=0.1, what="alertmanager ready")
        yield url
    finally:
        await terminate(proc, 10)
        log.close()


@dataclass
class NotifierEnv:
    """Settings for one notifier with its own consumer, KV bucket and notify topic."""

    bus: Bus
    topic: str
    consumer: str
    outbox: Path
    settings: Settings
    daemons: list[Daemon] = field(default_factory=list)

    async def start(self) -> Daemon:
        daemon = await build(self.settings, outbox_dir=self.outbox)
        await daemon.start()
        self.daemons.append(daemon)

        async def ready() -> bool:  # its consumer bound: what a readiness probe waits for
            return (await daemon.readiness()).ready

        await wait_for(ready, timeout=10, what="the notifier ready")
        return daemon

    async def stop(self) -> None:
        for daemon in self.daemons:
            await daemon.stop()

    def notice(
        self,
        title: str,
        *,
        severity: Severity = Severity.CRITICAL,
        node: str | None = None,
        **fields: Any,
    ) -> Event[Notification]:
        targets = [ObjectRef(kind="Node", name=node, api_version="v1")] if node else []
        data = Notification(
            severity=severity, topic=self.topic, title=title, targets=targets, **fields
        )
        return make_event(data, source="test/notifier")

    async def publish(self, *events: Event[Any]) -> None:
        await self.bus.publish_many(list(events))

    async def first_chat(self, receiver: Receiver, event: Event[Any]) -> None:
        """`event` published and its chat message received."""
        await self.publish(event)
        await wait_for(lambda: receiver.at("/chat"), timeout=10, what="the first send")

    def outbox_files(self) -> list[Path]:
        return sorted(self.outbox.glob("*.txt")) if self.outbox.exists() else []

    @property
    def consumers(self) -> list[str]:
        """Its durable consumers: critical notices have their own."""
        return [self.consumer + "-critical", self.consumer]

    async def settled(self) -> bool:
        """Everything published to this topic has been delivered and acked."""
        for consumer in self.consumers:
            info = await self.bus.js.consumer_info("NOTIFY", consumer)
            if (info.num_pending or 0) != 0 or (info.num_ack_pending or 0) != 0:
                return False
        return True

    def metric(self, name: str, **labels: str) -> float:
        registry = self.daemons[-1].metrics.registry
        return float(registry.get_sample_value(name, labels) or 0.0)


EnvFactory = Callable[..., Awaitable[NotifierEnv]]
# As the shipped routes: users' notices to their owners, everything else to on-call.
DEFAULT_ROUTES = [
    {"name": "users", "match": {"audience": ["user"]}, "to_owner": True, "channels": ["outbox"]},
    {"name": "all", "channels": ["outbox"]},
]


@pytest.fixture
async def notifier_env(bus: Bus, nats_url: str, tmp_path: Path) -> AsyncIterator[EnvFactory]:
    """`await notifier_env(channels={...}, routes=[...], **notifier_settings)`."""
    made: list[NotifierEnv] = []

    async def make(
        *,
        channels: dict[str, Any] | None = None,
        routes: list[dict[str, Any]] | None = None,
        cluster: dict[str, Any] | None = None,
        **notifier: Any,
    ) -> NotifierEnv:
        uid = uuid.uuid4().hex[:8]
        topic = f"t-{uid}"
        routes_file = tmp_path / f"routes-{uid}.yaml"
        import yaml

        routes_file.write_text(yaml.safe_dump({"routes": routes or DEFAULT_ROUTES}))
        service: dict[str, Any] = {
            "consumer": f"notifier-{uid}",
            "bucket": f"notifier-{uid}",
            "subjects": [f"notify.*.{topic}"],
            "routes_file": str(routes_file),
            "channels": channels or {"outbox": {"type": "outbox"}},
            "grouping": {"group_wait": "0.2s", "group_interval": "0s", "dedup_window": "10m"},
            "rate_limit": {"per_hour": 100000, "burst": 1000},
            "retry": {"attempts": 3, "initial": "0.05s", "max": "0.2s", "timeout": "3s"},
            "owner_lookup": cluster is not None,
        } | notifier
        settings = Settings(
            bus={"url": nats_url, "publish_timeout": "2s"},
            cluster=cluster or {},
            daemon={"shutdown_timeout": "4s"},
            services={"notifier": service},
        )
        made.append(
            NotifierEnv(bus, topic, service["consumer"], tmp_path / f"outbox-{uid}", settings)
        )
        return made[-1]

    yield make
    for env in made:
        await env.stop()


@pytest.fixture
async def chat_env(notifier_env: EnvFactory, receiver: Receiver) -> NotifierEnv:
    """A notifier, not started yet, whose one route (oncall) posts to the receiver's /chat."""
    return await notifier_env(channels={"chat": receiver.chat()}, routes=oncall("chat"))
