"""Helpers for the credentials tests: a real MIT KDC (k5test), the authlib OAuth2 server
(`sim.oauth2`), the sim cluster, the service, Secrets written and read as a workload would,
and a check that no credential leaked."""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import subprocess
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from nodeward.bus import Bus
from nodeward.config import Settings
from nodeward.daemon import Daemon
from nodeward.kube import Cluster
from nodeward.kube.base import core
from nodeward.kube.client import KubeClient
from schemas.credentials import CredentialFailed, CredentialRenewed
from schemas.notify import Notification
from schemas.remediation import Remediation
from services.credentials.secret import LABEL
from services.credentials.service import build
from sim.cluster import SimCluster
from sim.cluster.seed import Seed
from sim.kerberos import KDC_BINARIES, free_port_base
from sim.oauth2 import IdP, serve
from tests.conftest import wait_for
from tests.integration.cordon_fixtures import read_stream
from tests.integration.simkube import fast_admin_client, service_settings, stop_env


@pytest.fixture(scope="module")
def kdc() -> Iterator[Any]:
    """A running MIT KDC realm (k5test): user@KRBTEST.COM, host/localhost in its keytab,
    renewable tickets up to one hour."""
    missing = [
        b for b in KDC_BINARIES if not shutil.which(b, path=os.environ["PATH"] + ":/usr/sbin")
    ]
    if missing:
        pytest.skip(f"MIT Kerberos not installed (no {', '.join(missing)}): scripts/system-deps.sh")
    for module in ("krb5", "gssapi"):  # the `kerberos` extra, built against libkrb5-dev
        pytest.importorskip(module, reason=f"{module} not built: pip install 'nodeward[kerberos]'")
    k5test = pytest.importorskip("k5test")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PATH", os.environ["PATH"] + ":/usr/sbin")  # krb5kdc, kdb5_util
        realm = k5test.K5Realm(
            portbase=free_port_base(),
            kdc_conf={"realms": {"$realm": {"max_renewable_life": "1h", "max_life": "1h"}}},
            krb5_conf={"libdefaults": {"renew_lifetime": "1h"}},
        )
        try:
            yield realm
        finally:
            realm.stop()


@pytest.fixture
def oauth2_idp() -> Iterator[IdP]:
    """A running authlib authorization server; access tokens live 3 s unless changed."""
    served = serve(expires_in=3)
    yield served.idp
    served.stop()


def kinit(realm: Any, path: Path, *, life: str, renew: str | None) -> bytes:
    """A ticket cache for user@REALM, as `kinit` in a notebook makes it."""
    flags = ["-c", f"FILE:{path}", "-l", life] + (["-r", renew] if renew else [])
    realm.kinit(realm.user_princ, password=realm.password("user"), flags=flags)
    return path.read_bytes()


def authenticates(realm: Any, ccache: bytes, tmp: Path) -> str:
    """What a workload does with the mounted ticket: a GSSAPI context to host/localhost,
    accepted with the service's keytab. Returns the authenticated principal."""
    import gssapi

    path = tmp / f"workload-{uuid.uuid4().hex[:6]}"
    path.write_bytes(ccache)
    try:
        creds = gssapi.Credentials(usage="initiate", store={b"ccache": f"FILE:{path}".encode()})
        target = gssapi.Name(f"host@{realm.hostname}", gssapi.NameType.hostbased_service)
        client = gssapi.SecurityContext(name=target, creds=creds, usage="initiate")
        server_creds = gssapi.Credentials(
            usage="accept", store={b"keytab": f"FILE:{realm.keytab}".encode()}
        )
        server = gssapi.SecurityContext(creds=server_creds, usage="accept")
        server.step(client.step())
        assert server.complete
        return str(server.initiator_name)
    finally:
        path.unlink(missing_ok=True)


@dataclass
class CredsEnv:
    sim: SimCluster
    admin: Cluster
    client: KubeClient
    bus: Bus
    ns: str
    settings: Settings
    tmp: Path
    daemons: list[Daemon] = field(default_factory=list)

    def scans(self) -> float:
        """Scheduler passes completed so far, over every replica of this env."""
        return sum(
            d.metrics.registry.get_sample_value("nodeward_credential_scans_total") or 0.0
            for d in self.daemons
        )

    async def more_scans(self, n: int, timeout: float = 15.0) -> None:
        """Wait until the scheduler (whichever replica leads) has scanned `n` more times."""
        target = self.scans() + n
        await wait_for(lambda: self.scans() >= target, timeout=timeout, what=f"{n} more scans")

    async def start(self, **overrides: Any) -> Daemon:
        settings = self.settings
        if overrides:
            services = dict(settings.services)
            services["credentials"] = {**services["credentials"], **overrides}
            settings = settings.model_copy(update={"services": services})
        daemon = await build(settings)
        await daemon.start()
        self.daemons.append(daemon)
        return daemon

    @property
    def lease(self) -> str:
        return str(self.settings.services["credentials"]["lease"])

    async def consumer_idle(self) -> bool:
        """True once the renewers have acked every due event published so far."""
        consumer = self.settings.services["credentials"]["consumer"]
        info = await self.bus.js.consumer_info("CREDENTIALS", consumer)
        return info.num_pending == 0 and info.num_ack_pending == 0

    async def stop_all(self) -> None:
        for daemon in list(self.daemons):
            await daemon.stop()
            self.daemons.remove(daemon)

    async def put_secret(
        self,
        name: str,
        kind: str | None,
        data: dict[str, bytes],
        annotations: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": name,
                "namespace": self.ns,
                "labels": {LABEL: kind} if kind else {},
                "annotations": annotations or {},
            },
            "type": "Opaque",
            "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
        }
        result: dict[str, Any] = await self.client.request(
            "POST", core("secrets", namespace=self.ns), body=body
        )
        return result

    async def secret(self, name: str) -> dict[str, Any]:
        return await self.admin.secrets.get(self.ns, name)

    async def data(self, name: str) -> dict[str, bytes]:
        raw = (await self.secret(name)).get("data") or {}
        return {k: base64.b64decode(v) for k, v in raw.items()}

    async def annotations(self, name: str) -> dict[str, str]:
        return dict((await self.secret(name))["metadata"].get("annotations") or {})

    async def renewed(self, name: str) -> list[CredentialRenewed]:
        events = await read_stream(self.bus, "CREDENTIALS", f"credentials.renewed.{self.ns}.{name}")
        return [e.data for e in events]

    async def failed(self, name: str) -> list[CredentialFailed]:
        events = await read_stream(self.bus, "CREDENTIALS", f"credentials.failed.{self.ns}.{name}")
        return [e.data for e in events]

    async def user_notices(self, name: str) -> list[Notification]:
        events = await read_stream(self.bus, "NOTIFY", "notify.*.credentials")
        return [e.data for e in events if e.data.audience == f"user:{self.ns}/{name}"]

    async def oncall_notices(self, name: str) -> list[Notification]:
        events = await read_stream(self.bus, "NOTIFY", "notify.*.credentials")
        return [
            e.data
            for e in events
            if e.data.audience in (None, "oncall")
            and any(t.name == name and t.namespace == self.ns for t in e.data.targets)
        ]

    async def audits(self) -> list[Remediation]:
        events = await read_stream(self.bus, "AUDIT", "remediation.renew.>")
        return [e.data for e in events if e.data.target.namespace == self.ns]

    async def leaked(self, values: list[bytes], logs: str) -> list[str]:
        """Where any of `values` (raw or base64) shows up: the captured logs, or the
        credentials, audit and notification streams."""
        texts = {"logs": logs}
        for stream, subject in (
            ("CREDENTIALS", f"credentials.*.{self.ns}.>"),
            ("AUDIT", "remediation.>"),
            ("NOTIFY", "notify.>"),
        ):
            # Broad reads of streams other tests share: one may store bad input on purpose
            # (the notifier's DLQ test leaves a notice without a title in NOTIFY).
            events = await read_stream(self.bus, stream, subject, skip_invalid=True)
            texts[stream] = "\n".join(e.model_dump_json() for e in events)
        found = []
        for value in values:
            needles = {base64.b64encode(value).decode()}
            with contextlib.suppress(UnicodeDecodeError):
                needles.add(value.decode())
            for where, text in texts.items():
                if any(len(n) >= 8 and n in text for n in needles):
                    found.append(where)
        return found


EnvFactory = Callable[..., Awaitable[CredsEnv]]


@pytest.fixture
async def creds_env(
    bus: Bus, nats_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[EnvFactory]:
    """`await creds_env(krb5_config=..., ...)`: a fresh sim cluster and the service's settings."""
    made: list[CredsEnv] = []

    async def make(**service: Any) -> CredsEnv:
        uid = uuid.uuid4().hex[:8]
        ns = f"user-{uid}"
        sim = SimCluster(Seed(namespaces=[ns, "nodeward"]), port=0, bookmark_interval=0.2)
        await sim.start()
        kubeconfig = sim.write_kubeconfig(
            tmp_path / f"kubeconfig-creds-{uid}", identity="credentials"
        )
        client = fast_admin_client(sim, tmp_path, uid)
        if service.get("krb5_config"):
            monkeypatch.setenv("KRB5_CONFIG", service["krb5_config"])
        config: dict[str, Any] = {
            "consumer": f"credentials-{uid}",
            "bucket": f"credentials-{uid}",
            "subjects": [f"credentials.due.{ns}.>"],
            "lease": f"credentials-{uid}",
            "scan_interval": "0.3s",
            "republish_after": "3s",
            "retry_delays": [0.3, 0.5, 1.0],
            "jitter": 0.0,
        } | service
        settings = service_settings(nats_url, kubeconfig, "credentials", config)
        env = CredsEnv(sim, Cluster(client), client, bus, ns, settings, tmp_path)
        made.append(env)
        return env

    yield make
    for env in made:
        await stop_env(env.daemons, env.sim, env.admin)


def run_quietly(args: list[str]) -> None:
    subprocess.run(args, check=True, capture_output=True, timeout=30)
