"""A hung node recovered through its BMC, with real peers: NATS, the sim cluster (its node
lifecycle controller turns a node whose kubelet stops renewing its lease `Ready=Unknown`),
OpenIPMI's `ipmi_sim` as the node's BMC, whose chassis power runs the node's "machine"
(`launch.sim_node`: its kubelet's lease and boot), the cordon, checkpoint and recovery
services and the node's simulated GPU agent.

The machine is hung with SIGSTOP: its lease goes stale, it answers neither the reboot
request nor the BMC's soft shutdown; only a hard power off (ipmi_sim's SIGKILL) stops it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from nodeward.bus import Bus
from nodeward.kube.client import STRATEGIC_PATCH
from schemas.remediation import Outcome, Remediation
from services.recovery.hang import OUT_OF_SERVICE
from services.recovery.state import Plan, Step
from sim.cluster.seed import PodSeed
from sim.inject import InjectRequest, request_injection
from tests.integration.bmc_fixtures import bmc_node, ladder
from tests.integration.crash_fixtures import ServiceProcess
from tests.integration.recovery_fixtures import RecoveryEnv, recovery_platform, wait_for
from tests.ipmi_sim import IpmiSim, power_bmc  # noqa: F401

pytestmark = pytest.mark.timeout(150)


@pytest.fixture
async def platform(
    bus: Bus, nats_url: str, tmp_path: Path
) -> AsyncIterator[Callable[..., Awaitable[RecoveryEnv]]]:
    async with recovery_platform(bus, nats_url, tmp_path) as make:
        yield make


async def released(env: RecoveryEnv) -> bool:
    """The node's recovery released it (an escalation fails the test, with its history)."""
    record = await env.record()
    assert record is None or record.step != Step.ESCALATED, record and record.history
    return record is not None and record.step == Step.RELEASED


def _acts(audits: list[Remediation]) -> list[tuple[str, str]]:
    return [(a.action, a.outcome.value) for a in audits]


async def test_a_node_hung_after_xid_79_is_power_cycled_fenced_validated_and_released(
    platform: Callable[..., Awaitable[RecoveryEnv]],
    power_bmc: Callable[..., IpmiSim],  # noqa: F811 - the fixture
    nats_url: str,
) -> None:
    env, node = await bmc_node(
        platform,
        power_bmc,
        nats_url=nats_url,
        ladder=ladder(
            ("reboot", "2s"), ("power-off-on", "8s"), ("power-cycle", "40s"), ("oncall", "1s")
        ),
    )
    first_boot = node.boots[0]
    reply = await request_injection(
        env.bus.nc, env.node, InjectRequest(gpu=3, fault="fallen-off-bus")
    )
    assert reply.ok, reply.error

    async def recovering() -> bool:
        record = await env.record()
        return record is not None

    await wait_for(recovering, "a recovery of the quarantined node")
    node.hang()

    await wait_for(lambda: released(env), "the hung node back in service", timeout=110)
    record = await env.record()
    assert record is not None and record.plan == Plan.HANG and not record.fenced
    audits = await env.audits()
    acts = _acts(audits)
    # the soft shutdown is asked, never confirmed (a hung OS ignores ACPI): the hard one is
    assert ("power-off", "applied") in acts and ("fence", "applied") in acts
    fence = acts.index(("fence", "applied"))
    offs = [i for i, a in enumerate(acts) if a == ("power-off", "applied")]
    assert offs and offs[0] < fence
    for action in ("power-on", "validate", "unfence", "release"):
        assert (action, "applied") in acts[fence:], (action, acts)
    assert acts.index(("unfence", "applied")) < acts.index(("release", "applied"))
    hard = [a for a in audits if a.action == "power-off" and a.details.get("graceful") is False]
    assert hard and hard[0].outcome == Outcome.APPLIED, acts  # its own record, after the soft
    said_off = [a for a in audits if a.action == "power-off" and "is off" in a.reason]
    assert said_off, "the BMC's chassis status confirmed the power off before the fence"
    # the taint showed only once the machine was off; it is gone, the node back on a new boot
    assert node.taint_seen_running is False  # the machine was gone when the taint showed
    got = await env.node_obj()
    assert not any(t["key"] == OUT_OF_SERVICE for t in got["spec"].get("taints", []))
    assert len(node.boots) == 2 and node.boots[0] == first_boot, node.boots


async def test_wrong_bmc_credentials_escalate_in_one_line_and_never_fence(
    platform: Callable[..., Awaitable[RecoveryEnv]],
    power_bmc: Callable[..., IpmiSim],  # noqa: F811 - the fixture
    nats_url: str,
) -> None:
    env, node = await bmc_node(
        platform,
        power_bmc,
        nats_url=nats_url,
        ladder=ladder(("power-cycle", "20s"), ("oncall", "1s")),
        password="not-the-password",
    )
    node.hang()

    async def escalated() -> list[Remediation]:
        return [a for a in await env.audits() if a.action == "escalate"]

    page = (await wait_for(escalated, "on-call told", timeout=60))[0]
    assert "wrong credentials" in page.reason and "not fenced" in page.reason
    assert "not-the-password" not in page.reason
    assert "\n" not in page.reason
    got = await env.node_obj()
    assert not any(t["key"] == OUT_OF_SERVICE for t in got["spec"].get("taints", []))
    assert node.bmc is not None and node.bmc.power_status() == "on"  # never powered off


async def test_a_pause_stops_the_ladder_mid_way_until_resumed(
    platform: Callable[..., Awaitable[RecoveryEnv]],
    power_bmc: Callable[..., IpmiSim],  # noqa: F811 - the fixture
    nats_url: str,
) -> None:
    from nodeward.bus.control import request as control_request
    from schemas.control import ControlRequest

    env, node = await bmc_node(
        platform,
        power_bmc,
        nats_url=nats_url,
        ladder=ladder(("reboot", "6s"), ("power-cycle", "40s"), ("oncall", "1s")),
    )

    async def ask(verb: str) -> None:
        request = ControlRequest(
            service="recovery", verb=verb, operator="jdoe", reason="storm: hands off"
        )
        reply = await control_request(env.bus.nc, request, timeout=5)
        assert reply.status.value == "ok", reply.message

    node.hang()

    async def on_first_rung() -> bool:
        record = await env.record()
        return record is not None and record.step == Step.HUNG and record.rung == 0

    await wait_for(on_first_rung, "the ladder's first rung (the reboot request)", timeout=30)
    await ask("pause")

    async def refused() -> list[Remediation]:
        return [a for a in await env.audits() if a.guard == "paused"]

    said = await wait_for(refused, "the power off refused by the pause", timeout=30)
    assert said[0].action == "power-off" and said[0].outcome == Outcome.REFUSED
    assert "paused by jdoe" in said[0].reason
    assert node.bmc is not None and node.bmc.power_status() == "on"
    await ask("resume")

    await wait_for(lambda: released(env), "the ladder done after the resume", timeout=90)
    assert len([a for a in await env.audits() if a.guard == "paused"]) == 1  # audited once


@pytest.mark.parametrize(
    "point",
    [
        "recovery.hung",  # the ladder entered, nothing asked yet
        "recovery.power_off_sent",  # the BMC told to power off, not yet saved
        "recovery.fenced",  # the out-of-service taint on, not yet saved
        "recovery.validating",  # back on a new boot, not yet validated
        "recovery.releasing",  # validated, the taint still on
    ],
)
async def test_a_recovery_killed_at_each_step_resumes_without_a_second_power_cycle(
    platform: Callable[..., Awaitable[RecoveryEnv]],
    power_bmc: Callable[..., IpmiSim],  # noqa: F811 - the fixture
    nats_url: str,
    tmp_path: Path,
    point: str,
) -> None:
    env, node = await bmc_node(
        platform,
        power_bmc,
        nats_url=nats_url,
        ladder=ladder(("power-cycle", "40s"), ("oncall", "1s")),
        in_process=False,
    )
    proc = ServiceProcess.of("recovery", env.settings_for("recovery"), tmp_path, nats_url)
    try:
        proc.start(failpoint=point)
        node.hang()
        assert await proc.exited(timeout=60) == -9, proc.tail()  # SIGKILLed at the point
        proc.start()

        async def ended() -> Any:
            record = await env.record()
            return record if record is not None and record.terminal else None

        record = await wait_for(ended, f"the recovery to end; log: {proc.tail()}", timeout=90)
        assert record.step == Step.RELEASED, record.history
        assert len(node.boots) == 2, node.boots  # one power on, whatever the kill
        assert node.taint_seen_running is False  # the machine was gone when the taint showed
        got = await env.node_obj()
        assert not any(t["key"] == OUT_OF_SERVICE for t in got["spec"].get("taints", []))
    finally:
        proc.stop()


async def test_an_out_of_service_taint_someone_else_placed_is_left_to_them(
    platform: Callable[..., Awaitable[RecoveryEnv]],
    power_bmc: Callable[..., IpmiSim],  # noqa: F811 - the fixture
    nats_url: str,
) -> None:
    env, node = await bmc_node(
        platform,
        power_bmc,
        nats_url=nats_url,
        ladder=ladder(("power-cycle", "40s"), ("oncall", "1s")),
    )
    theirs = {"key": OUT_OF_SERVICE, "value": "by-hand", "effect": "NoSchedule"}
    got = await env.node_obj()
    await env.admin.request(
        "PATCH",
        f"/api/v1/nodes/{env.node}",
        body={
            "metadata": {"resourceVersion": got["metadata"]["resourceVersion"]},
            "spec": {"taints": [*got["spec"].get("taints", []), theirs]},
        },
        content_type="application/merge-patch+json",
    )
    node.hang()

    await wait_for(lambda: released(env), "the hung node back in service", timeout=90)
    record = await env.record()
    assert record is not None and not record.fenced
    fence = [a for a in await env.audits() if a.action == "fence"]
    assert fence and fence[0].details.get("already") == "placed by someone else: left to them"
    assert not [a for a in await env.audits() if a.action == "unfence"]
    got = await env.node_obj()
    left = [t for t in got["spec"].get("taints", []) if t["key"] == OUT_OF_SERVICE]
    assert [(t["value"], t["effect"]) for t in left] == [("by-hand", "NoSchedule")]


async def test_a_node_that_still_answers_is_never_powered_off_over_its_pods(
    platform: Callable[..., Awaitable[RecoveryEnv]],
    power_bmc: Callable[..., IpmiSim],  # noqa: F811 - the fixture
    nats_url: str,
) -> None:
    """KernelDeadlock on a node whose kubelet still answers (Ready), a user's pod on it: the
    BMC power off is refused (audited once, with the pod), the machine and the pod stay."""

    def workload(name: str) -> dict[str, Any]:
        return {"pods": [PodSeed(name="session-0", namespace="ml-a", node=name)]}

    env, node = await bmc_node(
        platform,
        power_bmc,
        nats_url=nats_url,
        ladder=ladder(("power-cycle", "40s"), ("oncall", "1s")),
        hang={"conditions": {"KernelDeadlock": "0s"}},
        workload=workload,
    )
    at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    deadlock = {"type": "KernelDeadlock", "status": "True", "reason": "DockerHung",
                "message": "task docker:7 blocked", "lastTransitionTime": at,
                "lastHeartbeatTime": at}  # fmt: skip
    await env.admin.request(
        "PATCH",
        f"/api/v1/nodes/{env.node}/status",
        body={"status": {"conditions": [deadlock]}},
        content_type=STRATEGIC_PATCH,
    )

    async def refused() -> list[Remediation]:
        return [a for a in await env.audits() if a.guard == "pods_left"]

    said = (await wait_for(refused, "the power off refused over the pod", timeout=30))[0]
    assert said.action == "power-off" and said.outcome == Outcome.REFUSED
    assert "ml-a/session-0" in said.reason and "is Ready" in said.reason
    assert node.bmc is not None and node.bmc.power_status() == "on"
    pod = await env.admin.request("GET", "/api/v1/namespaces/ml-a/pods/session-0")
    assert not pod["metadata"].get("deletionTimestamp")
    assert len(await refused()) == 1  # audited once while it lasts
