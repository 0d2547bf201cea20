"""A GPU reset drains only the pods holding the failed GPU; a reboot drains the node.

services.recovery with its real peers (NATS, the sim cluster, the cordon and checkpoint
services, a simulated node's GPU agent, the simulated reboot operator). The agent's
pod-resources is a fixed map by the sim GPUs' UUIDs (time-sliced: several pods under one
ID; MIG: pods under an instance's UUID), or the real client on a node without the kubelet's
socket (the holders unknown)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from agents.sources.podresources import KubeletPods
from agents.sources.pods import PodSource, StaticPods
from nodeward.bus import Bus
from nodeward.bus.control import request as control_request
from nodeward.kube.client import MERGE_PATCH
from schemas.common import PodRef
from schemas.control import ControlRequest
from schemas.maintenance import MaintenancePhase
from services.recovery.state import RecoveryRecord, Step
from sim.cluster.seed import PdbSeed, PodSeed
from sim.inject import InjectRequest, request_injection
from sim.nvml import SimMig, SimNvml
from tests.integration.cordon_fixtures import read_stream
from tests.integration.recovery_fixtures import RecoveryEnv, recovery_platform, wait_for

pytestmark = pytest.mark.timeout(120)

NS = "ml-a"
TAINT = "nodeward.io/gpu-unhealthy"
OTHERS = ["w0", "w1", "w2"]  # one pod on each of GPUs 0-2
SHARED = ["ts-a", "ts-b"]  # GPU 3 (or its second MIG instance) time-sliced


@pytest.fixture
async def recovery_env(
    bus: Bus, nats_url: str, tmp_path: Path
) -> AsyncIterator[Callable[..., Awaitable[RecoveryEnv]]]:
    async with recovery_platform(bus, nats_url, tmp_path) as make:
        yield make


def _workload(*names: str, pdbs: list[PdbSeed] | None = None) -> Callable[[str], dict[str, Any]]:
    """Pods `names` (label app=<name>) and a CPU-only one (`cpu`) on the node."""

    def seed(node: str) -> dict[str, Any]:
        pods = [
            PodSeed(name=n, namespace=NS, node=node, gpus=0 if n == "cpu" else 1, labels={"app": n})
            for n in (*names, "cpu")
        ]
        return {"pods": pods, "pdbs": pdbs or []}

    return seed


def _ref(name: str) -> PodRef:
    return PodRef(namespace=NS, name=name)


def _held(sim: SimNvml, gpu3: list[str]) -> dict[str, list[PodRef]]:
    """Pods w0-w2 on GPUs 0-2, `gpu3` sharing GPU 3."""
    held = {sim.gpus[i].uuid: [_ref(n)] for i, n in enumerate(OTHERS)}
    return held | {sim.gpus[3].uuid: [_ref(n) for n in gpu3]}


def _time_sliced(sim: SimNvml) -> PodSource:
    return StaticPods(_held(sim, SHARED))


def _mig(sim: SimNvml) -> PodSource:
    """GPU 3 in two MIG instances: `mig-a` holds the first, ts-a and ts-b time-slice the
    second (several pods under one MIG device ID)."""
    gpu = sim.gpus[3]
    gpu.migs = [SimMig(i, 0, "3g.40gb", f"MIG-{gpu.uuid[4:12]}-000{i}") for i in (1, 2)]
    held: Mapping[str, list[PodRef]] = {
        **{sim.gpus[i].uuid: [_ref(n)] for i, n in enumerate(OTHERS)},
        gpu.migs[0].uuid: [_ref("mig-a")],
        gpu.migs[1].uuid: [_ref(n) for n in SHARED],
    }
    return StaticPods(held)


async def _inject(env: RecoveryEnv, fault: str, gpu: int = 3) -> None:
    reply = await request_injection(env.bus.nc, env.node, InjectRequest(gpu=gpu, fault=fault))
    assert reply.ok, reply.error


async def _pods(env: RecoveryEnv) -> dict[str, dict[str, Any]]:
    got = await env.admin.request("GET", f"/api/v1/pods?fieldSelector=spec.nodeName%3D{env.node}")
    return {f"{p['metadata']['namespace']}/{p['metadata']['name']}": p for p in got["items"]}


async def _ended(env: RecoveryEnv) -> RecoveryRecord | None:
    record = await env.record()
    return record if record is not None and record.terminal else None


async def _at(env: RecoveryEnv, step: Step) -> RecoveryRecord | None:
    record = await env.record()
    return record if record is not None and record.step == step else None


def _released(node: dict[str, Any]) -> bool:
    taints = (node.get("spec") or {}).get("taints") or []
    return not any(t.get("key") == TAINT for t in taints) and not node["spec"].get("unschedulable")


async def _drain_lines(env: RecoveryEnv) -> list[str]:
    """The reasons of recovery's drain audits (the story's RECOVERY lines)."""
    return [
        a.reason
        for a in await env.audits()
        if a.actor == "service/recovery" and a.action == "drain"
    ]


async def _done(env: RecoveryEnv) -> Any:
    """The maintenance's `done` event for the env's node."""
    events = await read_stream(env.bus, "MAINTENANCE", f"maintenance.done.{env.node}")
    assert len(events) == 1, events
    return events[0].data


async def _reset_of_gpu_3_evicts_only(
    env: RecoveryEnv, evicted: list[str], uids: dict[str, str]
) -> RecoveryRecord:
    """GPU 3 fails with uncorrectable ECC (a reset): only `evicted` leave; the rest run on,
    the same pods (`uids`); GPU 3 is reset, the node released."""
    boot_before = (await env.node_obj())["status"]["nodeInfo"]["bootID"]
    await _inject(env, "ecc-dbe-burst")
    record = await wait_for(lambda: _ended(env), "the recovery to end")
    assert record.step == Step.RELEASED, record.history
    assert (record.plan.value, record.gpus) == ("reset", [3])
    assert record.drain_pods == sorted(f"{NS}/{n}" for n in evicted), record.drain_pods
    left = await _pods(env)
    for name in evicted:
        assert f"{NS}/{name}" not in left, name
    for key, uid in uids.items():
        if key.removeprefix(f"{NS}/") in evicted:
            continue
        assert key in left, key  # never evicted: the same pod, still running
        assert left[key]["metadata"]["uid"] == uid and left[key]["status"]["phase"] == "Running"
    node = await env.node_obj()
    assert node["status"]["nodeInfo"]["bootID"] == boot_before  # reset, not rebooted
    assert _released(node)
    audits = [(a.actor, a.action, a.outcome.value) for a in await env.audits()]
    assert ("service/recovery", "reset", "applied") in audits
    assert ("service/recovery", "release", "applied") in audits
    done = await _done(env)
    assert done.phase == MaintenancePhase.DONE
    assert sorted(f"{p.namespace}/{p.name}" for p in done.pods or []) == record.drain_pods
    assert done.drained == record.drain_pods
    (asked, *_) = await _drain_lines(env)
    assert f"only its {len(evicted)} pod(s) are drained" in asked, asked
    return record


async def _uids(env: RecoveryEnv) -> dict[str, str]:
    return {key: p["metadata"]["uid"] for key, p in (await _pods(env)).items()}


async def test_a_gpu_reset_evicts_only_the_pods_time_slicing_that_gpu(recovery_env: Any) -> None:
    env: RecoveryEnv = await recovery_env(
        workload=_workload(*OTHERS, *SHARED), gpu_pods=_time_sliced
    )
    await _reset_of_gpu_3_evicts_only(env, SHARED, await _uids(env))


async def test_a_gpu_reset_evicts_its_mig_instances_pods_and_their_time_sliced_ones(
    recovery_env: Any,
) -> None:
    env: RecoveryEnv = await recovery_env(
        workload=_workload(*OTHERS, "mig-a", *SHARED), gpu_pods=_mig
    )
    record = await _reset_of_gpu_3_evicts_only(env, ["mig-a", *SHARED], await _uids(env))
    assert record.gpus == [3]


async def test_a_reboot_still_drains_the_whole_node(recovery_env: Any) -> None:
    env: RecoveryEnv = await recovery_env(
        workload=_workload(*OTHERS, *SHARED), gpu_pods=_time_sliced
    )
    boot_before = (await env.node_obj())["status"]["nodeInfo"]["bootID"]
    await _inject(env, "fallen-off-bus")  # XID 79: a reboot
    record = await wait_for(lambda: _ended(env), "the recovery to end")
    assert record.step == Step.RELEASED, record.history
    assert record.plan.value == "reboot" and record.drain_pods is None
    assert not await _pods(env)  # every pod, the CPU-only one too
    node = await env.node_obj()
    assert node["status"]["nodeInfo"]["bootID"] != boot_before and _released(node)
    assert (await _done(env)).pods is None
    (asked, *_) = await _drain_lines(env)
    assert "a reboot drains the whole node" in asked, asked


async def test_a_reset_whose_holders_are_not_known_drains_the_whole_node_and_says_why(
    recovery_env: Any, tmp_path: Path
) -> None:
    # No kubelet pod-resources socket on the node: the agent cannot say who holds GPU 3.
    env: RecoveryEnv = await recovery_env(
        workload=_workload(*OTHERS, *SHARED),
        gpu_pods=lambda _: KubeletPods(tmp_path / "no-kubelet.sock"),
    )
    await _inject(env, "ecc-dbe-burst")
    record = await wait_for(lambda: _ended(env), "the recovery to end")
    assert record.step == Step.RELEASED, record.history
    assert record.plan.value == "reset" and record.drain_pods is None
    assert "not known" in record.drain_why and "whole node" in record.drain_why
    assert not await _pods(env)
    assert (await _done(env)).pods is None
    (asked, *_) = await _drain_lines(env)
    assert "the pods holding GPU 3 are not known" in asked and "whole node" in asked, asked
    (started,) = [a for a in await env.audits() if a.action == "recover"]
    assert started.details["drain_pods"] is None and "not known" in started.details["drain"]
    assert ("reset", "applied") in [(a.action, a.outcome.value) for a in await env.audits()]


async def test_a_budget_on_a_holder_blocks_the_reset_and_a_force_drain_takes_only_holders(
    recovery_env: Any,
) -> None:
    # ts-a (GPU 3) and w1 (GPU 1) are each under a budget that allows no disruption; w0
    # (GPU 0) is exempt. Only ts-a holds the reset back; the operator's force-drain deletes
    # it alone: w1's budget and w0's exemption are no business of GPU 3's reset.
    pdbs = [
        PdbSeed(name=n, namespace=NS, selector={"app": n}, minAvailable=1) for n in ("ts-a", "w1")
    ]
    env: RecoveryEnv = await recovery_env(
        workload=_workload(*OTHERS, *SHARED, pdbs=pdbs), gpu_pods=_time_sliced
    )
    await env.admin.request(
        "PATCH",
        f"/api/v1/namespaces/{NS}/pods/w0",
        body={"metadata": {"labels": {"nodeward.io/exempt": "true"}}},
        content_type=MERGE_PATCH,
    )
    await _inject(env, "ecc-dbe-burst")
    record = await wait_for(lambda: _at(env, Step.BLOCKED), "the drain found blocked")
    assert list(record.blocked) == [f"{NS}/ts-a"], record.blocked
    assert "disruption budget ts-a" in record.blocked[f"{NS}/ts-a"], record.blocked
    pods = await _pods(env)
    assert f"{NS}/ts-b" not in pods and f"{NS}/ts-a" in pods
    assert not [a for a in await env.audits() if a.action == "reset"]

    ask = ControlRequest(
        service="recovery", verb="force-drain", operator="ann", reason="saved", target=env.node
    )
    reply = await control_request(env.bus.nc, ask, timeout=10)
    assert reply.status.value == "ok", reply.message
    assert f"deleted 1 pod(s) on {env.node}: {NS}/ts-a;" in reply.message, reply.message
    record = await wait_for(lambda: _ended(env), "the recovery to end")
    assert record.step == Step.RELEASED, record.history
    pods = await _pods(env)
    assert f"{NS}/ts-a" not in pods
    assert {f"{NS}/{n}" for n in (*OTHERS, "cpu")} <= set(pods)  # w0 exempt, w1 budgeted
