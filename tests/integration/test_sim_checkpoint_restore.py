"""The sim cluster's kubelets write checkpoint archives as CRI-O exports them, and restore a
pod whose image is an OCI checkpoint image pushed to a registry (Debian's `docker-registry`,
images built with buildah), or fail as CRI-O and the kubelet report it.

Sources: see `sim.cluster.checkpoints`, `sim.cluster.images` and `sim.cluster.kubelet`.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import tarfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from sim.cluster import SimCluster, checkpoints
from sim.cluster.kubelet import RESTORED, RUNTIME_RESTORE
from sim.cluster.seed import ContainerSeed, NodeSeed, PodSeed, Seed
from tests.conftest import wait_for
from tests.helpers.registry import LocalRegistry
from tests.integration.simkube import sim_http

NS = "ml-nlp"
PODS = f"/api/v1/namespaces/{NS}/pods"
CHECKPOINT_ANNOTATION = "io.kubernetes.cri-o.annotations.checkpoint.name"

Push = Callable[[bytes | None, str, str | None], str]
"""push(archive or None, "repo:tag", checkpoint annotation or None) -> image reference"""


@pytest.fixture
def registry(registry: LocalRegistry, tmp_path: Path) -> tuple[str, Push]:
    """The shared registry (`tests.helpers.registry`: skipped, with the reason, without
    docker-registry or a usable buildah) and a way to push any image to it with buildah,
    a checkpoint image from an archive or a plain one."""
    host, base = registry.address, tmp_path / "buildah"
    buildah = ["buildah", "--storage-driver", "vfs", "--root", str(base / "root")]
    buildah += ["--runroot", str(base / "runroot")]
    count = iter(range(1_000_000))

    def run(*args: str) -> str:
        done = subprocess.run([*buildah, *args], capture_output=True, text=True, check=False)
        assert done.returncode == 0, f"buildah {args[0]}: {done.stderr}"
        return done.stdout.strip()

    def push(archive: bytes | None, name: str, annotation: str | None) -> str:
        work = run("from", "scratch")
        if archive is not None:
            path = tmp_path / f"archive-{next(count)}.tar"
            path.write_bytes(archive)
            run("add", work, str(path), "/")
        if annotation is not None:
            run("config", f"--annotation={CHECKPOINT_ANNOTATION}={annotation}", work)
        local = f"localhost/{name}"
        run("commit", "-q", work, local)
        run("rm", work)
        image = f"{host}/{name}"
        run("push", "-q", "--tls-verify=false", local, f"docker://{image}")
        return image

    return host, push


def _seed() -> Seed:
    return Seed(
        namespaces=[NS],
        nodes=[
            NodeSeed(name="gpu-src"),
            NodeSeed(name="gpu-dst", labels={"nodeward.io/cuda-checkpoint": "true"}),
            NodeSeed(name="gpu-plain"),
            NodeSeed(name="gpu-norestore", annotations={RUNTIME_RESTORE: "false"}),
        ],
        pods=[
            PodSeed(
                name="session-0",
                namespace=NS,
                node="gpu-src",
                containers=[ContainerSeed(name="main")],
            )
        ],
    )


def _pod(
    name: str,
    image: str,
    node: str,
    *,
    container: str = "main",
    gpus: int = 0,
    mounts: list[str] = (),  # type: ignore[assignment]
) -> dict[str, Any]:
    ctr: dict[str, Any] = {"name": container, "image": image}
    if gpus:
        ctr["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    if mounts:
        ctr["volumeMounts"] = [{"name": f"v{i}", "mountPath": m} for i, m in enumerate(mounts)]
    spec: dict[str, Any] = {"nodeName": node, "containers": [ctr]}
    if mounts:
        spec["volumes"] = [{"name": f"v{i}", "emptyDir": {}} for i in range(len(mounts))]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def _synthetic(container: str = "main", mounts: list[str] = ()) -> bytes:  # type: ignore[assignment]
    """An archive as the sim writes it, for a pod that never ran in a sim cluster."""
    ctr: dict[str, Any] = {"name": container, "image": "registry.example.com/ml/base:1"}
    if mounts:
        ctr["volumeMounts"] = [{"name": "v", "mountPath": m} for m in mounts]
    pod = {
        "metadata": {"name": "old", "namespace": NS, "uid": "u-old", "creationTimestamp": "x"},
        "spec": {"containers": [ctr]},
    }
    return checkpoints.archive_bytes(pod, container, "gpu-src", "2025-01-01T00:00:00Z", 0)


async def _waiting(http: httpx.AsyncClient, name: str, reason: str) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        pod = (await http.get(f"{PODS}/{name}")).json()
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            waiting = (status.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") == reason:
                return pod
        return None

    return await wait_for(check, what=f"{name} waiting {reason}")  # type: ignore[no-any-return]


async def _running(http: httpx.AsyncClient, name: str) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        pod = (await http.get(f"{PODS}/{name}")).json()
        return pod if (pod.get("status") or {}).get("phase") == "Running" else None

    return await wait_for(check, what=f"{name} Running")  # type: ignore[no-any-return]


# --- archives --------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def _pulling(host: str) -> AsyncIterator[tuple[SimCluster, Any]]:
    """The sim cluster whose kubelets pull from the registry at `host`, and a client."""
    async with SimCluster(_seed(), registries=[host]) as sim, sim_http(sim) as http:
        yield sim, http


@contextlib.asynccontextmanager
async def _restoring(
    registry: tuple[str, Push], repo: str
) -> AsyncIterator[tuple[SimCluster, Any, str]]:
    """As `_pulling`, with a checkpoint image of container `main` pushed as `repo`."""
    host, push = registry
    image = push(_synthetic(), repo, "main")
    async with _pulling(host) as (sim, http):
        yield sim, http, image


async def test_a_checkpoint_writes_the_archive_crio_exports(tmp_path: Path) -> None:
    root = tmp_path / "nodes"
    async with SimCluster(_seed(), archive_root=root) as sim, sim_http(sim) as http:
        answer = await http.post(
            "/api/v1/nodes/gpu-src/proxy/checkpoint/ml-nlp/session-0/main?timeout=30"
        )
        assert answer.status_code == 200, answer.text
        (path,) = answer.json()["items"]
        assert path.startswith("/var/lib/kubelet/checkpoints/checkpoint-session-0_ml-nlp-main-")
        (record,) = sim.checkpoints
        assert record.path == path
        assert record.file == root / "gpu-src" / path.lstrip("/")
        assert sim.archives() == [record.file] == sim.archives("gpu-src")
        assert record.file.stat().st_mode & 0o777 == 0o600
        pod = (await http.get(f"{PODS}/session-0")).json()
    with tarfile.open(record.file) as tar:
        names = set(tar.getnames())
        config = json.load(tar.extractfile("config.dump"))  # type: ignore[arg-type]
        spec = json.load(tar.extractfile("spec.dump"))  # type: ignore[arg-type]
        page = tar.extractfile("checkpoint/pages-1.img").read()  # type: ignore[union-attr]
    assert {
        "config.dump",
        "spec.dump",
        "checkpoint",
        "checkpoint/inventory.img",
        "checkpoint/pages-1.img",
        "stats-dump",
        "dump.log",
        "rootfs-diff.tar",
        "bind.mounts",
        "io.kubernetes.cri-o.LogPath",
    } <= names
    assert config["name"] == f"k8s_main_session-0_{NS}_{pod['metadata']['uid']}_0"
    assert config["rootfsImageName"] == pod["spec"]["containers"][0]["image"]
    assert config["checkpointedTime"] == record.time and config["runtime"] == "runc"
    assert {"id", "rootfsImage", "rootfsImageRef", "createdTime"} <= set(config)
    notes = spec["annotations"]
    assert notes["io.kubernetes.container.name"] == "main"
    assert notes["io.kubernetes.pod.uid"] == pod["metadata"]["uid"]
    assert notes["io.kubernetes.pod.namespace"] == NS
    assert json.loads(notes["io.kubernetes.cri-o.Annotations"])  # what a restore reads back
    marker = checkpoints.read_marker(page)
    assert marker is not None
    assert (marker["podUID"], marker["container"], marker["checkpointedAt"]) == (
        pod["metadata"]["uid"],
        "main",
        record.time,
    )
    assert len(record.file.read_bytes()) < 64 * 1024


async def test_without_an_archive_root_no_file_is_written(sim: SimCluster) -> None:
    async with sim_http(sim) as http:
        answer = await http.post(
            "/api/v1/nodes/gpu-a100-02/proxy/checkpoint/ml-speech/whisper-distill-worker-0/pytorch"
        )
        assert answer.status_code == 200
    assert sim.checkpoints[0].file is None and sim.archives() == []


# --- restores --------------------------------------------------------------------------------


async def test_a_checkpoint_image_restores_the_session(
    tmp_path: Path, registry: tuple[str, Push]
) -> None:
    host, push = registry
    cluster = SimCluster(_seed(), archive_root=tmp_path, registries=[host])
    async with cluster as sim, sim_http(sim) as http:
        answer = await http.post("/api/v1/nodes/gpu-src/proxy/checkpoint/ml-nlp/session-0/main")
        assert answer.status_code == 200
        (record,) = sim.checkpoints
        assert record.file is not None
        image = push(record.file.read_bytes(), "ckpt/session-0:1", "main")
        digest = httpx.get(
            f"http://{host}/v2/ckpt/session-0/manifests/1",
            headers={"Accept": "application/vnd.oci.image.manifest.v1+json"},
        ).headers["Docker-Content-Digest"]
        old = (await http.get(f"{PODS}/session-0")).json()
        assert (
            await http.post(PODS, json=_pod("session-0-restored", image, "gpu-dst"))
        ).status_code == 201
        pod = await _running(http, "session-0-restored")
    (restored,) = json.loads(pod["metadata"]["annotations"][RESTORED])
    assert restored["container"] == "main" and restored["image"] == image
    assert restored["digest"] == digest and restored["checkpoint"] == "main"
    assert restored["from"]["podUID"] == old["metadata"]["uid"]
    assert restored["from"]["checkpointedAt"] == record.time
    (kept,) = sim.kubelets.restores
    assert (kept.pod, kept.node, kept.digest) == ("session-0-restored", "gpu-dst", digest)


async def test_a_plain_registry_image_starts_fresh(registry: tuple[str, Push]) -> None:
    host, push = registry
    image = push(None, "plain/app:1", None)
    async with _pulling(host) as (sim, http):
        await http.post(PODS, json=_pod("fresh", image, "gpu-plain"))
        pod = await _running(http, "fresh")
    assert RESTORED not in (pod["metadata"].get("annotations") or {})
    assert sim.kubelets.restores == []


async def test_a_missing_image_waits_errimagepull_then_backoff_then_starts(
    registry: tuple[str, Push],
) -> None:
    host, push = registry
    image = f"{host}/ckpt/late:7"
    async with _pulling(host) as (sim, http):
        sim.kubelets.pull_backoff = 0.2
        await http.post(PODS, json=_pod("late", image, "gpu-dst"))
        pod = await _waiting(http, "late", "ErrImagePull")
        assert pod["status"]["phase"] == "Pending"
        (status,) = pod["status"]["containerStatuses"]
        assert status["state"]["waiting"]["message"] == (
            f"rpc error: code = Unknown desc = initializing source docker://{image}: "
            f"reading manifest 7 in {host}/ckpt/late: manifest unknown"
        )
        assert status["ready"] is False and "containerID" not in status
        pod = await _waiting(http, "late", "ImagePullBackOff")
        assert pod["status"]["containerStatuses"][0]["state"]["waiting"]["message"] == (
            f'Back-off pulling image "{image}"'
        )
        push(_synthetic(), "ckpt/late:7", "main")  # pushed at last: the next pull restores it
        pod = await _running(http, "late")
    assert json.loads(pod["metadata"]["annotations"][RESTORED])[0]["from"]["podUID"] == "u-old"


async def test_a_checkpoint_with_mounts_the_new_container_lacks_is_not_created(
    registry: tuple[str, Push],
) -> None:
    host, push = registry
    image = push(_synthetic("trainer", ["/data"]), "ckpt/foreign:1", "trainer")
    async with _pulling(host) as (sim, http):
        await http.post(PODS, json=_pod("foreign", image, "gpu-dst"))
        pod = await _waiting(http, "foreign", "CreateContainerError")
        # the same checkpoint restores into a container with that mount, whatever its name:
        # CRI-O compares mounts, not the checkpointed container's name
        await http.post(PODS, json=_pod("mounted", image, "gpu-dst", mounts=["/data"]))
        other = await _running(http, "mounted")
    assert pod["status"]["phase"] == "Pending"
    assert pod["status"]["containerStatuses"][0]["state"]["waiting"]["message"] == (
        f'restoring "{image}" expects following bind mounts defined (/data)'
    )
    assert json.loads(other["metadata"]["annotations"][RESTORED])[0]["checkpoint"] == "trainer"
    assert [r.pod for r in sim.kubelets.restores] == ["mounted"]


async def test_a_node_whose_runtime_cannot_restore_fails_the_start(
    registry: tuple[str, Push],
) -> None:
    async with _restoring(registry, "ckpt/norestore:1") as (sim, http, image):
        await http.post(PODS, json=_pod("nr", image, "gpu-norestore"))
        pod = await _waiting(http, "nr", "RunContainerError")
    message = pod["status"]["containerStatuses"][0]["state"]["waiting"]["message"]
    assert message.startswith("failed to restore container ")
    assert message.endswith(": configured runtime does not support checkpoint/restore")
    assert sim.kubelets.restores == []


async def test_a_gpu_checkpoint_needs_a_node_with_cuda_checkpoint(
    registry: tuple[str, Push],
) -> None:
    async with _restoring(registry, "ckpt/gpu:1") as (sim, http, image):
        await http.post(PODS, json=_pod("gpu-plain", image, "gpu-plain", gpus=1))
        await http.post(PODS, json=_pod("gpu-dst", image, "gpu-dst", gpus=1))
        pod = await _waiting(http, "gpu-plain", "RunContainerError")
        await _running(http, "gpu-dst")
    message = pod["status"]["containerStatuses"][0]["state"]["waiting"]["message"]
    assert "nodeward.io/cuda-checkpoint=true" in message and "cuda plugin" in message
    assert [r.pod for r in sim.kubelets.restores] == ["gpu-dst"]


async def test_a_checkpoint_image_without_its_dumps_is_not_created(
    registry: tuple[str, Push],
) -> None:
    host, push = registry
    image = push(None, "ckpt/empty:1", "main")
    async with _pulling(host) as (_sim, http):
        await http.post(PODS, json=_pod("empty", image, "gpu-dst"))
        pod = await _waiting(http, "empty", "CreateContainerError")
    message = pod["status"]["containerStatuses"][0]["state"]["waiting"]["message"]
    assert message.startswith('failed to read "spec.dump": open ')
