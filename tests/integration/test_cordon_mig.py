"""One incident per physical GPU, against the sim cluster and a real NATS.

A MIG-partitioned GPU is published as its GPU (`3`) and each of its MIG instances
(`3-mig1-0` ... `3-mig7-0`), all with the same verdict. The driver's XID 154 ("GPU recovery
action changed from 0x0 (None) to 0x1 (GPU Reset Required)") on such a GPU used to make
eight quarantine decisions, eight `applied` audits for services.recovery to start from: it
is one decision now, the instances joining the GPU's incident quietly, and the audit names
the action the driver embedded (reset_gpu), which services.recovery follows.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from agents.gpu.health import classify, recovery_finding
from agents.sources.kmsg import DriverLineParser
from nodeward.bus.kv import TypedKV
from schemas import Event, make_event
from schemas.gpu import GpuHealth, GpuHeartbeat, GpuState, HealthState, MigInstance
from schemas.state.cordon import NodeRecord, node_key
from schemas.xid import load_catalog
from services.recovery.policy import Kind, decide
from services.recovery.state import Plan
from tests.conftest import wait_for
from tests.integration.cordon_fixtures import (
    H100,
    CordonEnv,
    EnvFactory,
    audits,
    h100_threshold_policy,
    health,
    settled,
)
from tests.integration.test_cordon import outcomes, tainted

pytestmark = pytest.mark.timeout(120)

MIGS = [
    MigInstance(gpu_instance_id=g, compute_instance_id=0, profile="1g.10gb") for g in range(1, 8)
]
KEYS = ["3"] + [f"3-mig{g}-0" for g in range(1, 8)]
RESET_REQUIRED = (
    "NVRM: Xid (PCI:0000:18:00): 154, GPU recovery action changed from 0x0 (None) "
    "to 0x1 (GPU Reset Required)"
)
REBOOT_REQUIRED = (
    "NVRM: Xid (PCI:0000:18:00): 154, GPU recovery action changed from 0x1 (GPU Reset "
    "Required) to 0x2 (Node Reboot Required)"
)


def mig_gpu(node: str, line: str | None, *, seq: int, gpu: int = 3) -> list[Event[GpuHealth]]:
    """What the GPU agent publishes for MIG GPU `gpu` after driver line `line` (None: the
    GPU healthy): one change for the GPU and one per MIG instance, in that order."""
    findings = []
    if line is not None:
        (found,) = DriverLineParser().feed(line)
        assert found.recovery_action is not None
        finding = recovery_finding(found.recovery_action)
        assert finding is not None
        findings.append(finding)
    verdict = classify(findings)
    return [
        make_event(
            GpuHealth(
                node=node,
                gpu_index=gpu,
                gpu_uuid=f"GPU-{node}-{gpu}",
                mig=mig,
                model=H100,
                state=verdict.state,
                reasons=list(verdict.reasons),
                recommended_action=verdict.action,
                observed_at=datetime.now(UTC),
                agent_boot_id="boot-1",
                sequence=seq,
            ),
            source=f"agent/gpu/{node}",
        )
        for mig in [None, *MIGS]
    ]


async def barrier(env: CordonEnv, name: str, seq: int) -> None:
    """Events of a node are handled in order: once a change of GPU 0 published after the
    others is in the node's record, they were all handled."""
    await env.publish(health(name, HealthState.HEALTHY, gpu=0, seq=seq))

    async def recorded() -> bool:
        entry = await TypedKV(
            await env.bus.kv(env.settings.services["cordon"]["bucket"]), NodeRecord
        ).get(node_key(name))
        gpu = entry.value.gpus.get("0") if entry is not None else None
        return gpu is not None and gpu.sequence == seq

    await wait_for(recorded, timeout=10, what="the barrier's change in the node's record")


async def record_of(env: CordonEnv, name: str) -> NodeRecord:
    bucket = env.settings.services["cordon"]["bucket"]
    entry = await TypedKV(await env.bus.kv(bucket), NodeRecord).get(node_key(name))
    assert entry is not None
    return entry.value


async def test_a_mig_gpus_xid_154_is_one_quarantine_whose_recovery_is_a_reset(
    cordon_env: EnvFactory,
) -> None:
    env = await cordon_env()
    await env.start()
    name = env.nodes[0]
    await env.publish(*mig_gpu(name, RESET_REQUIRED, seq=1))
    await barrier(env, name, 2)

    quarantines = await audits(env.bus, name, "quarantine")
    assert outcomes(quarantines) == [("applied", None)]  # one decision, not eight
    (applied,) = quarantines
    assert applied.details["recommended_actions"] == ["reset_gpu"]
    assert applied.details["xids"] == [154]
    assert applied.details["gpus"] == ["3"]
    assert tainted(await env.node(name))
    record = await record_of(env, name)
    assert record.quarantine is not None
    assert record.quarantine.gpus == KEYS  # the instances joined the GPU's incident
    # services.recovery reads that audit: the driver's action, a GPU reset, never RMA.
    decision = decide(
        applied.details["recommended_actions"], applied.details["xids"], load_catalog()
    )
    assert (decision.kind, decision.plan) == (Kind.RECOVER, Plan.RESET), decision.why

    # The driver asks for more (a node reboot): the fault grew, said once for the GPU.
    await env.publish(*mig_gpu(name, REBOOT_REQUIRED, seq=3))
    await barrier(env, name, 4)
    quarantines = await audits(env.bus, name, "quarantine")
    assert outcomes(quarantines) == [("applied", None), ("skipped", "already_quarantined")]
    assert quarantines[1].details["recommended_actions"] == ["reboot_node"]

    # Heartbeats restating the GPU and its instances change nothing.
    beat = GpuHeartbeat(
        node=name,
        gpus=[
            GpuState(
                gpu_index=e.data.gpu_index,
                gpu_uuid=e.data.gpu_uuid,
                mig=e.data.mig,
                state=e.data.state,
                reasons=e.data.reasons,
                recommended_action=e.data.recommended_action,
                sequence=3,
                changed_at=e.data.observed_at,
            )
            for e in mig_gpu(name, REBOOT_REQUIRED, seq=3)
        ],
        interval_s=30,
        observed_at=datetime.now(UTC),
        agent_boot_id="boot-1",
    )
    await env.publish(make_event(beat, source=f"agent/gpu/{name}"))
    consumer = env.settings.services["cordon"]["consumer"] + "-heartbeats"

    await wait_for(
        lambda: settled(env.bus, "HEARTBEATS", consumer, delivered=1),
        timeout=10,
        what="the heartbeat settled",
    )
    assert len(await audits(env.bus, name, "quarantine")) == 2

    # The GPU and its instances healthy again: one release.
    await env.publish(*mig_gpu(name, None, seq=5))

    async def released() -> list[Any]:
        return [r for r in await audits(env.bus, name, "release") if r.outcome.value == "applied"]

    assert len(await wait_for(released, timeout=10, what="the release")) == 1
    assert not tainted(await env.node(name))


async def test_a_mig_gpu_on_an_exempt_node_is_skipped_once(cordon_env: EnvFactory) -> None:
    env = await cordon_env(nodes={1: {"labels": {"nodeward.io/exempt": "true"}}})
    await env.start()
    name = env.nodes[1]
    await env.publish(*mig_gpu(name, RESET_REQUIRED, seq=1))
    await barrier(env, name, 2)
    assert outcomes(await audits(env.bus, name, "quarantine")) == [("skipped", "exempt")]
    assert not tainted(await env.node(name))


async def test_a_mig_gpu_counts_once_toward_the_device_plugin_threshold(
    cordon_env: EnvFactory, tmp_path: Path
) -> None:
    """Two failed H100s quarantine the node: one MIG GPU (its GPU and seven instances) is
    one failed GPU, excluded once; a second GPU reaches the threshold."""
    env = await cordon_env(count=1, policy_file=h100_threshold_policy(tmp_path))
    await env.start()
    name = env.nodes[0]
    await env.publish(*mig_gpu(name, RESET_REQUIRED, seq=1))
    await barrier(env, name, 2)
    assert outcomes(await audits(env.bus, name, "gpu_exclude")) == [("applied", None)]
    assert await audits(env.bus, name, "quarantine") == []
    node = await env.node(name)
    assert not tainted(node) and not node["spec"].get("unschedulable")
    assert sorted((await record_of(env, name)).devices) == ["3"]

    # A second physical GPU fails: the threshold of two is reached, the node quarantined.
    await env.publish(*mig_gpu(name, RESET_REQUIRED, seq=1, gpu=5))

    async def quarantined() -> list[Any]:
        return await audits(env.bus, name, "quarantine")

    found = await wait_for(quarantined, timeout=10, what="the node quarantined")
    await barrier(env, name, 4)
    assert outcomes(await audits(env.bus, name, "quarantine")) == [("applied", None)]
    assert found[0].details["gpus"] == ["5"]
    assert tainted(await env.node(name))
