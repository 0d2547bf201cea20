"""Idle sessions end to end: the idleness agent and the culler on real NATS, the sim cluster,
simulated GPUs, a cgroup v2 tree and a real Jupyter server whose kernels the test drives."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from agents.idle.access import ACCESS
from agents.idle.agent import IdleAgent, KubeSessionPods
from agents.idle.settings import IdleSettings
from agents.sources.cgroups import CgroupCpu
from agents.sources.gpu_activity import NvmlUtilization
from agents.sources.jupyter import JupyterKernels, JupyterSettings
from agents.sources.pods import StaticPods
from launch.sim_agents.gpu import sim_nvml_for, sim_pod_devices, sim_workload
from nodeward.bus import Bus
from nodeward.config import ClusterSettings
from nodeward.kube import Cluster
from schemas.remediation import Outcome
from sim.nvml import SimNvml
from tests.conftest import wait_for
from tests.integration.culler_fixtures import CullerEnv, EnvFactory
from tests.integration.jupyter_peer import JupyterPeer

pytestmark = pytest.mark.xdist_group("jupyter")

CLOSED_URL = "http://127.0.0.1:9/notebook/nobody/here"  # discard port: nothing listens


class CgroupTree:
    """A cgroup v2 tree like a node's: one directory per pod, its `cpu.stat` counter."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.usec: dict[str, int] = {}

    def add(self, uid: str) -> None:
        self.usec[uid] = 1_000_000
        self._write(uid)

    def burn(self, uid: str, seconds: float) -> None:
        self.usec[uid] += int(seconds * 1e6)
        self._write(uid)

    def _write(self, uid: str) -> None:
        slice_ = f"kubepods-burstable-pod{uid.replace('-', '_')}.slice"
        d = self.root / "kubepods.slice" / "kubepods-burstable.slice" / slice_
        d.mkdir(parents=True, exist_ok=True)
        (d / "cpu.stat").write_text(f"usage_usec {self.usec[uid]}\nuser_usec 0\nsystem_usec 0\n")


@dataclass
class Platform:
    env: CullerEnv
    agent: IdleAgent
    gpus: SimNvml
    cgroups: CgroupTree


@pytest.fixture
async def platform(
    culler_env: EnvFactory, bus: Bus, tmp_path: Path, jupyter_peer: JupyterPeer
) -> AsyncIterator[Callable[..., Awaitable[Platform]]]:
    """`await platform(annotations)`: the culler and one node's idle agent, both running."""
    tasks: list[asyncio.Task[None]] = []
    closers: list[Callable[[], Awaitable[None]]] = []
    await jupyter_peer.shutdown_all()  # the server is shared: this test owns its kernels

    async def make(annotations: dict[str, dict[str, str]], **culler: Any) -> Platform:
        env = await culler_env(
            annotations, **({"warn_after": "1s", "cull_after": "2500ms"} | culler)
        )
        await env.start()
        path = env.sim.write_kubeconfig(tmp_path / f"kubeconfig-agent-{env.node}", identity="agent")
        cluster = Cluster.connect(ClusterSettings(kubeconfig=path), access=ACCESS)
        closers.append(cluster.close)
        settings = IdleSettings(
            interval="400ms", gpu_sample_every="200ms", idle_after="400ms", cgroup_root=tmp_path
        )
        gpus = sim_workload(sim_nvml_for(env.seed.nodes[0]), env.seed.pods)
        cgroups = CgroupTree(tmp_path / f"cg-{env.node}")
        for pod in env.pods.values():
            cgroups.add(pod["metadata"]["uid"])
        kernels = JupyterKernels(JupyterSettings(token_file=jupyter_peer.token_file))
        closers.append(kernels.aclose)
        agent = IdleAgent(
            bus,
            settings,
            sessions=KubeSessionPods(cluster, env.node, settings.selectors),
            kernels=kernels,
            cpu=CgroupCpu(cgroups.root),
            gpus=NvmlUtilization(gpus),
            gpu_pods=StaticPods(sim_pod_devices(gpus, env.seed.pods)),
            node=env.node,
        )
        tasks.append(asyncio.create_task(agent.run()))
        await wait_for(lambda: agent.ready, what="the idle agent")
        return Platform(env, agent, gpus, cgroups)

    yield make
    for task in tasks:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    for close in closers:
        await close()
    await jupyter_peer.shutdown_all()


async def test_idle_notebook_is_warned_then_stopped_and_unreachable_jupyter_never_is(
    platform: Callable[..., Awaitable[Platform]], jupyter_peer: JupyterPeer
) -> None:
    await jupyter_peer.start_kernel()  # idle: one kernel, no execution
    p = await platform(
        {
            "nb-a-0": {"nodeward.io/jupyter-url": jupyter_peer.url},
            "nb-b-0": {"nodeward.io/jupyter-url": CLOSED_URL},
        }
    )
    env = p.env
    stamp = await wait_for(lambda: env.stopped("nb-a"), timeout=30, what="nb-a stopped")
    assert stamp
    [warning, stopped] = await wait_for(
        lambda: _at_least(env.user_notices("nb-a-0"), 2), what="nb-a's warning and stop notice"
    )
    assert "will be stopped" in warning.title and "was stopped" in stopped.title
    # nb-b's Jupyter never answered: unknown, never idle, whatever its GPU and CPU say.
    assert await env.user_notices("nb-b-0") == []
    assert await env.stopped("nb-b") is None


async def test_busy_kernel_with_an_idle_gpu_is_not_culled(
    platform: Callable[..., Awaitable[Platform]], jupyter_peer: JupyterPeer
) -> None:
    kernel = await jupyter_peer.start_kernel()
    await jupyter_peer.make_busy(kernel, seconds=120)
    p = await platform({"nb-a-0": {"nodeward.io/jupyter-url": jupyter_peer.url}})
    env = p.env

    witness = (await env.admin.pods.get(env.ns, "ssh-kept-0"))["metadata"]["uid"]

    async def witness_gone() -> bool:  # an idle SSH session on the same node is stopped
        # (its StatefulSet then makes a fresh ssh-kept-0: another pod)
        uids = {x["metadata"]["uid"] for x in await env.admin.pods.list(env.ns)}
        return witness not in uids

    await wait_for(witness_gone, timeout=30, what="the idle SSH session stopped")
    assert await env.user_notices("nb-a-0") == []
    assert await env.stopped("nb-a") is None


async def test_gpu_or_cpu_activity_after_the_warning_cancels_it(
    platform: Callable[..., Awaitable[Platform]], jupyter_peer: JupyterPeer
) -> None:
    await jupyter_peer.start_kernel()
    p = await platform({"nb-a-0": {"nodeward.io/jupyter-url": jupyter_peer.url}}, cull_after="6s")
    env = p.env
    await wait_for(lambda: env.user_notices("nb-a-0"), timeout=30, what="nb-a warned")
    held = {
        d for d, refs in sim_pod_devices(p.gpus, env.seed.pods).items() if refs[0].name == "nb-a-0"
    }
    gpu = next(g.index for g in p.gpus.gpus if g.uuid in held)
    p.gpus.set_load(gpu, 85)  # the user starts training on the notebook's GPU
    cancels = await wait_for(lambda: env.audits("cancel"), timeout=15, what="the cancel")
    assert cancels[0].outcome == Outcome.APPLIED and "used again" in cancels[0].reason
    notices = await wait_for(lambda: _at_least(env.user_notices("nb-a-0"), 2), what="all clear")
    assert "will not be stopped" in notices[1].title
    assert await env.stopped("nb-a") is None


async def _at_least(listing: Awaitable[list[Any]], n: int) -> list[Any] | None:
    got = await listing
    return got if len(got) >= n else None
