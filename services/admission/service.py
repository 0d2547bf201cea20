"""services.admission: the mutating admission webhook's daemon.

Its cluster cache (`cache`) is fed by two watches, namespaces and credential Secrets'
metadata, run as the daemon's tasks; its HTTPS server (`server`) answers reviews from that
cache alone; `/readyz` is 503 until both first lists are in (`synced`). It consumes and
publishes nothing on the bus: the daemon's bus connection is the runtime's, for health.

Under `nodeward up` without `tls_cert_file`, a CA and a certificate for 127.0.0.1 and
localhost are made in the state dir (`admission/`), the webhook listens on a free loopback
port, and `endpoints.json` says where (`admission_url`) and which CA to trust
(`admission_ca_file`).
"""

from __future__ import annotations

from pathlib import Path

from nodeward import certs
from nodeward.config import ConfigError
from nodeward.daemon import Daemon
from nodeward.handlers import Runtime, Service
from nodeward.platform import Component, Standalone, UpContext
from services.admission.access import ACCESS
from services.admission.cache import ClusterCache
from services.admission.server import AdmissionServer, ServerError
from services.admission.settings import AdmissionSettings

NAME = "admission"

app = Service(NAME, settings=AdmissionSettings, access=ACCESS)


class Admission:
    """The cache and the server of one webhook daemon."""

    def __init__(
        self, rt: Runtime[AdmissionSettings], cache: ClusterCache, server: AdmissionServer
    ) -> None:
        self.cluster = rt.acting
        self.cache = cache
        self.server = server

    @app.task("namespaces")
    async def namespaces(self) -> None:
        await self.cache.feed_namespaces(self.cluster)

    @app.task("credential-secrets")
    async def secrets(self) -> None:
        await self.cache.feed_secrets(self.cluster)

    @app.ready("synced")
    def synced(self) -> bool:
        return self.cache.synced


@app.setup
async def setup(rt: Runtime[AdmissionSettings]) -> Admission:
    """The webhook listening (TLS loaded) and its cache's watches declared as tasks."""
    cache = ClusterCache()
    try:
        server = AdmissionServer(rt.config, cache, registry=rt.daemon.metrics.registry)
        await server.start()
    except ServerError as exc:
        raise ConfigError(f"services.{NAME}: {exc}") from None
    rt.daemon.add_shutdown_hook(server.stop)
    return Admission(rt, cache, server)


def up_certificate(state_dir: Path) -> tuple[Path, Path, Path]:
    """(CA, certificate, key) files for a loopback webhook, made once in `state_dir`."""
    where = state_dir / NAME
    ca_file, cert_file, key_file = where / "ca.pem", where / "tls.crt", where / "tls.key"
    if not (ca_file.exists() and cert_file.exists() and key_file.exists()):
        ca = certs.authority("nodeward admission CA")
        certs.serving(ca, ["127.0.0.1", "localhost"], cert_file, key_file)
        ca_file.write_bytes(ca.pem)
    return ca_file, cert_file, key_file


async def _build_for_up(context: UpContext) -> list[Daemon]:
    settings = context.settings_for(NAME)
    raw = dict(settings.services.get(NAME) or {})
    ca_file: Path | None = None
    if "tls_cert_file" not in raw:
        ca_file, cert_file, key_file = up_certificate(context.state_dir)
        raw |= {"tls_cert_file": str(cert_file), "tls_key_file": str(key_file)}
        raw.setdefault("host", "127.0.0.1")
        raw.setdefault("port", 0)
    settings = settings.model_copy(update={"services": {**settings.services, NAME: raw}})
    built = await app.assemble(settings, up=context)
    context.endpoints["admission_url"] = built.service.server.url
    if ca_file is not None:
        context.endpoints["admission_ca_file"] = str(ca_file)
    return [built.daemon]


component = Component(NAME, _build_for_up)
standalone = Standalone(app.build)
