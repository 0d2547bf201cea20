"""Helpers for the Falco response tests: the sample alerts' pods in a sim cluster, the
service with its ingest, Falcosidekick-style publishing and read-back.

Every test gets its own namespaces (`user-bob-<uid>`) and rule names (`... <uid>`), so its
alerts have subjects and audit subjects of their own on the session's nats-server.
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from nodeward.bus import Bus
from nodeward.config import Settings
from nodeward.kube import Cluster
from schemas.remediation import Remediation
from schemas.tokens import token
from services.falco.service import Assembled, assemble
from services.falco.settings import FalcoSettings
from sim.cluster import SimCluster
from sim.cluster.seed import NodeSeed
from sim.falco_samples import (
    DROP_AND_EXECUTE,
    NODE,
    sample_seed,
    samples,
    sidekick_subject,
)
from tests.integration.cordon_fixtures import read_stream
from tests.integration.simkube import fast_admin_client, service_settings

TOKEN = "test-token-0123456789abcdef"


@dataclass
class FalcoEnv:
    uid: str
    sim: SimCluster
    admin: Cluster
    bus: Bus
    settings: Settings
    token_file: Path
    running: list[Assembled] = field(default_factory=list)

    def ns(self, base: str) -> str:
        return f"{base}-{self.uid}"

    def alert(self, rule: str, **fields: Any) -> dict[str, Any]:
        """The sample alert of `rule`, in this test's namespaces, rule renamed `<rule> <uid>`;
        `fields` replace output_fields (a key with None sets it to null)."""
        found = next(a for a in samples() if a["rule"] == rule)
        return self.retarget(found, **fields)

    def retarget(self, raw: dict[str, Any], **fields: Any) -> dict[str, Any]:
        alert = copy.deepcopy(raw)
        out = alert["output_fields"]
        if out.get("k8s.ns.name"):
            old = out["k8s.ns.name"]
            out["k8s.ns.name"] = self.ns(old)
            alert["output"] = alert["output"].replace(
                f"k8s_ns_name={old}", f"k8s_ns_name={self.ns(old)}"
            )
        alert["rule"] = f"{alert['rule']} {self.uid}"
        for key, value in fields.items():
            out[key.replace("__", ".")] = value
        return alert

    def every_sample(self) -> list[dict[str, Any]]:
        return [self.retarget(a) for a in samples()]

    async def start(self, **overrides: Any) -> Assembled:
        settings = self.settings
        if overrides:
            service = {**settings.services["falco"], **overrides}
            settings = settings.model_copy(update={"services": {"falco": service}})
        assembled = await assemble(settings)
        await assembled.daemon.start()
        self.running.append(assembled)
        return assembled

    @property
    def url(self) -> str:
        ingest = self.running[-1].ingest
        assert ingest is not None
        return ingest.url

    async def post(
        self, body: bytes | dict[str, Any] | list[Any], *, headers: dict[str, str] | None = None
    ) -> httpx.Response:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        sent = {"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"}
        async with httpx.AsyncClient(timeout=10) as client:
            return await client.post(self.url, content=data, headers={**sent, **(headers or {})})

    async def publish_raw(self, alert: dict[str, Any] | bytes, subject: str | None = None) -> None:
        """As Falcosidekick's NATS output does: a core publish, no headers, JSON body."""
        body = alert if isinstance(alert, bytes) else json.dumps(alert).encode()
        assert subject is not None or isinstance(alert, dict)
        await self.bus.nc.publish(subject or sidekick_subject(alert), body)  # type: ignore[arg-type]
        await self.bus.nc.flush()

    async def audits(self, namespace: str, pod: str, action: str = "*") -> list[Remediation]:
        subject = f"remediation.{action}.{token(f'{namespace}/{pod}')}"
        return [e.data for e in await read_stream(self.bus, "AUDIT", subject)]

    async def settled(self) -> bool:
        """Every alert published so far has been handled and acked, in every lane."""
        for name in self.consumers():
            info = await self.bus.js.consumer_info("SECURITY", name)
            if (info.num_pending or 0) or (info.num_ack_pending or 0):
                return False
        return True

    def consumers(self) -> list[str]:
        """The falco service's durables: the urgent lane's first."""
        config = FalcoSettings.model_validate(self.settings.services["falco"])
        return [name for name, _ in config.lanes()]

    async def pod(self, namespace: str, name: str) -> dict[str, Any]:
        return await self.admin.pods.get(namespace, name)

    async def network_policy(self, namespace: str, name: str) -> dict[str, Any] | None:
        path = f"/apis/networking.k8s.io/v1/namespaces/{namespace}/networkpolicies/{name}"
        try:
            found: dict[str, Any] = await self.admin.client.request("GET", path)
        except Exception:  # noqa: BLE001 - absent (404) is what the caller asks about
            return None
        return found

    def metric(self, name: str, **labels: str) -> float:
        registry = self.running[-1].daemon.metrics.registry
        return float(registry.get_sample_value(name, labels) or 0.0)


EnvFactory = Callable[..., Awaitable[FalcoEnv]]


@pytest.fixture
async def falco_env(bus: Bus, nats_url: str, tmp_path: Path) -> AsyncIterator[EnvFactory]:
    """`await falco_env(rules=[...], topic=..., **falco_settings)`: a sim cluster holding the
    sample alerts' pods and settings for the falco service; `env.start()` runs it."""
    made: list[FalcoEnv] = []

    async def make(
        rules: list[dict[str, Any]] | None = None, extra_nodes: tuple[str, ...] = (), **falco: Any
    ) -> FalcoEnv:
        uid = uuid.uuid4().hex[:8]
        seed = sample_seed(uid)
        if extra_nodes:
            more = [NodeSeed(name=n) for n in extra_nodes]
            seed = seed.model_copy(update={"nodes": [*seed.nodes, *more]})
        sim = SimCluster(seed, port=0, bookmark_interval=0.2)
        await sim.start()
        kubeconfig = sim.write_kubeconfig(tmp_path / f"kubeconfig-falco-{uid}", identity="falco")
        admin_client = fast_admin_client(sim, tmp_path, uid)
        token_file = tmp_path / f"falco-token-{uid}"
        token_file.write_text(TOKEN + "\n")
        service: dict[str, Any] = {
            "consumer": f"falco-{uid}",
            "bucket": f"falco-{uid}",
            "marks_bucket": f"falco-marks-{uid}",
            "breaker": {"bucket": f"breaker-{uid}"},
            # Only this test's alerts (NATS wildcards match whole tokens only).
            "subjects": sorted(
                {f"{sidekick_subject(a)}_{uid}" for a in samples()}
                | {f"falco.critical.garbage_{uid}"}
            ),
            "topic": f"t-{uid}",
            "rate_limit_per_pod": {"per_minute": 6000, "burst": 100},
            "rate_limit_per_rule": {"per_minute": 6000, "burst": 100},
            "ingest": {"host": "127.0.0.1", "port": 0, "token_file": str(token_file)},
        }
        if rules is not None:
            rules_file = tmp_path / f"falco-rules-{uid}.yaml"
            rules_file.write_text(yaml.safe_dump({"rules": rules}))
            service["rules_file"] = str(rules_file)
        if "breaker" in falco:  # this test's own window, whatever the limits
            falco = {**falco, "breaker": {"bucket": f"breaker-{uid}", **falco["breaker"]}}
        service |= falco
        settings = service_settings(nats_url, kubeconfig, "falco", service)
        env = FalcoEnv(uid, sim, Cluster(admin_client), bus, settings, token_file)
        made.append(env)
        return env

    yield make
    for env in made:
        for assembled in env.running:
            await assembled.daemon.stop()
        await env.admin.close()
        await env.sim.stop()


__all__ = [
    "DROP_AND_EXECUTE",
    "NODE",
    "TOKEN",
    "EnvFactory",
    "FalcoEnv",
    "falco_env",
    "samples",
    "sidekick_subject",
]
