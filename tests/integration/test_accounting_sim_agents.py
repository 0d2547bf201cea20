"""Accounting fed by the simulated energy agents as `nodeward up` runs them (on the sim
cluster's pods, a real NATS): what `nodeward report` shows a user.

Issue 31 saw, against `up`: the CSV had `gpu_util_pct` 0.0 on every row (only sessions'
samples gave a utilisation, and the seed's sessions are at rest), and the `user-*`
namespaces were missing (their pods have no GPU, and the simulated agents attributed no CPU
energy)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from launch.sim_agents.energy import build_sim_energy_agent
from nodeward.config import ClusterSettings, Settings
from nodeward.kube.base import core
from nodeward.kube.client import KubeClient
from nodeward.kube.errors import NotFound
from tests.conftest import wait_for
from tests.integration.accounting_fixtures import AccountingEnv, EnvFactory

pytestmark = pytest.mark.xdist_group("accounting")

ENERGY = {"interval": "1s", "sample_every": "0.2s", "read_timeout": "0.5s"}


@asynccontextmanager
async def sim_energy_agents(env: AccountingEnv, tmp_path: Path) -> AsyncIterator[None]:
    """The simulated energy agents of `env`'s two nodes, wired as `nodeward up` wires them
    (the node agents' cluster account; no GPU agent, so each GPU keeps its seeded load)."""
    seed = env.sim.seed
    kubeconfig = env.sim.write_kubeconfig(tmp_path / f"kubeconfig-agent-{env.uid}", "agent")
    settings = Settings(
        bus=env.settings.bus,
        daemon={"shutdown_timeout": "4s"},
        agents={"energy": {**ENERGY, "carbon": {"static_g_per_kwh": 100}}},
    )
    live = ClusterSettings(kubeconfig=kubeconfig, retries=1)
    daemons = []
    try:
        for node in seed.nodes:
            daemon, _, _ = await build_sim_energy_agent(settings, node, seed.pods, live=live)
            await daemon.start()
            daemons.append(daemon)
        yield
    finally:
        for daemon in daemons:
            await daemon.stop()


Rows = dict[str, dict[str, str]]


async def _rows(env: AccountingEnv) -> Rows:
    """`nodeward report --by namespace --format csv` over the last few minutes."""
    now = datetime.now(UTC)
    return await env.csv_rows(now - timedelta(minutes=5), now, "namespace")


async def _rows_once(env: AccountingEnv, ok: Callable[[Rows], bool]) -> Rows | None:
    """The report's rows by namespace if `ok` says they are what the test waits for."""
    rows = await _rows(env)
    return rows if ok(rows) else None


async def test_a_busy_training_pod_has_its_gpu_utilisation_in_the_csv(
    accounting_env: EnvFactory, tmp_path: Path
) -> None:
    env = await accounting_env()
    await env.start()

    async with sim_energy_agents(env, tmp_path):

        def measured(rows: Rows) -> bool:  # each namespace's GPU utilisation
            return all(rows.get(ns, {}).get("gpu_util_pct") for ns in (env.ns1, env.ns2))

        rows = await wait_for(
            lambda: _rows_once(env, measured),
            timeout=60,
            interval=0.5,
            what="a GPU utilisation per namespace",
        )
    # ns2: pod-c, a training pod on two A100s at the seed's training load (30 %): NVML's rate.
    assert float(rows[env.ns2]["gpu_util_pct"]) == pytest.approx(30.0)
    assert float(rows[env.ns2]["gpu_kwh_per_busy_gpu_hour"]) > 0
    # ns1: pod-b training (30 %) beside pod-a, a session at rest (0 %), one GPU each.
    assert 0.0 < float(rows[env.ns1]["gpu_util_pct"]) < 30.0


async def test_a_user_namespaces_cpu_only_pod_is_billed_until_it_is_gone(
    accounting_env: EnvFactory, tmp_path: Path
) -> None:
    env = await accounting_env()
    await env.start()

    def billed(rows: Rows) -> bool:
        return float(rows.get(env.user_ns, {}).get("cpu_energy_kwh") or 0) > 0

    seen: list[dict[str, Any]] = []

    async def keep(msg: Any) -> None:
        seen.append(json.loads(msg.data))

    sub = await env.bus.nc.subscribe(f"energy.pod.{env.h100}.>", cb=keep)
    admin = KubeClient.from_settings(
        ClusterSettings(kubeconfig=env.sim.write_kubeconfig(tmp_path / "kubeconfig-admin"))
    )
    try:
        async with sim_energy_agents(env, tmp_path):
            rows = await wait_for(
                lambda: _rows_once(env, billed),
                timeout=60,
                interval=0.5,
                what=f"a row for {env.user_ns}",
            )
            row = rows[env.user_ns]
            assert float(row["energy_kwh"]) == float(row["cpu_energy_kwh"]) > 0
            assert float(row["gpu_hours"]) == 0 and row["gpu_util_pct"] == ""
            assert row["pods"] == "1"
            pod_d = [e for e in seen if e["pod"] == "pod-d"]
            assert pod_d[-1]["attribution"] == "cpu-time-ratio-estimate"
            # pod-d uses a training pod's cores; pod-a, a session at rest, a little.
            last = {e["pod"]: e for e in seen if e["interval"] == pod_d[-1]["interval"]}
            assert last["pod-d"]["cpu_energy_j"] > last["pod-a"]["cpu_energy_j"] > 0

            path = core("pods", "pod-d", env.user_ns)
            await admin.request("DELETE", path, query={"gracePeriodSeconds": 0})

            async def gone() -> bool:
                try:
                    await admin.request("GET", path)
                except NotFound:
                    return True
                return False

            await wait_for(gone, timeout=10, what="pod-d deleted")
            deleted = datetime.now(UTC)

            def after(event: dict[str, Any]) -> bool:
                return datetime.fromisoformat(event["interval"]["start"]) > deleted

            await wait_for(
                lambda: sum(1 for e in seen if e["pod"] == "pod-b" and after(e)) >= 2,
                timeout=20,
                what="two intervals of the node since pod-d was deleted",
            )
        assert not [e for e in seen if e["pod"] == "pod-d" and after(e)]  # no more billed
    finally:
        await sub.unsubscribe()
        await admin.close()
