"""The simulated Kubeflow notebook controller: a notebook the culler stopped loses its pod
(its GPUs are free), as on a real Kubeflow cluster, and gets it back when started again."""

from __future__ import annotations

import asyncio
from pathlib import Path

from nodeward.config import ClusterSettings
from nodeward.kube.base import core, group_path
from nodeward.kube.client import MERGE_PATCH, KubeClient
from nodeward.kube.errors import NotFound
from sim.cluster import SimCluster
from sim.cluster.seed import load_seed
from sim.notebooks import STOP_ANNOTATION, SimNotebookController

NS, NAME = "ml-speech", "carol-jupyter"


async def _pod(client: KubeClient) -> dict[str, object] | None:
    try:
        return dict(await client.request("GET", core("pods", f"{NAME}-0", NS)))
    except NotFound:
        return None


async def test_a_stopped_notebook_loses_its_pod_and_gets_it_back(tmp_path: Path) -> None:
    sim = SimCluster(load_seed(), port=0)
    await sim.start()
    client = KubeClient.from_settings(
        ClusterSettings(kubeconfig=sim.write_kubeconfig(tmp_path / "kubeconfig"))
    )
    try:
        controller = SimNotebookController(client)
        assert await controller.pass_once() == []  # every notebook runs, as seeded
        before = await _pod(client)
        assert before is not None
        node = before["spec"]["nodeName"]  # type: ignore[index]

        notebook = group_path("kubeflow.org", "v1", "notebooks", NAME, NS)
        stop = {"metadata": {"annotations": {STOP_ANNOTATION: "2026-12-03T08:00:00Z"}}}
        await client.request("PATCH", notebook, body=stop, content_type=MERGE_PATCH)
        assert await controller.pass_once() == [f"{NS}/{NAME}"]
        sts = await client.request("GET", group_path("apps", "v1", "statefulsets", NAME, NS))
        assert sts["spec"]["replicas"] == 0
        gone = await _pod(client)
        assert gone is None or gone["metadata"].get("deletionTimestamp")  # type: ignore[index]
        while (await client.request("GET", notebook))["status"]["readyReplicas"] != 0:
            await controller.pass_once()  # reports the StatefulSet's ready replicas, as Kubeflow's
            await asyncio.sleep(0.1)  # poll period of another server's condition, not a sync
        # The other notebooks are left running.
        assert await client.request("GET", core("pods", "alice-jupyter-0", "ml-vision"))

        started = {"metadata": {"annotations": {STOP_ANNOTATION: None}}}
        await client.request("PATCH", notebook, body=started, content_type=MERGE_PATCH)
        assert await controller.pass_once() == [f"{NS}/{NAME}"]
        # the StatefulSet controller makes <name>-0 again once the old one is gone (its
        # graceful deletion runs its course first), from its template; the scheduler places it
        again = await _pod(client)
        while (
            again is None
            or again["metadata"]["uid"] == before["metadata"]["uid"]
            or (  # type: ignore[index]
                again.get("status") or {}  # type: ignore[union-attr]
            ).get("phase")
            != "Running"
        ):
            await asyncio.sleep(0.1)  # poll period of another server's condition, not a sync
            again = await _pod(client)
        assert again["spec"]["nodeName"]  # type: ignore[index]
        wanted = before["spec"]["containers"][0]["resources"]  # type: ignore[index]
        assert again["spec"]["containers"][0]["resources"] == wanted  # type: ignore[index]
        assert node  # where it ran before: the scheduler may choose another
        while (await client.request("GET", notebook)).get("status", {}).get("readyReplicas") != 1:
            await controller.pass_once()
            await asyncio.sleep(0.1)  # poll period, as above
    finally:
        await client.close()
        await sim.stop()


async def test_a_pod_gone_from_the_api_holds_no_gpu_in_the_kubelet_view(tmp_path: Path) -> None:
    """An evicted pod was billed for its GPUs minutes later: the simulated nodes' pod-resources
    view now follows the API, as a kubelet's does."""
    from launch.sim_agents.gpu import sim_nvml_for, sim_pod_devices
    from launch.sim_agents.pods import KUBELET_VIEW, LivePods
    from nodeward.kube import Cluster

    seed = load_seed()
    node = next(n for n in seed.nodes if n.name == "gpu-h100-01")
    sim = SimCluster(seed, port=0)
    await sim.start()
    cluster = Cluster.connect(
        ClusterSettings(kubeconfig=sim.write_kubeconfig(tmp_path / "kubeconfig")),
        access=KUBELET_VIEW,
    )
    client = KubeClient.from_settings(
        ClusterSettings(kubeconfig=sim.write_kubeconfig(tmp_path / "kubeconfig-admin"))
    )
    try:
        live = LivePods(sim_pod_devices(sim_nvml_for(node), seed.pods), cluster, node.name)

        def holders(found: object) -> set[str]:
            return {r.name for refs in found.values() for r in refs}  # type: ignore[attr-defined]

        before = holders(await live.pods_by_device())
        assert "detr-finetune-worker-0" in before
        path = core("pods", "detr-finetune-worker-0", "ml-vision")
        await client.request("DELETE", path, query={"gracePeriodSeconds": 0})
        while True:
            try:
                await client.request("GET", path)
            except NotFound:
                break
            await asyncio.sleep(0.1)  # poll period of another server's condition, not a sync
        after = holders(await live.pods_by_device())
        assert after == before - {"detr-finetune-worker-0"}, after
    finally:
        await client.close()
        await cluster.close()
        await sim.stop()
