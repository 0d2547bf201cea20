"""Helpers for the cordon service tests: a 10-node sim, the service, events, read-back."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import nats.errors
import nats.js.errors
import pytest

from nodeward.bus import Bus
from nodeward.config import Settings
from nodeward.daemon import Daemon
from nodeward.kube import Cluster
from schemas import Event, decode, make_event
from schemas.cloudevents import DecodeError
from schemas.gpu import (
    GpuHealth,
    GpuHeartbeat,
    GpuState,
    HealthReason,
    HealthState,
    RecommendedAction,
)
from schemas.notify import Notification
from schemas.remediation import Remediation
from services.cordon.service import build
from sim.cluster import SimCluster
from sim.cluster.seed import NodeSeed, Seed
from tests.integration.simkube import fast_admin_client, own, service_settings


def failed(
    node: str, *, gpu: int = 0, seq: int = 1, boot: str = "boot-1", at: datetime | None = None
) -> Event[GpuHealth]:
    return health(node, HealthState.FAILED, gpu=gpu, seq=seq, boot=boot, at=at, xid=79)


def health(
    node: str,
    state: HealthState,
    *,
    gpu: int = 0,
    seq: int = 1,
    boot: str = "boot-1",
    at: datetime | None = None,
    xid: int | None = None,
    heartbeat: bool = False,
) -> Event[GpuHealth]:
    reasons = (
        [
            HealthReason(
                code="xid",
                xid=xid,
                message="GPU has fallen off the bus",
                action=RecommendedAction.REBOOT_NODE,
            )
        ]
        if xid is not None
        else []
    )
    data = GpuHealth(
        node=node,
        gpu_index=gpu,
        gpu_uuid=f"GPU-{node}-{gpu}",
        state=state,
        reasons=reasons,
        recommended_action=RecommendedAction.REBOOT_NODE if xid else RecommendedAction.NONE,
        observed_at=at or datetime.now(UTC),
        agent_boot_id=boot,
        sequence=seq,
        heartbeat=heartbeat,
    )
    return make_event(data, source=f"agent/gpu/{node}")


def heartbeat(
    node: str,
    states: dict[int, HealthState],
    *,
    seq: int = 1,
    boot: str = "boot-1",
    changed_at: datetime | None = None,
) -> Event[GpuHeartbeat]:
    """A node's heartbeat restating each GPU's state (failed ones with XID 79), last
    changed at `changed_at` with sequence `seq`."""
    changed = changed_at or datetime.now(UTC)
    gpus = []
    for gpu, state in states.items():
        said = health(
            node,
            state,
            gpu=gpu,
            seq=seq,
            boot=boot,
            at=changed,
            xid=79 if state == HealthState.FAILED else None,
        ).data
        gpus.append(
            GpuState(
                gpu_index=gpu,
                gpu_uuid=said.gpu_uuid,
                state=state,
                reasons=said.reasons,
                recommended_action=said.recommended_action,
                sequence=seq,
                changed_at=changed,
            )
        )
    data = GpuHeartbeat(
        node=node, gpus=gpus, interval_s=30, observed_at=datetime.now(UTC), agent_boot_id=boot
    )
    return make_event(data, source=f"agent/gpu/{node}")


async def read_stream(
    bus: Bus, stream: str, subject: str, *, skip_invalid: bool = False
) -> list[Event[Any]]:
    """Every stored event on `subject`, decoded. `skip_invalid` leaves out what does not
    decode: for broad reads of a stream shared with tests that store bad input on purpose
    (the notifier's DLQ test leaves a notice without a title in NOTIFY).

    On a three-server cluster a fresh consumer can answer 503 while its leader settles
    (or after a server was killed): the read starts over, a few times, before failing."""
    for attempt in range(5):
        try:
            return await _read_once(bus, stream, subject, skip_invalid=skip_invalid)
        except (nats.js.errors.ServiceUnavailableError, nats.errors.TimeoutError):
            if attempt == 4:
                raise
            await asyncio.sleep(0.5)
    raise AssertionError("unreachable")


async def _read_once(
    bus: Bus, stream: str, subject: str, *, skip_invalid: bool
) -> list[Event[Any]]:
    info = await bus.js.stream_info(stream, subjects_filter=subject)
    total = sum((info.state.subjects or {}).values())
    if not total:
        return []
    out: list[Event[Any]] = []
    psub = await bus.js.pull_subscribe(subject, stream=stream)
    try:
        while len(out) < total:
            msgs = await psub.fetch(total - len(out), timeout=2)
            for m in msgs:
                await m.ack()
                try:
                    out.append(decode(m.subject, m.headers, m.data))
                except DecodeError:
                    if not skip_invalid:
                        raise
                    total -= 1
    finally:
        await psub.unsubscribe()
    return out


H100 = "NVIDIA H100 80GB HBM3"


def h100_threshold_policy(tmp_path: Path) -> str:
    """A policy file: failed GPUs quarantine, but an H100 node only from its second
    excluded GPU on (`exclusion.thresholds`). Returns its path."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        f"exclusion: {{node_threshold: 1, thresholds: {{'{H100}': 2}}}}\n"
        "rules:\n- {name: failed-gpu, when: {states: [failed]}, action: quarantine}\n"
        "- {name: default, action: none}\n"
    )
    return str(policy)


async def settled(bus: Bus, stream: str, consumer: str, delivered: int = 0) -> bool:
    """The consumer has delivered at least `delivered` messages and has nothing left: none
    unacknowledged, none still to deliver."""
    info = await bus.js.consumer_info(stream, consumer)
    return (
        info.delivered.consumer_seq >= delivered
        and not info.num_ack_pending
        and not info.num_pending
    )


async def audits(bus: Bus, node: str, action: str = "*") -> list[Remediation]:
    return [e.data for e in await read_stream(bus, "AUDIT", f"remediation.{action}.{node}")]


async def notifications(bus: Bus, node: str) -> list[Notification]:
    events = await read_stream(bus, "NOTIFY", "notify.*.gpu-health")
    return [e.data for e in events if any(t.name == node for t in e.data.targets)]


@dataclass
class CordonEnv:
    """A sim cluster with unique node names and a way to run the cordon service on it."""

    sim: SimCluster
    admin: Cluster
    bus: Bus
    nodes: list[str]
    settings: Settings
    daemons: list[Daemon] = field(default_factory=list)

    async def start(self) -> Daemon:
        daemon = await build(self.settings)
        await daemon.start()
        self.daemons.append(daemon)
        return daemon

    async def publish(self, *events: Event[Any]) -> None:
        await self.bus.publish_many(list(events))

    async def node(self, name: str) -> dict[str, Any]:
        return await self.admin.nodes.get(name)


EnvFactory = Callable[..., Awaitable[CordonEnv]]


def node_seeds(prefix: str, count: int, extra: dict[int, dict[str, Any]]) -> list[NodeSeed]:
    return [NodeSeed(name=f"{prefix}-{i:02d}", **extra.get(i, {})) for i in range(count)]


@pytest.fixture
async def cordon_env(bus: Bus, nats_url: str, tmp_path: Path) -> AsyncIterator[EnvFactory]:
    """`await cordon_env(nodes={3: {"unschedulable": True}}, dry_run=True, ...)`: a fresh
    10-node sim and settings for the service; `env.start()` runs it."""
    made: list[CordonEnv] = []
    sims: list[SimCluster] = []

    async def make(
        count: int = 10,
        nodes: dict[int, dict[str, Any]] | None = None,
        seed_extra: Callable[[list[str]], dict[str, Any]] | None = None,
        bus_extra: dict[str, Any] | None = None,
        **cordon: Any,
    ) -> CordonEnv:
        uid = uuid.uuid4().hex[:8]
        prefix = f"gpu-{uid}"
        seeds = node_seeds(prefix, count, nodes or {})
        extra = seed_extra([n.name for n in seeds]) if seed_extra else {}
        seed = Seed(namespaces=["nodeward"], nodes=seeds, **extra)
        sim = SimCluster(seed, port=0, bookmark_interval=0.2)
        await sim.start()
        sims.append(sim)
        names = [n.name for n in seed.nodes]
        kubeconfig = sim.write_kubeconfig(tmp_path / f"kubeconfig-cordon-{uid}", identity="cordon")
        admin_client = fast_admin_client(sim, tmp_path, uid)
        service: dict[str, Any] = {
            **own("cordon", uid),
            "subjects": [f"gpu.health.{n}.>" for n in names],
            "heartbeat_subjects": [f"gpu.heartbeat.{n}" for n in names],
            "healthy_period": "0.5s",
            "cooldown": "0s",
            "reconcile_interval": "0.1s",
            "breaker": {
                "max_percent": 30,
                "max_nodes": 10,
                "calm_period": None,
                "bucket": f"breaker-{uid}",
            },
            "rate_limit": {"per_minute": 60000, "burst": 1000},
            "xid_repeats": {
                "subjects": [f"gpu.xid.{n}.>" for n in names],
            }
            | cordon.pop("xid_repeats", {}),
        } | cordon
        settings = service_settings(
            nats_url,
            kubeconfig,
            "cordon",
            service,
            bus={"url": nats_url, "publish_timeout": "2s"} | (bus_extra or {}),
        )
        env = CordonEnv(sim, Cluster(admin_client), bus, names, settings)
        made.append(env)
        return env

    yield make
    for env in made:
        for d in env.daemons:
            await d.stop()
        await env.admin.close()
    for sim in sims:
        await sim.stop()
