"""services.recovery with its real peers: NATS, the sim cluster, the cordon and checkpoint
services, a simulated node's GPU agent (SimNvml) and the simulated reboot operator.

A GPU fallen off the bus (XID 79) is quarantined by cordon; recovery drains the node
through the maintenance workflow, asks for a reboot through the node label, sees the new
bootID, has the agent validate the GPUs, and releases the node through cordon's and the
checkpoint service's own release paths. A node whose GPU does not come back after the
reboot fails validation twice: on-call is told (critical, RMA suggested) and the node stays
quarantined. A SIGKILL-like stop mid-recovery is resumed by a new replica."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from nodeward.bus import Bus
from nodeward.bus.control import request as control_request
from nodeward.bus.kv import TypedKV
from nodeward.kube.client import MERGE_PATCH
from schemas.control import ControlRequest
from schemas.falco import ISOLATE_LABEL
from schemas.maintenance import MaintenancePhase
from schemas.remediation import Remediation
from services.kernel.holds import hold_of
from services.maintenance.state import MaintenanceState, state_key
from services.recovery.state import RecoveryRecord, Step
from sim.cluster.seed import PdbSeed, PodSeed
from sim.inject import InjectRequest, request_injection
from sim.reboot import SimRebootOperator
from tests.integration.cordon_fixtures import read_stream
from tests.integration.crash_fixtures import ServiceProcess
from tests.integration.recovery_fixtures import RecoveryEnv, recovery_platform, wait_for

pytestmark = pytest.mark.timeout(120)

TAINT = "nodeward.io/gpu-unhealthy"


@pytest.fixture
async def recovery_env(
    bus: Bus, nats_url: str, tmp_path: Path
) -> AsyncIterator[Callable[..., Awaitable[RecoveryEnv]]]:
    async with recovery_platform(bus, nats_url, tmp_path) as make:
        yield make


async def _inject(env: RecoveryEnv, gpu: int, fault: str) -> None:
    """`fault` injected into GPU `gpu` of the env's node by its sim agent; it said yes."""
    reply = await request_injection(env.bus.nc, env.node, InjectRequest(gpu=gpu, fault=fault))
    assert reply.ok, reply.error


async def _fall_off_the_bus(env: RecoveryEnv, gpu: int = 3) -> None:
    await _inject(env, gpu, "fallen-off-bus")


async def _escalations(env: RecoveryEnv) -> list[Remediation]:
    """The env's audits of an escalation to on-call."""
    return [a for a in await env.audits() if a.action == "escalate"]


def _has_taint(node: dict[str, Any]) -> bool:
    return any(t.get("key") == TAINT for t in (node.get("spec") or {}).get("taints") or [])


async def test_xid_79_is_drained_rebooted_validated_and_released(recovery_env: Any) -> None:
    env: RecoveryEnv = await recovery_env()
    boot_before = (await env.node_obj())["status"]["nodeInfo"]["bootID"]
    marks_before = _nodeward_marks(await env.node_obj())
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
    assert _nodeward_marks(node) == marks_before  # no annotation or label left behind

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
    consumer = f"{env.bucket}-quarantines"  # the section's consumer is the bucket's name
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
    await _inject(env, 5, "ecc-dbe-burst")

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
    # reports next (drain_and_rma) reaches recovery as cordon's `already_quarantined`. On a
    # loaded machine cordon may fold both into the first quarantine, which then escalates at
    # once: either way on-call reads what failed, not only what the catalog says of it.
    env: RecoveryEnv = await recovery_env()
    await _inject(env, 1, "row-remap-failure")

    (escalation,) = await wait_for(lambda: _escalations(env), "the escalation")
    assert "RMA suggested" in escalation.reason and "drain_and_rma" in escalation.reason
    assert "row remapping failed" in escalation.reason, escalation.reason
    # The page goes out first, then the record is saved escalated.
    record = await wait_for(lambda: _record_at(env, Step.ESCALATED), "the record escalated")
    assert record.held
    audits = await env.audits()
    assert not [a for a in audits if a.action in ("reset", "reboot", "release")]
    assert _has_taint(await env.node_obj())  # quarantined, for a human


async def test_a_fault_the_catalog_sends_to_rma_from_the_start_escalates_and_names_it(
    recovery_env: Any,
) -> None:
    # Retired pages at the retirement limit: the GPU's first failure is already RMA, so the
    # quarantine goes to on-call at once, and on-call reads what failed.
    env: RecoveryEnv = await recovery_env()
    await _inject(env, 1, "retired-page-limit")

    (escalation,) = await wait_for(lambda: _escalations(env), "the escalation")
    assert "RMA suggested for GPU 1" in escalation.reason, escalation.reason
    assert "retired pages" in escalation.reason, escalation.reason
    record = await wait_for(lambda: _record_at(env, Step.ESCALATED), "the record escalated")
    assert "retired pages" in record.history[-1], record.history
    audits = await env.audits()
    assert not [a for a in audits if a.action in ("recover", "reset", "reboot", "release")]


async def test_a_gpu_failing_on_an_escalated_node_joins_the_escalation_and_reboots_nothing(
    recovery_env: Any,
) -> None:
    # What a clean clone's property test drew: GPU 1 goes to RMA (the node is on-call's),
    # then GPU 5 falls off the bus. Cordon adds GPU 5 to the quarantine; recovery must not
    # start a reboot of its own that would release the node behind on-call's back.
    env: RecoveryEnv = await recovery_env()
    await _inject(env, 1, "row-remap-failure")
    escalated = await wait_for(lambda: _record_at(env, Step.ESCALATED), "the record escalated")
    await _fall_off_the_bus(env, gpu=5)

    async def joined() -> list[Remediation]:
        return [
            a
            for a in await env.audits()
            if a.action == "quarantine"
            and a.outcome.value == "applied"
            and a.details.get("incident") == escalated.incident
            and a.trigger_event_id != escalated.incident
        ]

    await wait_for(joined, "GPU 5 added to the quarantine")

    async def acked() -> bool:  # recovery has decided on cordon's audit of GPU 5
        info = await env.bus.js.consumer_info("AUDIT", f"{env.bucket}-quarantines")
        return info.num_ack_pending == 0 and info.num_pending == 0

    await wait_for(acked, "recovery done with the audit")
    record = await env.record()
    assert record is not None and record.incident == escalated.incident
    assert record.step == Step.ESCALATED and record.held
    audits = await env.audits()
    # The first fault's incident either started a reset plan (then escalated) or, when the
    # quarantine recovery read already carried the row-remap failure (a loaded machine:
    # cordon folded both GPU 1 faults first), went to on-call at once; either way nothing
    # started for GPU 5 after it.
    recovers = [a.trigger_event_id for a in audits if a.action == "recover"]
    assert set(recovers) <= {escalated.incident}
    assert not [a for a in audits if a.action in ("reset", "reboot", "release")]
    node = await env.node_obj()
    assert _has_taint(node) and (hold_of(node) or {}).get("incident") == escalated.incident


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

    # On-call is paged, and the node is held: no automatic release puts it back.
    (page,) = await wait_for(lambda: _escalations(env), "the escalation")
    assert "needs a human" in page.reason and "started 1 recoveries within" in page.reason
    assert "RMA" not in page.reason
    record = await env.record()
    assert record is not None and record.incident != first.incident
    assert record.step == Step.ESCALATED and record.held and record.attempts == 0
    node = await env.node_obj()
    assert _has_taint(node) and hold_of(node) is not None
    assert hold_of(node)["incident"] == record.incident


async def test_a_gpu_that_fails_again_after_its_recovery_is_handed_to_on_call_as_flapping(
    recovery_env: Any,
) -> None:
    env: RecoveryEnv = await recovery_env(cordon={"flap_threshold": 2, "flap_window": "1h"})
    await _fall_off_the_bus(env)

    async def released() -> RecoveryRecord | None:
        record = await env.record()
        return record if record is not None and record.step == Step.RELEASED else None

    first = await wait_for(released, "the first recovery")
    await _fall_off_the_bus(env)  # the same GPU, within the flap window

    async def escalated() -> tuple[list[Remediation], RecoveryRecord] | None:
        # The audit is published before the record is saved ESCALATED: wait for both.
        pages = [a for a in await env.audits() if a.action == "escalate"]
        record = await env.record()
        done = pages and record is not None and record.step == Step.ESCALATED
        return (pages, record) if done and record is not None else None

    pages, record = await wait_for(escalated, "the flapping GPU escalated")
    (page,) = pages
    assert "turned failed 2 times" in page.reason and "flapping" in page.reason
    assert "RMA" not in page.reason
    assert record.incident != first.incident
    assert record.attempts == 0  # no second reboot
    node = await env.node_obj()
    assert _has_taint(node) and (hold_of(node) or {}).get("incident") == record.incident
    recovers = [a for a in await env.audits() if a.action == "recover"]
    assert [a.outcome.value for a in recovers] == ["applied"]  # the first recovery only


async def test_a_dry_running_recovery_audits_and_does_nothing(recovery_env: Any) -> None:
    env: RecoveryEnv = await recovery_env(dry_run=True)
    await _fall_off_the_bus(env)

    async def dry() -> list[Remediation]:
        return [a for a in await env.audits() if a.action == "recover"]

    (decision,) = await wait_for(dry, "the dry-run decision")
    assert decision.outcome.value == "dry_run" and decision.dry_run

    async def trigger_acked() -> bool:  # the handler is done with it: acked, nothing pending
        info = await env.bus.js.consumer_info("AUDIT", f"{env.bucket}-quarantines")
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


# Recovery never makes things worse -----------------------------------------------------


def _pods_of(env: RecoveryEnv) -> Callable[[], Awaitable[set[str]]]:
    async def names() -> set[str]:
        got = await env.admin.request(
            "GET", f"/api/v1/pods?fieldSelector=spec.nodeName%3D{env.node}"
        )
        return {f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in got["items"]}

    return names


def _guarded(node: str) -> dict[str, Any]:
    """Two workers under one budget that allows no disruption: one on the node."""
    return {
        "pods": [
            PodSeed(name="worker-0", namespace="ml-a", node=node, labels={"app": "w"}),
            PodSeed(name="worker-1", namespace="ml-a", node=f"{node}-spare0", labels={"app": "w"}),
            PodSeed(name="loose-0", namespace="ml-a", node=node),
        ],
        "pdbs": [PdbSeed(name="w", namespace="ml-a", selector={"app": "w"}, minAvailable=2)],
    }


async def _record_at(env: RecoveryEnv, *steps: Step) -> RecoveryRecord | None:
    record = await env.record()
    return record if record is not None and record.step in steps else None


async def _notices(env: RecoveryEnv, title: str) -> list[Any]:
    notices = await read_stream(env.bus, "NOTIFY", "notify.>", skip_invalid=True)
    return [
        n.data
        for n in notices
        if any(t.name == env.node for t in n.data.targets) and title in n.data.title
    ]


def _nodeward_marks(node: dict[str, Any]) -> dict[str, str]:
    meta = node["metadata"]
    both = {**(meta.get("labels") or {}), **(meta.get("annotations") or {})}
    return {k: v for k, v in both.items() if k.startswith("nodeward.io/")}


async def test_a_drain_a_budget_blocks_is_not_rebooted_pages_on_call_and_goes_on_once_free(
    recovery_env: Any,
) -> None:
    env: RecoveryEnv = await recovery_env(workload=_guarded)
    pods = _pods_of(env)
    boot_before = (await env.node_obj())["status"]["nodeInfo"]["bootID"]
    await _fall_off_the_bus(env)

    record = await wait_for(lambda: _record_at(env, Step.BLOCKED), "the drain found blocked")
    assert list(record.blocked) == ["ml-a/worker-0"], record.blocked
    assert "disruption budget w" in record.blocked["ml-a/worker-0"], record.blocked
    (page,) = await wait_for(lambda: _notices(env, "drain blocked"), "the page")
    assert page.severity.value == "critical"
    assert "ml-a/worker-0" in page.body and "disruption budget w" in page.body
    node = await env.node_obj()
    assert node["status"]["nodeInfo"]["bootID"] == boot_before
    assert "nodeward.io/reboot-required" not in (node["metadata"].get("labels") or {})
    assert _has_taint(node) and "ml-a/worker-0" in await pods()
    assert "ml-a/loose-0" not in await pods()  # the drain did evict what it could
    assert not [a for a in await env.audits() if a.action in ("reset", "reboot")]

    # The budget is freed (another replica came up elsewhere): the retry evicts the worker.
    await env.admin.request("DELETE", "/apis/policy/v1/namespaces/ml-a/poddisruptionbudgets/w")
    record = await wait_for(
        lambda: _record_at(env, Step.RELEASED, Step.ESCALATED, Step.GONE), "the recovery to end"
    )
    assert record.step == Step.RELEASED, record.history
    assert "ml-a/worker-0" not in await pods()
    node = await env.node_obj()
    assert node["status"]["nodeInfo"]["bootID"] != boot_before
    assert not _has_taint(node) and not node["spec"].get("unschedulable")
    evicted = [a for a in await env.audits() if a.action == "drain" and "had left" in a.reason]
    assert evicted and "ml-a/worker-0" in evicted[0].reason


async def test_an_exempt_pod_is_never_rebooted_the_node_is_held_for_a_human_until_released(
    recovery_env: Any,
) -> None:
    def pinned(node: str) -> dict[str, Any]:
        labels = {"nodeward.io/exempt": "true"}
        return {"pods": [PodSeed(name="pinned", namespace="ml-a", node=node, labels=labels)]}

    env: RecoveryEnv = await recovery_env(
        workload=pinned, drain_timeout="8s"
    )  # past the maintenance, even loaded
    before = _nodeward_marks(await env.node_obj())
    await _fall_off_the_bus(env)

    (escalation,) = await wait_for(lambda: _escalations(env), "the escalation")
    assert "ml-a/pinned" in escalation.reason and "exempt" in escalation.reason
    assert "RMA" not in escalation.reason and "stays quarantined" in escalation.reason
    (page,) = await wait_for(lambda: _notices(env, "needs a human"), "the page")
    assert page.severity.value == "critical"
    node = await env.node_obj()
    assert _has_taint(node) and "nodeward.io/release-hold" in node["metadata"]["annotations"]
    assert "ml-a/pinned" in await _pods_of(env)()
    assert not [a for a in await env.audits() if a.action in ("reset", "reboot")]

    reply = await control_request(
        env.bus.nc,
        ControlRequest(service="cordon", verb="release", operator="alice", target=env.node),
        timeout=10,
    )
    assert reply.status.value == "ok", reply.message

    async def clean() -> dict[str, Any] | None:
        node = await env.node_obj()
        return node if _nodeward_marks(node) == before else None

    node = await wait_for(clean, "nothing of nodeward's left on the node", timeout=15)
    assert not _has_taint(node) and not node["spec"].get("unschedulable")
    record = await env.record()
    assert record is not None and record.step == Step.ESCALATED and not record.held


async def test_a_pod_falco_isolated_is_kept_as_evidence_and_the_node_waits_for_the_operator(
    recovery_env: Any,
) -> None:
    def suspect(node: str) -> dict[str, Any]:
        labels = {ISOLATE_LABEL: "true"}
        return {"pods": [PodSeed(name="suspect", namespace="ml-a", node=node, labels=labels)]}

    env: RecoveryEnv = await recovery_env(workload=suspect)
    await _fall_off_the_bus(env)
    record = await wait_for(lambda: _record_at(env, Step.BLOCKED), "the drain found blocked")
    assert "evidence" in record.blocked["ml-a/suspect"], record.blocked
    assert "ml-a/suspect" in await _pods_of(env)()
    maintenance = [
        a for a in await env.audits() if a.actor == "service/checkpoint" and a.action == "drain"
    ]
    assert maintenance and "ml-a/suspect" in maintenance[0].details["kept"]

    # The investigation is over: the operator lifts the isolation; the pod is evicted, and
    # the recovery goes on.
    await env.admin.request(
        "PATCH",
        "/api/v1/namespaces/ml-a/pods/suspect",
        body={"metadata": {"labels": {ISOLATE_LABEL: None}}},
        content_type=MERGE_PATCH,
    )
    record = await wait_for(
        lambda: _record_at(env, Step.RELEASED, Step.ESCALATED, Step.GONE), "the recovery to end"
    )
    assert record.step == Step.RELEASED, record.history
    assert "ml-a/suspect" not in await _pods_of(env)()


async def test_an_operator_release_mid_drain_ends_every_hold_of_the_incident_within_seconds(
    recovery_env: Any,
) -> None:
    env: RecoveryEnv = await recovery_env(workload=_guarded, drain_deadline="120s")
    uid = env.bucket.removeprefix("recovery-")
    states = TypedKV(await env.bus.kv(f"checkpoint-{uid}"), MaintenanceState)

    async def draining() -> MaintenanceState | None:
        found = await states.get(state_key(env.node))
        ok = found is not None and found.value.phase == MaintenancePhase.DRAINING
        return found.value if ok else None

    await _fall_off_the_bus(env)
    await wait_for(draining, "the maintenance's drain under way")
    reply = await control_request(
        env.bus.nc,
        ControlRequest(service="cordon", verb="release", operator="alice", target=env.node),
        timeout=10,
    )
    assert reply.status.value == "ok", reply.message
    if "still held by nodeward's maintenance (cordon" not in reply.message:
        # Only if recovery took the maintenance back before cordon looked at the node.
        assert not (await env.node_obj())["spec"].get("unschedulable"), reply.message

    async def uncordoned() -> dict[str, Any] | None:
        node = await env.node_obj()
        annotations = node["metadata"].get("annotations") or {}
        done = (
            not node["spec"].get("unschedulable") and "nodeward.io/maintenance" not in annotations
        )
        return node if done else None

    node = await wait_for(
        uncordoned, "the maintenance's cordon and annotation taken back", timeout=10
    )
    assert not _has_taint(node)
    found = await states.get(state_key(env.node))
    assert found is not None and found.value.phase == MaintenancePhase.CANCELLED
    assert "ml-a/worker-0" in await _pods_of(env)()  # its eviction was given up
    record = await wait_for(lambda: _record_at(env, Step.GONE), "the recovery stopped")
    assert not record.held


async def test_an_escalated_node_is_not_released_by_the_healthy_period(recovery_env: Any) -> None:
    # After each reboot the GPUs read healthy (the sim driver is reset) but only 7 of 8 are
    # there: validation fails twice and recovery escalates. Cordon's healthy period (1 s)
    # would release the node; the release hold refuses it, once audited.
    env: RecoveryEnv = await recovery_env(
        agent_gpus=7, cordon={"healthy_period": "1s", "cooldown": "0s"}
    )
    await _fall_off_the_bus(env, gpu=2)
    record = await wait_for(
        lambda: _record_at(env, Step.ESCALATED, Step.RELEASED, Step.GONE), "the escalation", 90
    )
    assert record.step == Step.ESCALATED, record.history

    async def refused() -> list[Remediation]:
        return [
            a
            for a in await env.audits()
            if (a.actor, a.action, a.guard) == ("service/cordon", "release", "release_hold")
        ]

    (refusal,) = await wait_for(refused, "cordon's automatic release refused")
    assert refusal.outcome.value == "refused" and "held by service/recovery" in refusal.reason
    node = await env.node_obj()
    assert _has_taint(node) and node["spec"].get("unschedulable")
    assert "nodeward.io/release-hold" in node["metadata"]["annotations"]
    record = await env.record()
    assert record is not None and record.step == Step.ESCALATED and record.held


async def test_an_operator_may_force_a_blocked_drain_past_its_budget_and_it_is_audited(
    recovery_env: Any,
) -> None:
    def guarded_and_pinned(node: str) -> dict[str, Any]:
        workload = _guarded(node)
        pinned = {"nodeward.io/exempt": "true"}
        workload["pods"].append(PodSeed(name="pinned", namespace="ml-a", node=node, labels=pinned))
        return workload

    env: RecoveryEnv = await recovery_env(workload=guarded_and_pinned)
    ask = ControlRequest(
        service="recovery",
        verb="force-drain",
        operator="ann",
        reason="job checkpointed",
        target=env.node,
    )
    early = await control_request(env.bus.nc, ask, timeout=10)
    assert early.status.value == "refused" and "no recovery" in early.message, early.message

    await _fall_off_the_bus(env)
    await wait_for(lambda: _record_at(env, Step.BLOCKED), "the drain found blocked")
    reply = await control_request(env.bus.nc, ask, timeout=10)
    assert reply.status.value == "ok", reply.message
    assert "deleted 1 pod(s)" in reply.message and "ml-a/worker-0" in reply.message
    assert "ml-a/pinned: exempt" in reply.message  # an exemption is not a budget: it stays

    async def worker_gone() -> bool:  # deleted with its grace period: Terminating a while
        return "ml-a/worker-0" not in await _pods_of(env)()

    await wait_for(worker_gone, "the forced pod to terminate")
    assert "ml-a/pinned" in await _pods_of(env)()
    refused, forced = [a for a in await env.audits() if a.action == "force-drain"]
    assert (refused.outcome.value, refused.guard) == ("skipped", "not_blocked")
    assert forced.outcome.value == "applied" and forced.details["operator"] == "ann"
    assert "job checkpointed" in forced.reason
    record = await env.record()
    assert record is not None and record.step == Step.BLOCKED  # the exempt pod still blocks
    assert not [a for a in await env.audits() if a.action in ("reset", "reboot")]
