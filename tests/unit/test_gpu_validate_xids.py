"""Recovery's validation judges the XIDs a GPU saw since its reset or reboot by the catalog
(`schemas/data/xid-catalog.csv`): application and informational XIDs pass, the ones whose
action means the GPU is unhealthy fail it, naming the GPU and the catalog's words, and each
GPU's check reads only that GPU's XIDs. Run on a real `GpuAgent` over `SimNvml`, no bus."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, cast

import pytest
import pytest_asyncio

from agents.gpu.agent import GpuAgent
from agents.gpu.health import recovery_finding
from agents.gpu.settings import GpuAgentSettings
from agents.gpu.validate import XID_CHECK, Validator, xid_check
from agents.sources.nvml_compat import pynvml
from nodeward.bus import Bus
from schemas.recovery import CheckStatus, ResetRequest, ValidateRequest, ValidationReport
from schemas.xid import load_catalog
from sim.nvml import SimNvml, pci_bus_id
from tests.conftest import wait_for

NODE = "gpu-h100-01"
SETTINGS = GpuAgentSettings(
    poll_interval="60s",  # the validation polls for itself
    call_timeout="2s",
    kernel_log="off",
)


@dataclass
class Rig:
    sim: SimNvml
    agent: GpuAgent
    validator: Validator

    async def xid(self, gpu: int, xid: int) -> None:
        """Raise `xid` on `gpu` through the simulated driver; wait for the agent to record it."""
        before = len(self.agent.watches[gpu].xids)
        self.sim.inject_xid(gpu, xid)
        await wait_for(
            lambda: len(self.agent.watches[gpu].xids) > before, timeout=5, what=f"XID {xid}"
        )

    async def validate(self) -> ValidationReport:
        return await self.validator.validate(
            ValidateRequest(node=NODE, request_id="r1", expected_gpus=8)
        )


@pytest_asyncio.fixture
async def rig() -> AsyncIterator[Rig]:
    sim = SimNvml.build(NODE, count=8)
    agent = GpuAgent(sim, cast(Bus, None), SETTINGS, node=NODE)  # publishes into its outbox
    await agent._start()
    try:
        yield Rig(sim, agent, Validator(agent, dcgmi="", reset=_sim_reset(sim)))
    finally:
        await agent._close()


def _sim_reset(sim: SimNvml) -> Any:
    async def reset(index: int, bus_id: str | None) -> None:
        sim.recover(index)

    return reset


def _xid_check(report: ValidationReport, gpu: int) -> Any:
    (found,) = [c for c in report.checks if c.name == XID_CHECK and c.gpu == gpu]
    return found


async def test_application_xid_13_and_memory_xid_92_pass_validation(rig: Rig) -> None:
    await rig.xid(3, 13)
    await rig.xid(3, 92)
    report = await rig.validate()
    assert report.passed, report.failures()
    check = _xid_check(report, 3)
    assert check.status == CheckStatus.PASS
    assert check.detail == "ignored: XID 13 (application), XID 92 (memory: none)"


@pytest.mark.parametrize("xid", [31, 43, 45, 63, 74, 999])
async def test_other_xids_that_leave_the_gpu_healthy_pass(rig: Rig, xid: int) -> None:
    # 31, 43, 45: application; 63: a remap event (the remap checks judge it); 74: a link,
    # check_nvlink; 999: not in the catalog.
    await rig.xid(1, xid)
    report = await rig.validate()
    assert report.passed, report.failures()
    assert _xid_check(report, 1).detail.startswith(f"ignored: XID {xid} (")


async def test_xid_79_fails_naming_the_gpu_and_the_catalogs_words(rig: Rig) -> None:
    await rig.xid(3, 13)
    await rig.xid(3, 79)
    report = await rig.validate()
    assert not report.passed
    check = _xid_check(report, 3)
    assert check.status == CheckStatus.FAIL and check.bus_id == pci_bus_id(3)
    assert check.detail == (
        "XID 79 (reboot_node: GPU has fallen off the bus) since the agent started; "
        "ignored: XID 13 (application)"
    )
    xid_failures = [f for f in report.failures() if XID_CHECK in f]
    assert xid_failures == [
        f"GPU 3 ({pci_bus_id(3)}) {XID_CHECK}: XID 79 (reboot_node: GPU has fallen off the bus)"
        " since the agent started; ignored: XID 13 (application)"
    ]


async def test_xid_48_fails_with_reset_gpu_and_double_bit_ecc(rig: Rig) -> None:
    await rig.xid(5, 48)
    report = await rig.validate()
    assert not report.passed
    check = _xid_check(report, 5)
    assert check.status == CheckStatus.FAIL
    assert check.detail == "XID 48 (reset_gpu: Double Bit ECC Error) since the agent started"


async def test_an_xid_on_gpu_2_does_not_fail_gpu_5s_check(rig: Rig) -> None:
    await rig.xid(2, 79)
    report = await rig.validate()
    assert _xid_check(report, 5).status == CheckStatus.PASS
    assert _xid_check(report, 5).detail == ""
    failing = {(c.name, c.gpu) for c in report.checks if c.status == CheckStatus.FAIL}
    assert (XID_CHECK, 2) in failing and all(gpu == 2 for _, gpu in failing), failing
    assert [f for f in report.failures() if "XID 79" in f] == [
        f"GPU 2 ({pci_bus_id(2)}) {XID_CHECK}: XID 79 (reboot_node: GPU has fallen off the bus)"
        " since the agent started"
    ]


async def test_xids_after_a_reset_are_said_to_be_since_the_reset(rig: Rig) -> None:
    await rig.xid(4, 79)
    reply = await rig.validator.handle_reset(
        ResetRequest(node=NODE, gpus=[4], request_id="r0").model_dump_json().encode()
    )
    assert reply.ok, reply.error
    assert (await rig.validate()).passed  # the reset cleared GPU 4's history
    await rig.xid(4, 95)
    check = _xid_check(await rig.validate(), 4)
    assert check.status == CheckStatus.FAIL
    assert check.detail == "XID 95 (reset_gpu: Uncontained memory error) since the reset"


async def test_xid_154_is_judged_by_the_recovery_action_it_announced(rig: Rig) -> None:
    before = len(rig.agent.watches[6].xids)
    rig.sim.set_recovery_action(6, pynvml.NVML_GPU_RECOVERY_ACTION_GPU_RESET)
    await wait_for(lambda: len(rig.agent.watches[6].xids) > before, timeout=5, what="XID 154")
    check = _xid_check(await rig.validate(), 6)
    assert check.status == CheckStatus.FAIL
    assert check.detail == (
        "XID 154 (reset_gpu: driver recovery action: GPU Reset Required) since the agent started"
    )
    # The driver says no action is needed any more: resolved, the 154 itself is ignored.
    watch = rig.agent.watches[6]
    (first,) = watch.xids
    rig.sim.set_recovery_action(6, pynvml.NVML_GPU_RECOVERY_ACTION_NONE)
    # The driver's "none" clears the GPU's XID history; the new XID 154 is all it holds.
    await wait_for(
        lambda: [x.xid for x in watch.xids] == [154] and watch.xids[0] is not first,
        timeout=5,
        what="the history cleared, then XID 154",
    )
    report = await rig.validate()
    assert report.passed, report.failures()
    assert _xid_check(report, 6).detail == "ignored: XID 154 (driver recovery action: none)"


def test_the_rule_over_the_catalog() -> None:
    catalog = load_catalog()
    assert xid_check([13, 31, 43, 45, 92, 154], catalog) == (
        True,
        "ignored: XID 13 (application), XID 31 (application), XID 43 (application), "
        "XID 45 (application), XID 92 (memory: none), XID 154 (driver recovery action: none)",
    )
    ok, detail = xid_check([64, 13], catalog, since="since the reset")
    assert not ok
    assert detail == (
        "XID 64 (reset_gpu: GPU memory remapping failure) since the reset; "
        "ignored: XID 13 (application)"
    )
    drain = recovery_finding(pynvml.NVML_GPU_RECOVERY_ACTION_DRAIN_P2P)
    assert xid_check([154], catalog, recovery=drain) == (
        True,
        "ignored: XID 154 (driver recovery action: Drain P2P)",
    )
    reboot = recovery_finding(pynvml.NVML_GPU_RECOVERY_ACTION_NODE_REBOOT)
    assert xid_check([154], catalog, recovery=reboot)[0] is False
    # Every catalog row with a GPU-failing action fails, and no application row does.
    for xid, info in catalog.rows.items():
        if xid == 154:
            continue
        failing = info.action.value in {
            "reset_gpu",
            "drain_and_reset",
            "reboot_node",
            "drain_and_rma",
        }
        assert catalog.fails_validation(xid) is (failing and not info.is_application), xid
    assert not catalog.fails_validation(999)
    assert catalog.get(79).description == "GPU has fallen off the bus"
