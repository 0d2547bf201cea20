"""Helpers for the accounting tests: a sim cluster with two GPU nodes and pods in three
namespaces, the service's settings on its own consumers and bucket, events to inject."""

from __future__ import annotations

import asyncio
import csv
import io
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from nodeward.bus import Bus
from nodeward.config import Settings
from nodeward.daemon import Daemon
from schemas import Event, make_event
from schemas.cloudevents import MSG_ID, encode
from schemas.common import ObjectRef
from schemas.energy import CarbonBasis, CarbonIntensity, EnergyNode, EnergyPod, Interval
from schemas.remediation import Outcome, Remediation
from schemas.session import IdleEvidence, SessionActivity, SessionIdle, SessionKind
from services.accounting.service import app, build
from sim.cluster import SimCluster
from sim.cluster.seed import Gpu, NodeSeed, PodSeed, Seed
from tests.helpers.records import notebook_idle
from tests.integration.simkube import RunsService, service_settings, stop_env

H100 = "NVIDIA-H100-80GB-HBM3"
A100 = "NVIDIA-A100-SXM4-80GB"
G_PER_KWH = 100.0


@dataclass
class AccountingEnv(RunsService):
    """Nodes `h100` and `a100`; namespaces `ns1` (pods a, b on h100), `ns2` (pod c on a100)
    and `user_ns` (pod d on h100, no GPU)."""

    sim: SimCluster
    bus: Bus
    uid: str
    h100: str
    a100: str
    ns1: str
    ns2: str
    user_ns: str
    settings: Settings
    config: Path
    actor: str
    daemons: list[Daemon] = field(default_factory=list)

    build = staticmethod(build)

    @property
    def prefix(self) -> str:
        return str(self.settings.services["accounting"]["consumer_prefix"])

    def carbon(self, at: datetime) -> CarbonIntensity:
        return CarbonIntensity(
            g_per_kwh=G_PER_KWH,
            zone="test",
            provider="static",
            basis=CarbonBasis.OPERATIONAL,
            observed_at=at,
        )

    def node_interval(
        self, node: str, start: datetime, seconds: float, *, covered_s: float | None = None
    ) -> Event[EnergyNode]:
        covered = seconds if covered_s is None else covered_s
        data = EnergyNode(
            node=node,
            interval=Interval(start=start, end=start + timedelta(seconds=seconds)),
            readings=[],
            energy_j=1000.0 * covered if covered else None,
            avg_power_w=1000.0 if covered else None,
            covered_s=covered,
        )
        return make_event(data, source=f"agent/energy/{node}", time=data.interval.end)

    def pod_interval(
        self,
        node: str,
        ns: str,
        pod: str,
        start: datetime,
        seconds: float,
        *,
        gpu_j: float,
        cpu_j: float,
        gpus: float,
    ) -> Event[EnergyPod]:
        energy = gpu_j + cpu_j
        end = start + timedelta(seconds=seconds)
        data = EnergyPod(
            namespace=ns,
            pod=pod,
            node=node,
            interval=Interval(start=start, end=end),
            cpu_energy_j=cpu_j,
            gpu_energy_j=gpu_j,
            energy_j=energy,
            gpus=gpus,
            attribution="cpu-time-ratio-estimate+gpu-exclusive",
            carbon=self.carbon(start),
            co2e_g=energy / 3_600_000 * G_PER_KWH,
        )
        return make_event(data, source=f"agent/energy/{node}", time=end)

    def idle(
        self, node: str, ns: str, pod: str, since: datetime, idle_for_s: float, gpus: int
    ) -> Event[SessionIdle]:
        at = since + timedelta(seconds=idle_for_s)
        gpu = IdleEvidence(signal="gpu", idle_since=since, detail="0% SM")
        data = notebook_idle(ns, pod, node, since, idle_for_s, gpu, gpus_held=gpus)
        return make_event(data, source=f"agent/idle/{node}", time=at)

    def activity(self, node: str, ns: str, pod: str, at: datetime, pct: float) -> Event[Any]:
        data = SessionActivity(
            namespace=ns,
            pod=pod,
            node=node,
            kind=SessionKind.NOTEBOOK,
            gpu_utilization_pct=pct,
            gpu_uuids=["GPU-0"],
            sampled_at=at,
        )
        return make_event(data, source=f"agent/idle/{node}", time=at)

    def culled(
        self, action: str, ns: str, pod: str, at: datetime, outcome: Outcome = Outcome.APPLIED
    ) -> Event[Remediation]:
        data = Remediation(
            action=action,
            target=ObjectRef(
                kind="Notebook", name=pod, namespace=ns, api_version="kubeflow.org/v1"
            ),
            outcome=outcome,
            reason="idle",
            actor=self.actor,
            dry_run=outcome == Outcome.DRY_RUN,
            details={"pod": f"{ns}/{pod}"},
        )
        return make_event(data, source=self.actor, time=at)

    async def publish(self, *events: Event[Any]) -> None:
        await self.bus.publish_many(list(events))

    async def publish_again(self, event: Event[Any]) -> None:
        """The same event (same id) stored a second time, as an agent resending it after
        JetStream's duplicate window would: the service must still count it once."""
        wire = encode(event)
        headers = dict(wire.headers) | {MSG_ID: f"again-{uuid.uuid4().hex}"}
        await self.bus.js.publish(wire.subject, wire.body, headers=headers)

    async def settled(self) -> bool:
        """True once every consumer of the service has handled everything published."""
        for stream, durable in app.grants().consumers:
            name = durable.replace("accounting", self.prefix, 1)
            try:
                info = await self.bus.js.consumer_info(stream, name)
            except Exception:  # noqa: BLE001 - not bound yet
                return False
            if info.num_pending or info.num_ack_pending:
                return False
        return True

    async def forget_consumers(self) -> None:
        """Delete the durable consumers: the next start reads every stream from its start."""
        for stream, durable in app.grants().consumers:
            await self.bus.js.delete_consumer(stream, durable.replace("accounting", self.prefix, 1))

    async def report(self, *args: str) -> tuple[int, str, str]:
        """`nodeward report ARGS` as a user runs it (a subprocess)."""
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "launch",
            "report",
            "--config",
            str(self.config),
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await proc.communicate()
        return proc.returncode or 0, out.decode(), err.decode()

    async def csv_rows(
        self, since: datetime, until: datetime, by: str
    ) -> dict[str, dict[str, str]]:
        code, out, err = await self.report(
            "--since", since.isoformat(), "--until", until.isoformat(), "--by", by,
            "--format", "csv",
        )  # fmt: skip
        assert code == 0, err
        return {row[by]: row for row in csv.DictReader(io.StringIO(out))}


EnvFactory = Callable[[], Awaitable[AccountingEnv]]


@pytest.fixture
async def accounting_env(bus: Bus, nats_url: str, tmp_path: Path) -> AsyncIterator[EnvFactory]:
    made: list[AccountingEnv] = []

    async def make() -> AccountingEnv:
        uid = uuid.uuid4().hex[:8]
        h100, a100 = f"h100-{uid}", f"a100-{uid}"
        ns1, ns2, user_ns = f"team-a-{uid}", f"team-b-{uid}", f"user-dave-{uid}"
        pods = [
            PodSeed(
                name="pod-a",
                namespace=ns1,
                node=h100,
                role="notebook",
                gpus=1,
                annotations={"nodeward.io/owner-email": "alice@example.com"},
            ),
            PodSeed(name="pod-b", namespace=ns1, node=h100, gpus=1),
            PodSeed(
                name="pod-c",
                namespace=ns2,
                node=a100,
                gpus=2,
                annotations={"nodeward.io/owner-email": "bob@example.com"},
            ),
            PodSeed(name="pod-d", namespace=user_ns, node=h100),
        ]
        seed = Seed(
            namespaces=[ns1, ns2, user_ns, "nodeward"],
            nodes=[
                NodeSeed(name=h100, gpu=Gpu(product=H100)),
                NodeSeed(name=a100, gpu=Gpu(product=A100, family="ampere")),
            ],
            pods=pods,
        )
        sim = SimCluster(seed, port=0, bookmark_interval=0.2)
        await sim.start()
        kubeconfig = sim.write_kubeconfig(tmp_path / f"kubeconfig-{uid}", identity="accounting")
        actor = f"service/culler-{uid}"
        service = {
            "consumer_prefix": f"accounting-{uid}",
            "bucket": f"accounting-{uid}",
            "energy_subjects": [
                *(f"energy.node.{n}" for n in (h100, a100)),
                *(f"energy.pod.{n}.>" for n in (h100, a100)),
            ],
            "session_subjects": [f"session.*.{n}.>" for n in (h100, a100)],
            "finding_subjects": [f"node.finding.{n}.>" for n in (h100, a100)],
            "culler_actor": actor,
        }
        settings = service_settings(nats_url, kubeconfig, "accounting", service)
        config = tmp_path / f"config-{uid}.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "bus": {"url": nats_url},
                    "services": {"accounting": {"bucket": service["bucket"]}},
                }
            )
        )
        env = AccountingEnv(sim, bus, uid, h100, a100, ns1, ns2, user_ns, settings, config, actor)
        made.append(env)
        return env

    yield make
    for env in made:
        await stop_env(env.daemons, env.sim)
