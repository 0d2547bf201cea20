"""Per-GPU exclusion with real NATS and the sim cluster: one failed GPU on a DRA node gets one
DeviceTaintRule and its node stays in service (the capacity view counts seven free); the
rule goes when the GPU recovers; a device-plugin node is quarantined only at its threshold."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nodeward.config import Settings
from nodeward.kube.devices import GROUP
from schemas import Event, make_event
from schemas.common import PodRef
from schemas.gpu import GpuHealth, HealthState
from schemas.notify import Severity
from schemas.state.capacity import SNAPSHOT
from services.capacity.service import build as build_capacity
from sim.nvml import gpu_uuid
from tests.conftest import wait_for
from tests.integration.capacity_fixtures import capacity_settings
from tests.integration.cordon_fixtures import (
    H100,
    CordonEnv,
    EnvFactory,
    audits,
    failed,
    h100_threshold_policy,
    health,
    heartbeat,
    notifications,
    settled,
)
from tests.integration.test_cordon import outcomes, tainted

pytestmark = pytest.mark.timeout(120)

DRA = {"dra": {"driver": "gpu.nvidia.com"}}
RULES = f"/apis/{GROUP}/v1/devicetaintrules"


def on_gpu(
    event: Event[GpuHealth], *, real_uuid: bool = True, pods: list[PodRef] | None = None
) -> Event[GpuHealth]:
    """`event` with the GPU's UUID as the simulated driver (and the DRA slice) has it, and
    the pods the agent saw on it."""
    data = event.data
    update: dict[str, Any] = {"model": H100, "pods": pods or []}
    if real_uuid:
        update["gpu_uuid"] = gpu_uuid(data.node, data.gpu_index)
    return make_event(data.model_copy(update=update), source=event.source)


async def _two(pending: Any) -> list[Any]:
    """The notices once the release's is among them."""
    got = await pending
    return got if any(n.resolves for n in got) else []


async def rules(env: CordonEnv) -> list[dict[str, Any]]:
    reply = await env.admin.client.request("GET", RULES)
    return list(reply.get("items") or [])


async def start_capacity(env: CordonEnv, tmp_path: Path, node: str) -> Settings:
    uid = env.nodes[0].split("-")[1]
    kubeconfig = env.sim.write_kubeconfig(tmp_path / f"kc-capacity-{uid}", identity="capacity")
    settings = capacity_settings(
        env.settings.bus.url, kubeconfig, uid, [node], debounce="0.1s", max_delay="0.5s"
    )
    daemon = await build_capacity(settings)
    await daemon.start()
    env.daemons.append(daemon)
    return settings


async def counts(env: CordonEnv, settings: Settings, node: str) -> dict[str, int] | None:
    kv = await env.bus.js.key_value(settings.services["capacity"]["bucket"])
    try:
        entry = await kv.get(SNAPSHOT.key())
    except Exception:  # noqa: BLE001 - not written yet
        return None
    snap = SNAPSHOT.load(entry.value) if entry.value else None
    for n in snap.nodes if snap else []:
        if n.node == node and "gpu" in n.profiles:
            c = n.profiles["gpu"]
            return {"free": c.free, "unhealthy": c.unhealthy, "quarantined": c.quarantined}
    return None


async def _taint_audited(
    env: CordonEnv, name: str, outcome: tuple[str, str], timeout: float, what: str
) -> None:
    """Wait until a `device_taint` audit of `name` has `outcome` (outcome, guard)."""

    async def seen() -> bool:
        return outcome in outcomes(await audits(env.bus, name, "device_taint"))

    await wait_for(seen, timeout=timeout, what=what)


async def test_one_failed_gpu_on_a_dra_node_taints_that_device_only(
    cordon_env: EnvFactory, tmp_path: Path
) -> None:
    env = await cordon_env(count=2, nodes={0: DRA})
    await env.start()
    name = env.nodes[0]
    capacity = await start_capacity(env, tmp_path, name)

    async def all_free() -> bool:
        return await counts(env, capacity, name) == {"free": 8, "unhealthy": 0, "quarantined": 0}

    await wait_for(all_free, timeout=15, what="capacity counting the DRA node's 8 GPUs")

    await env.publish(on_gpu(failed(name, gpu=3)))

    async def one_rule() -> list[dict[str, Any]]:
        return await rules(env)

    found = await wait_for(one_rule, timeout=10, what="a DeviceTaintRule")
    assert len(found) == 1
    rule = found[0]
    assert rule["apiVersion"] == f"{GROUP}/v1"
    assert rule["metadata"]["name"] == f"nodeward-{name}-gpu-3"
    assert rule["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "nodeward"
    assert rule["spec"]["deviceSelector"] == {
        "driver": "gpu.nvidia.com",
        "pool": name,
        "device": "gpu-3",
    }
    taint = rule["spec"]["taint"]
    assert (taint["key"], taint["effect"]) == ("nodeward.io/gpu-unhealthy", "NoSchedule")
    assert taint["timeAdded"]
    node = await env.node(name)
    assert not tainted(node) and not node["spec"].get("unschedulable")
    applied = await wait_for(
        lambda: audits(env.bus, name, "device_taint"), timeout=5, what="the audit"
    )
    assert outcomes(applied) == [("applied", None)]
    assert applied[0].details["device"] == "gpu-3"
    assert await audits(env.bus, name, "quarantine") == []

    async def seven_free() -> bool:
        return await counts(env, capacity, name) == {"free": 7, "unhealthy": 1, "quarantined": 0}

    await wait_for(seven_free, timeout=15, what="capacity counting 7 free + 1 unhealthy")

    # A redelivered or repeated failure makes no second rule.
    await env.publish(on_gpu(failed(name, gpu=3, seq=2)))

    await _taint_audited(env, name, ("skipped", "already_excluded"), 5, "the repeat skipped")
    assert len(await rules(env)) == 1

    # Recovery: healthy for healthy_period (0.5s) and the rule is gone.
    await env.publish(on_gpu(health(name, HealthState.HEALTHY, gpu=3, seq=3)))

    async def no_rule() -> bool:
        return await rules(env) == []

    await wait_for(no_rule, timeout=10, what="the DeviceTaintRule removed")
    released = await wait_for(
        lambda: audits(env.bus, name, "device_untaint"), timeout=5, what="the release audit"
    )
    assert outcomes(released) == [("applied", None)]
    # On-call is warned of the taint (one GPU, the node serving: no page), told of the end.
    notices = await wait_for(
        lambda: _two(notifications(env.bus, name)), timeout=5, what="the two notices"
    )
    assert [n.severity for n in notices if n.resolves] == [Severity.INFO]
    assert Severity.WARNING in [n.severity for n in notices if not n.resolves]
    assert Severity.CRITICAL not in [n.severity for n in notices]
    await wait_for(all_free, timeout=15, what="capacity back to 8 free")


async def test_a_rule_nodeward_did_not_create_is_left_alone(cordon_env: EnvFactory) -> None:
    env = await cordon_env(count=1, nodes={0: DRA})
    name = env.nodes[0]
    theirs = {
        "apiVersion": f"{GROUP}/v1",
        "kind": "DeviceTaintRule",
        "metadata": {"name": f"nodeward-{name}-gpu-1"},
        "spec": {
            "deviceSelector": {"driver": "gpu.nvidia.com", "pool": name, "device": "gpu-1"},
            "taint": {"key": "example.com/maintenance", "effect": "NoSchedule"},
        },
    }
    await env.admin.client.request("POST", RULES, body=theirs)
    await env.start()
    await env.publish(on_gpu(failed(name, gpu=1)))
    failures = await wait_for(
        lambda: audits(env.bus, name, "device_taint"), timeout=10, what="the failed audit"
    )
    assert failures[0].outcome.value == "failed"
    assert "not nodeward's" in failures[0].reason
    left = await rules(env)
    assert [r["spec"]["taint"]["key"] for r in left] == ["example.com/maintenance"]


async def test_device_plugin_node_below_the_threshold_stays_in_service(
    cordon_env: EnvFactory, tmp_path: Path
) -> None:
    env = await cordon_env(count=1, policy_file=h100_threshold_policy(tmp_path))
    await env.start()
    name = env.nodes[0]
    holder = PodRef(namespace="ml-nlp", name="llm-pretrain-worker-0")
    await env.publish(on_gpu(failed(name, gpu=0), real_uuid=False, pods=[holder]))
    excluded = await wait_for(
        lambda: audits(env.bus, name, "gpu_exclude"), timeout=10, what="the exclusion"
    )
    assert outcomes(excluded) == [("applied", None)]
    assert excluded[0].details["pods"] == ["ml-nlp/llm-pretrain-worker-0"]  # who held it
    node = await env.node(name)
    assert not tainted(node) and not node["spec"].get("unschedulable")
    assert await rules(env) == []

    # The second failed H100 reaches the threshold: the node is quarantined.
    await env.publish(on_gpu(failed(name, gpu=1), real_uuid=False))

    async def quarantined() -> bool:
        return tainted(await env.node(name))

    await wait_for(quarantined, timeout=10, what="the node quarantined at the threshold")
    done = await wait_for(
        lambda: audits(env.bus, name, "quarantine"), timeout=5, what="the quarantine audit"
    )
    assert outcomes(done) == [("applied", None)]


async def test_dry_run_taints_no_device(cordon_env: EnvFactory) -> None:
    env = await cordon_env(count=1, nodes={0: DRA}, dry_run=True)
    await env.start()
    name = env.nodes[0]
    await env.publish(on_gpu(failed(name, gpu=4)))
    dry = await wait_for(
        lambda: audits(env.bus, name, "device_taint"), timeout=10, what="the dry-run audit"
    )
    assert outcomes(dry) == [("dry_run", None)]
    assert await rules(env) == []
    assert not tainted(await env.node(name))


async def test_a_driver_nodeward_does_not_watch_leaves_the_node_path(
    cordon_env: EnvFactory,
) -> None:
    """Slices of another driver do not make a GPU a DRA device: today's quarantine."""
    env = await cordon_env(count=1, nodes={0: {"dra": {"driver": "gpu.example.com"}}})
    await env.start()
    name = env.nodes[0]
    await env.publish(on_gpu(failed(name, gpu=0)))

    async def quarantined() -> bool:
        return tainted(await env.node(name))

    await wait_for(quarantined, timeout=10, what="the node quarantined")
    assert await rules(env) == []


async def test_heartbeats_restating_an_excluded_gpu_change_nothing(cordon_env: EnvFactory) -> None:
    env = await cordon_env(count=1, nodes={0: DRA})
    await env.start()
    name = env.nodes[0]
    await env.publish(on_gpu(failed(name, gpu=6, seq=1)))
    await wait_for(lambda: audits(env.bus, name, "device_taint"), timeout=10, what="the taint")
    beats = [
        heartbeat(name, {6: HealthState.FAILED, 0: HealthState.HEALTHY}, seq=1) for _ in range(3)
    ]
    await env.publish(*beats)
    consumer = env.settings.services["cordon"]["consumer"] + "-heartbeats"

    await wait_for(
        lambda: settled(env.bus, "HEARTBEATS", consumer, delivered=3),
        timeout=10,
        what="the heartbeats settled",
    )
    assert len(await rules(env)) == 1
    assert not tainted(await env.node(name))
    assert await audits(env.bus, name, "quarantine") == []
    assert outcomes(await audits(env.bus, name, "device_taint")) == [("applied", None)]


async def test_an_operator_deleting_the_rule_is_respected_and_audited(
    cordon_env: EnvFactory,
) -> None:
    env = await cordon_env(count=1, nodes={0: DRA})
    await env.start()
    name = env.nodes[0]
    await env.publish(on_gpu(failed(name, gpu=7, seq=1)))
    (rule,) = await wait_for(lambda: rules(env), timeout=10, what="the rule")
    await env.admin.client.request("DELETE", f"{RULES}/{rule['metadata']['name']}")

    await _taint_audited(env, name, ("undone", "manual_untaint"), 10, "the operator's act audited")
    # The same failure restated is not re-tainted while the incident lasts.
    await env.publish(on_gpu(failed(name, gpu=7, seq=2)))

    await _taint_audited(
        env, name, ("skipped", "manual_untaint"), 10, "the restated failure handled"
    )
    assert await rules(env) == []
    # Recovery ends the incident without touching anything.
    await env.publish(on_gpu(health(name, HealthState.HEALTHY, gpu=7, seq=3)))
    released = await wait_for(
        lambda: audits(env.bus, name, "device_untaint"), timeout=10, what="the release"
    )
    assert outcomes(released) == [("applied", None)]
    assert released[0].details.get("removed") is False
