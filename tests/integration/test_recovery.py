"""services.recovery with its real peers: NATS, the sim cluster, the cordon and checkpoint
services, a simulated node's GPU agent (SimNvml) and the simulated reboot operator.

A GPU fallen off the bus (XID 79) is quarantined by cordon; recovery drains the node
through the maintenance workflow, asks for a reboot through the node label, sees the new
bootID, has the agent validate the GPUs, and releases the node through cordon's and the
checkpoint service's own release paths. A node whose GPU does not come back after the
reboot fails validation twice: on-call is told (critical, RMA suggested) and the node stays
quarantined. A SIGKILL-like stop mid-recovery is resumed by a new replica."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from launch.sim_agents.gpu import build_sim_gpu_agent
from nodeward.bus import Bus
from nodeward.bus.control import request as control_request
from nodeward.bus.kv import TypedKV
from nodeward.config import ClusterSettings, Settings
from nodeward.daemon import Daemon
from nodeward.kube.client import Backoff, KubeClient
from schemas.control import ControlRequest
from schemas.remediation import Remediation
from schemas.state.recovery import RecoveryRecord, Step, node_key
from services.cordon.service import build as build_cordon
from services.maintenance.service import build as build_checkpoint
from services.recovery.service import build as build_recovery
from sim.cluster import SimCluster
from sim.cluster.seed import Gpu, NodeSeed, Seed
from sim.inject import InjectRequest, request_injection
from sim.reboot import SimRebootOperator
from tests.conftest import wait_for as shared_wait_for
from tests.integration.cordon_fixtures import read_stream
from tests.integration.crash_fixtures import ServiceProcess

pytestmark = pytest.mark.timeout(120)

TAINT = "nodeward.io/gpu-unhealthy"


@dataclass
class RecoveryEnv:
    sim: SimCluster
    admin: KubeClient
    bus: Bus
    node: str
    settings: Settings
    bucket: str
    daemons: list[Daemon] = field(default_factory=list)
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)

    def settings_for(self, who: str) -> Settings:
        """The settings with `who`'s own ServiceAccount."""
        identity = self.sim.write_kubeconfig(
            Path(self.settings.cluster.kubeconfig or ".").with_name(f"kc-{who}-{self.bucket}"),
            identity=who,
        )
        return self.settings.model_copy(
            update={"cluster": ClusterSettings(kubeconfig=identity, retries=1)}
        )

    async def start(self, build: Callable[[Settings], Awaitable[Daemon]], who: str) -> Daemon:
        daemon = await build(self.settings_for(who))
        await daemon.start()
        self.daemons.append(daemon)
        return daemon

    async def record(self) -> RecoveryRecord | None:
        kv = await self.bus.kv(self.bucket)
        found = await TypedKV(kv, RecoveryRecord).get(node_key(self.node))
        return found.value if found else None

    async def node_obj(self) -> dict[str, Any]:
        got: dict[str, Any] = await self.admin.request("GET", f"/api/v1/nodes/{self.node}")
        return got

    async def audits(self) -> list[Remediation]:
        events = await read_stream(self.bus, "AUDIT", f"remediation.*.{self.node}")
        return [e.data for e in events]


async def wait_for(check: Callable[[], Awaitable[Any]], what: str, timeout: float = 60) -> Any:
    """The shared `tests.conftest.wait_for`, with this file's longer default."""
    return await shared_wait_for(check, timeout=timeout, interval=0.1, what=what)


@pytest.fixture
async def recovery_env(
    bus: Bus, nats_url: str, tmp_path: Path
) -> AsyncIterator[Callable[..., Awaitable[RecoveryEnv]]]:
    made: list[RecoveryEnv] = []

    async def make(
        *,
        agent_gpus: int = 8,
        in_process: bool = True,
        reboot_operator: bool = True,
        **recovery: Any,
    ) -> RecoveryEnv:
        uid = uuid.uuid4().hex[:8]
        node = f"rcv-{uid}"
        seed = Seed(
            namespaces=["nodeward"],
            nodes=[
                NodeSeed(name=node, gpu=Gpu(product="NVIDIA-H100-80GB-HBM3", count=8)),
                *(NodeSeed(name=f"{node}-spare{i}") for i in range(3)),
            ],
        )
        sim = SimCluster(seed, port=0, bookmark_interval=0.2)
        await sim.start()
        admin_path = sim.write_kubeconfig(tmp_path / f"kubeconfig-admin-{uid}")
        admin = KubeClient.from_settings(ClusterSettings(kubeconfig=admin_path))
        admin.backoff = Backoff(base=0.01, cap=0.05)
        breaker = {"max_percent": 100, "max_nodes": 10, "calm_period": None,
                   "bucket": f"breaker-{uid}"}  # fmt: skip
        settings = Settings(
            bus={"url": nats_url, "publish_timeout": "2s"},
            cluster={"kubeconfig": admin_path, "retries": 1},
            daemon={"shutdown_timeout": "4s"},
            agents={"gpu": {"poll_interval": "0.3s", "heartbeat_interval": "5s"}},
            services={
                "cordon": {
                    "consumer": f"cordon-{uid}",
                    "bucket": f"cordon-{uid}",
                    "subjects": [f"gpu.health.{node}.>"],
                    "heartbeat_consumer": f"cordon-heartbeats-{uid}",
                    "heartbeat_subjects": [f"gpu.heartbeat.{node}"],
                    "healthy_period": "1h",  # no passive release: recovery's to do
                    "breaker": breaker,
                    "xid_repeats": {"enabled": False},
                },
                "checkpoint": {
                    "consumer": f"checkpoint-{uid}",
                    "bucket": f"checkpoint-{uid}",
                    "subjects": [f"maintenance.requested.{node}"],
                    "tick": "0.1s",
                    "annotation_interval": "0.5s",
                    "lease_ttl": "3s",
                    "breaker": breaker,
                },
                "recovery": {
                    "consumer": f"recovery-{uid}",
                    "subjects": [f"remediation.quarantine.{node}"],
                    "maintenance_consumer": f"recovery-mnt-{uid}",
                    "maintenance_subjects": [
                        f"maintenance.{p}.{node}" for p in ("done", "failed", "cancelled")
                    ],
                    "bucket": f"recovery-{uid}",
                    "interval": "0.2s",
                    "drain_deadline": "2s",
                    "request_timeout": "3s",
                    "breaker": breaker,
                }
                | recovery,
            },
        )
        env = RecoveryEnv(sim, admin, bus, node, settings, f"recovery-{uid}")
        made.append(env)
        await env.start(build_cordon, "cordon")
        await env.start(build_checkpoint, "checkpoint")
        if in_process:
            await env.start(build_recovery, "recovery")
        node_seed = NodeSeed(name=node, gpu=Gpu(product="NVIDIA-H100-80GB-HBM3", count=agent_gpus))
        agent, _, _ = await build_sim_gpu_agent(settings, node_seed)
        await agent.start()
        env.daemons.append(agent)
        await wait_for(lambda: _ready(agent), "the GPU agent watching its GPUs")
        if reboot_operator:
            operator = SimRebootOperator(admin, bus.nc, interval=0.2)
            env.tasks.append(asyncio.create_task(operator.run()))
        return env

    yield make
    for env in made:
        for task in env.tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for daemon in reversed(env.daemons):
            await daemon.stop()
        await env.admin.close()
        await env.sim.stop()


async def _ready(daemon: Daemon) -> bool:
    return (await daemon.readiness()).ready


async def _fall_off_the_bus(env: RecoveryEnv, gpu: int = 3) -> None:
    reply = await request_injection(
        env.bus.nc, env.node, InjectRequest(gpu=gpu, fault="fallen-off-bus")
    )
    assert reply.ok, reply.error


def _has_taint(node: dict[str, Any]) -> bool:
    return any(t.get("key") == TAINT for t in (node.get("spec") or {}).get("taints") or [])


async def test_xid_79_is_drained_rebooted_validated_and_released(recovery_env: Any) -> None:
    env: RecoveryEnv = await recovery_env()
    boot_before = (await env.node_obj())["status"]["nodeInfo"]["bootID"]
    await _fall_off_the_bus(env)

    async def released() -> RecoveryRecord | None:
        record = await env.record()
        return record if record is not None and record.terminal else None

    record = await wait_for(released, "the recovery to end")
    assert record.step == Step.RELEASED, record.history
    assert record.validation_failures == 0
    node = await env.node_obj()
    assert node["status"]["nodeInfo"]["bootID"] != boot_before
    assert not _has_taint(node)
    assert not node["spec"].get("unschedulable")
    assert "nodeward.io/reboot-required" not in (node["metadata"].get("labels") or {})

    audits = [(a.actor, a.action, a.outcome.value) for a in await env.audits()]
    for step in [
        ("service/recovery", "recover", "applied"),
        ("service/recovery", "drain", "applied"),
        ("service/recovery", "reboot", "applied"),
        ("service/recovery", "validate", "applied"),
        ("service/cordon", "release", "applied"),
        ("service/recovery", "release", "applied"),
    ]:
        assert step in audits, (step, audits)


async def test_validation_failing_twice_escalates_and_the_node_stays_quarantined(
    recovery_env: Any,
) -> None:
    # The GPU never comes back: after each reboot the driver shows 7 of the node's 8.
    env: RecoveryEnv = await recovery_env(agent_gpus=7)
    await _fall_off_the_bus(env, gpu=2)

    async def ended() -> RecoveryRecord | None:
        record = await env.record()
        return record if record is not None and record.terminal else None

    record = await wait_for(ended, "the recovery to end", timeout=90)
    assert record.step == Step.ESCALATED, record.history
    assert record.validation_failures == 2
    assert record.attempts == 2  # rebooted twice
    node = await env.node_obj()
    assert _has_taint(node) and node["spec"].get("unschedulable")  # still quarantined
    audits = await env.audits()
    failed = [a for a in audits if a.action == "validate" and a.outcome.value == "failed"]
    assert len(failed) == 2 and "gpus present: 7 of 8" in failed[0].reason
    (escalation,) = [a for a in audits if a.action == "escalate"]
    assert "RMA suggested" in escalation.reason
    notices = await read_stream(env.bus, "NOTIFY", "notify.>", skip_invalid=True)
    rma = [
        n.data
        for n in notices
        if any(t.name == env.node for t in n.data.targets) and "RMA" in n.data.title
    ]
    assert rma and rma[0].severity.value == "critical"
    assert not [a for a in audits if a.actor == "service/recovery" and a.action == "release"]


@pytest.mark.parametrize(
    "point",
    [
        "recovery.draining",  # the drain asked, before the maintenance is done
        "recovery.asked",  # the reboot asked, not yet audited nor its step saved
        "recovery.rebooting",
        "recovery.validating",
        "recovery.releasing",
    ],
)
async def test_a_recovery_killed_at_each_step_is_finished_after_restart(
    recovery_env: Any, nats_url: str, tmp_path: Path, point: str
) -> None:
    env: RecoveryEnv = await recovery_env(in_process=False)
    proc = ServiceProcess.of("recovery", env.settings_for("recovery"), tmp_path, nats_url)
    try:
        proc.start(failpoint=point)
        await wait_for(lambda: _consuming(env), "the recovery process's consumer")
        await _fall_off_the_bus(env)
        assert await proc.exited() == -9, proc.tail()  # SIGKILLed at the point
        proc.start()

        async def ended() -> RecoveryRecord | None:
            record = await env.record()
            return record if record is not None and record.terminal else None

        record = await wait_for(ended, f"the recovery to end; log: {proc.tail()}")
        assert record.step == Step.RELEASED, record.history
        assert record.attempts == 1, record.history  # one reboot, whatever the kill
        node = await env.node_obj()
        assert not _has_taint(node) and not node["spec"].get("unschedulable")
        audits = [(a.actor, a.action, a.outcome.value) for a in await env.audits()]
        assert audits.count(("service/recovery", "reboot", "applied")) >= 1
        assert ("service/recovery", "release", "applied") in audits
    finally:
        proc.stop()


async def _consuming(env: RecoveryEnv) -> bool:
    consumer = f"recovery-{env.bucket.removeprefix('recovery-')}"
    try:
        await env.bus.js.consumer_info("AUDIT", consumer)
    except Exception:  # noqa: BLE001 - not there yet
        return False
    return True


async def test_an_uncorrectable_ecc_burst_is_drained_reset_by_the_agent_and_released(
    recovery_env: Any,
) -> None:
    # XID 48 with double-bit ECC errors: the catalog says reset_gpu; no reboot.
    env: RecoveryEnv = await recovery_env()
    boot_before = (await env.node_obj())["status"]["nodeInfo"]["bootID"]
    reply = await request_injection(
        env.bus.nc, env.node, InjectRequest(gpu=5, fault="ecc-dbe-burst")
    )
    assert reply.ok, reply.error

    async def ended() -> RecoveryRecord | None:
        record = await env.record()
        return record if record is not None and record.terminal else None

    record = await wait_for(ended, "the recovery to end")
    assert record.step == Step.RELEASED, record.history
    assert (record.plan.value, record.remediator, record.gpus) == ("reset", "gpu-reset", [5])
    node = await env.node_obj()
    assert node["status"]["nodeInfo"]["bootID"] == boot_before  # reset, not rebooted
    assert not _has_taint(node) and not node["spec"].get("unschedulable")
    audits = [(a.actor, a.action, a.outcome.value) for a in await env.audits()]
    assert ("service/recovery", "reset", "applied") in audits
    assert ("service/recovery", "reboot", "applied") not in audits
    assert ("service/recovery", "validate", "applied") in audits
    assert ("service/cordon", "release", "applied") in audits


async def test_a_fault_that_grows_to_one_the_catalog_sends_to_rma_escalates(
    recovery_env: Any,
) -> None:
    # XID 64 (reset_gpu) comes first and starts a reset plan; the row-remap failure the agent
    # reports next (drain_and_rma) reaches recovery as cordon's `already_quarantined`.
    env: RecoveryEnv = await recovery_env()
    reply = await request_injection(
        env.bus.nc, env.node, InjectRequest(gpu=1, fault="row-remap-failure")
    )
    assert reply.ok, reply.error

    async def escalated() -> list[Remediation]:
        return [a for a in await env.audits() if a.action == "escalate"]

    (escalation,) = await wait_for(escalated, "the escalation")
    assert "RMA suggested" in escalation.reason and "drain_and_rma" in escalation.reason
    record = await env.record()
    assert record is not None and record.step == Step.ESCALATED, record
    audits = await env.audits()
    assert not [a for a in audits if a.action in ("reset", "reboot", "release")]
    assert _has_taint(await env.node_obj())  # quarantined, for a human


async def test_a_quarantine_an_operator_releases_mid_recovery_ends_it_and_takes_back_its_asks(
    recovery_env: Any,
) -> None:
    # No reboot operator: the recovery waits for a reboot that never comes.
    env: RecoveryEnv = await recovery_env(reboot_operator=False)
    await _fall_off_the_bus(env)

    async def rebooting() -> RecoveryRecord | None:
        record = await env.record()
        return record if record is not None and record.step == Step.REBOOTING else None

    await wait_for(rebooting, "the reboot asked")
    labels = (await env.node_obj())["metadata"].get("labels") or {}
    assert labels.get("nodeward.io/reboot-required") == "true"
    reply = await control_request(
        env.bus.nc,
        ControlRequest(service="cordon", verb="release", operator="alice", target=env.node),
        timeout=10,
    )
    assert reply.status.value == "ok", reply.message

    async def gone() -> RecoveryRecord | None:
        record = await env.record()
        return record if record is not None and record.terminal else None

    record = await wait_for(gone, "the recovery to stop")
    assert record.step == Step.GONE, record.history
    node = await env.node_obj()
    assert not node["spec"].get("unschedulable")  # the maintenance's cordon taken back too
    assert "nodeward.io/reboot-required" not in (node["metadata"].get("labels") or {})
    audits = await env.audits()
    assert [a for a in audits if a.guard == "quarantine_ended"]
    assert ("service/checkpoint", "finish", "applied") in [
        (a.actor, a.action, a.outcome.value) for a in audits
    ]


async def test_the_per_node_retry_limit_leaves_a_second_quarantine_to_on_call(
    recovery_env: Any,
) -> None:
    env: RecoveryEnv = await recovery_env(retry_limit=1)
    await _fall_off_the_bus(env)

    async def released() -> RecoveryRecord | None:
        record = await env.record()
        return record if record is not None and record.step == Step.RELEASED else None

    first = await wait_for(released, "the first recovery")
    await _fall_off_the_bus(env, gpu=4)  # the same node fails again within the window

    async def refused() -> list[Remediation]:
        return [
            a for a in await env.audits() if a.action == "recover" and a.outcome.value == "refused"
        ]

    (refusal,) = await wait_for(refused, "the second recovery refused")
    assert refusal.guard == "retry_limit" and "stays quarantined" in refusal.reason
    assert _has_taint(await env.node_obj())
    record = await env.record()
    assert record is not None and record.incident == first.incident  # no second recovery


async def test_a_dry_running_recovery_audits_and_does_nothing(recovery_env: Any) -> None:
    env: RecoveryEnv = await recovery_env(dry_run=True)
    await _fall_off_the_bus(env)

    async def dry() -> list[Remediation]:
        return [a for a in await env.audits() if a.action == "recover"]

    (decision,) = await wait_for(dry, "the dry-run decision")
    assert decision.outcome.value == "dry_run" and decision.dry_run

    async def trigger_acked() -> bool:  # the handler is done with it: acked, nothing pending
        info = await env.bus.js.consumer_info("AUDIT", env.bucket)  # consumer named as bucket
        return info.num_ack_pending == 0 and info.num_pending == 0

    await wait_for(trigger_acked, "the quarantine's audit record acknowledged")
    assert await env.record() is None
    assert not await read_stream(env.bus, "MAINTENANCE", f"maintenance.*.{env.node}")
    assert _has_taint(await env.node_obj())


async def test_the_webhook_remediator_posts_the_request_and_waits_for_the_reboot(
    recovery_env: Any,
) -> None:
    from aiohttp import web

    received: list[dict[str, Any]] = []
    env_box: list[RecoveryEnv] = []

    async def hook(request: web.Request) -> web.Response:
        body = await request.json()
        received.append(body)
        env = env_box[0]
        # The receiver (a site's reboot system) reboots the node, as the operator would.
        operator = SimRebootOperator(env.admin, env.bus.nc)
        await operator.reboot(await env.node_obj())
        return web.json_response({"accepted": True}, status=202)

    app = web.Application()
    app.router.add_post("/reboot", hook)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        env: RecoveryEnv = await recovery_env(
            reboot_operator=False,
            remediators={"reboot": "webhook"},
            webhook_url=f"http://127.0.0.1:{port}/reboot",
        )
        env_box.append(env)
        await _fall_off_the_bus(env, gpu=6)

        async def ended() -> RecoveryRecord | None:
            record = await env.record()
            return record if record is not None and record.terminal else None

        record = await wait_for(ended, "the recovery to end")
        assert record.step == Step.RELEASED, record.history
        (body,) = received
        assert body["action"] == "reboot" and body["node"] == env.node and body["gpus"] == [6]
        assert body["xids"] == [79] and body["request_id"].endswith("/reboot/1")
        assert not _has_taint(await env.node_obj())
    finally:
        await runner.cleanup()
