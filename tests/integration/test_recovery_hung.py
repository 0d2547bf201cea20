"""Hung nodes, found: services.recovery's detector against a real NATS and the sim cluster.

A node whose GPU heartbeats stop (the others' go on) is published unresponsive
(`node.health.<node>`, cause `agents-silent`) and responsive again when they resume; a node
with a condition another detector set (`KernelDeadlock=True`) past its duration is published
with that cause; a node no ladder selects starts no recovery. The ladder and the BMC are in
`test_recovery_bmc.py`."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from nodeward.bus import Bus
from nodeward.config import ClusterSettings, Settings
from nodeward.kube.client import STRATEGIC_PATCH, KubeClient
from schemas.gpu import HealthState
from schemas.node import NodeHealth, Unresponsiveness
from services.recovery.service import build as build_recovery
from sim.cluster import SimCluster
from sim.cluster.seed import NodeSeed, Seed
from tests.integration.cordon_fixtures import heartbeat, read_stream
from tests.integration.recovery_fixtures import wait_for

pytestmark = pytest.mark.timeout(90)


async def _health(bus: Bus, node: str) -> list[NodeHealth]:
    return [e.data for e in await read_stream(bus, "NODES", f"node.health.{node}")]


@contextlib.asynccontextmanager
async def _detector(
    bus: Bus, nats_url: str, tmp_path: Path, nodes: list[str], **hang: Any
) -> AsyncIterator[tuple[SimCluster, KubeClient]]:
    """The sim cluster with `nodes` and the recovery service whose detector judges them."""
    uid = uuid.uuid4().hex[:8]
    sim = SimCluster(
        Seed(namespaces=["nodeward"], nodes=[NodeSeed(name=n) for n in nodes]),
        port=0,
        lease_renew_s=0.5,
        node_monitor_period_s=0.5,
    )
    await sim.start()
    admin_path = sim.write_kubeconfig(tmp_path / f"kc-admin-{uid}")
    own = sim.write_kubeconfig(tmp_path / f"kc-recovery-{uid}", identity="recovery")
    admin = KubeClient.from_settings(ClusterSettings(kubeconfig=admin_path))
    settings = Settings(
        bus={"url": nats_url, "publish_timeout": "2s"},
        cluster={"kubeconfig": own, "retries": 1},
        daemon={"shutdown_timeout": "4s"},
        services={
            "recovery": {
                "consumer": f"recovery-{uid}",
                "bucket": f"recovery-{uid}",
                "subjects": [f"remediation.quarantine.{uid}"],
                "maintenance_subjects": [f"maintenance.done.{uid}"],
                "node_subjects": [f"node.health.{n}" for n in nodes],
                "interval": "0.2s",
                "breaker": {"bucket": f"breaker-{uid}", "max_percent": 100, "max_nodes": 10},
                "hang": {
                    "check_interval": "0.2s",
                    "not_ready_after": "1s",
                    "silent_after": "1.5s",
                    "quiet_bus": 0.9,
                    # no node of this cluster is selected: found, never acted on
                    "ladders": [{"name": "none", "selector": "nodeward.io/none=true"}],
                }
                | hang,
            }
        },
    )
    daemon = await build_recovery(settings)
    await daemon.start()
    try:
        yield sim, admin
    finally:
        await daemon.stop()
        await admin.close()
        await sim.stop()


async def test_silent_agents_and_a_listed_condition_are_found_and_published(
    bus: Bus, nats_url: str, tmp_path: Path
) -> None:
    uid = uuid.uuid4().hex[:6]
    loud, quiet, stuck = f"hb-loud-{uid}", f"hb-quiet-{uid}", f"hb-stuck-{uid}"
    beating = {loud, quiet, stuck}

    async def beat() -> None:
        while True:
            for node in sorted(beating):
                await bus.publish(heartbeat(node, {0: HealthState.HEALTHY}))
            await asyncio.sleep(0.2)

    beats = asyncio.create_task(beat())
    try:
        async with _detector(
            bus, nats_url, tmp_path, [loud, quiet, stuck], conditions={"KernelDeadlock": "0.5s"}
        ) as (_sim, admin):
            beating.discard(quiet)
            said = await wait_for(
                lambda: _health(bus, quiet), f"{quiet} published unresponsive", timeout=20
            )
            assert not said[0].responsive
            assert [c.kind for c in said[0].causes] == [Unresponsiveness.AGENTS_SILENT]
            assert said[0].summary.startswith(f"{quiet} unresponsive: agents silent since")

            at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            await admin.request(
                "PATCH",
                f"/api/v1/nodes/{stuck}/status",
                body={"status": {"conditions": [{
                    "type": "KernelDeadlock", "status": "True", "reason": "DockerHung",
                    "message": "task docker:7 blocked for more than 300 seconds.",
                    "lastTransitionTime": at, "lastHeartbeatTime": at,
                }]}},
                content_type=STRATEGIC_PATCH,
            )  # fmt: skip
            found = await wait_for(lambda: _health(bus, stuck), f"{stuck} published", timeout=20)
            cause = found[0].causes[0]
            assert (cause.kind, cause.condition, cause.reason) == (
                Unresponsiveness.CONDITION,
                "KernelDeadlock",
                "DockerHung",
            )

            beating.add(quiet)

            async def answered() -> bool:
                return any(h.responsive for h in await _health(bus, quiet))

            await wait_for(answered, f"{quiet} published responsive again", timeout=20)
            assert await _health(bus, loud) == []  # never silent: never published
    finally:
        beats.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beats


async def _kernel_deadlock(admin: KubeClient, node: str) -> None:
    at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    await admin.request(
        "PATCH",
        f"/api/v1/nodes/{node}/status",
        body={"status": {"conditions": [{
            "type": "KernelDeadlock", "status": "True", "reason": "DockerHung",
            "message": "task docker:7 blocked", "lastTransitionTime": at, "lastHeartbeatTime": at,
        }]}},
        content_type=STRATEGIC_PATCH,
    )  # fmt: skip


async def test_the_floor_refuses_the_fourth_of_four_hung_nodes_of_a_group(
    bus: Bus, nats_url: str, tmp_path: Path
) -> None:
    """A group of six keeping three healthy: three nodes hanging one after another get their
    ladder; the fourth is refused by the floor (audited, with why) and left alone."""
    uid = uuid.uuid4().hex[:6]
    nodes = [f"grp-{uid}-{i}" for i in range(6)]
    ladder = {
        "name": "grp",
        "selector": "",
        "min_healthy": 3,
        "steps": [{"action": "reboot", "timeout": "1h"}],  # nobody reboots: they stay there
    }
    async with _detector(
        bus, nats_url, tmp_path, nodes, conditions={"KernelDeadlock": "0s"}, ladders=[ladder]
    ) as (_sim, admin):
        for node in nodes[:3]:
            await _kernel_deadlock(admin, node)

            async def asked(node: str = node) -> bool:
                got = await admin.request("GET", f"/api/v1/nodes/{node}")
                return (
                    got["metadata"].get("labels", {}).get("nodeward.io/reboot-required") == "true"
                )

            await wait_for(asked, f"{node}'s ladder asking for its reboot", timeout=20)
        fourth = nodes[3]
        await _kernel_deadlock(admin, fourth)

        async def refused() -> list[Any]:
            events = await read_stream(bus, "AUDIT", f"remediation.recover.{fourth}")
            return [e.data for e in events if e.data.guard == "min_healthy"]

        audit = (await wait_for(refused, f"{fourth} refused by the floor", timeout=20))[0]
        assert audit.outcome.value == "refused"
        assert "group grp: 2 of its other 5 node(s) healthy" in audit.reason
        got = await admin.request("GET", f"/api/v1/nodes/{fourth}")
        assert "nodeward.io/reboot-required" not in got["metadata"].get("labels", {})
