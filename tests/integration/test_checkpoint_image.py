"""Checkpoint archives become OCI checkpoint images in a real registry (Debian's
docker-registry), built and pushed by a real buildah; retention deletes from that registry."""

from __future__ import annotations

import contextlib
import io
import os
import tarfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from launch.registry import run_registry
from services.maintenance.image import (
    CRIO_NAME,
    ArchiveRefused,
    ImageSettings,
    PushFailed,
    build_image,
    build_storage,
    delete_archive,
    image_ref,
    prune,
    publish,
    push_image,
)
from services.maintenance.registry import Registry, split_reference
from tests.helpers.registry import LocalRegistry, checkpoint_archive

AT = datetime(2026, 3, 4, 12, 20, 30, tzinfo=UTC)


def _ref(reg: LocalRegistry, at: datetime = AT, pod: str = "trainer-0") -> str:
    return image_ref(reg.settings.registry, "team-a", pod, "worker", at)


async def test_archive_pushed_as_a_checkpoint_image_the_registry_confirms(
    registry: LocalRegistry, tmp_path: Path
) -> None:
    archive, _ = checkpoint_archive(tmp_path / "node", "trainer-0", "team-a", "worker", AT)
    ref = _ref(registry)
    labels = {"org.criu.checkpoint.pod.name": "trainer-0"}
    digest = await publish(archive, ref, registry.settings, container="worker", labels=labels)

    host, repo, tag = split_reference(ref)
    assert repo == "ckpt/team-a/trainer-0-worker" and tag == "20260304122030"
    async with contextlib.aclosing(Registry(host, insecure=True)) as reg:
        assert await reg.digest(repo, tag) == digest
        assert await reg.tags(repo) == [tag]
        manifest = await reg.manifest(repo, tag)
        assert manifest is not None
        assert manifest["mediaType"] == "application/vnd.oci.image.manifest.v1+json"
        assert manifest["annotations"][CRIO_NAME] == "worker"
        assert manifest["annotations"]["org.criu.checkpoint.pod.name"] == "trainer-0"
        [layer] = manifest["layers"]
        blob = await reg.blob(repo, layer["digest"])
    mode = "r:gz" if layer["mediaType"].endswith("gzip") else "r:"
    with tarfile.open(fileobj=io.BytesIO(blob), mode=mode) as tar:
        names = {n.removeprefix("./") for n in tar.getnames()}
    assert {"config.dump", "spec.dump", "checkpoint/inventory.img"} <= names


async def test_authfile_protected_registry_takes_the_push_only_with_the_authfile(
    auth_registry: LocalRegistry, tmp_path: Path
) -> None:
    archive, _ = checkpoint_archive(tmp_path / "node", "trainer-0", "team-a", "worker", AT)
    ref = _ref(auth_registry)
    anonymous = auth_registry.settings.model_copy(update={"authfile": None})
    with pytest.raises(PushFailed) as refused:
        await publish(archive, ref, anonymous, container="worker")
    assert "\n" not in str(refused.value)

    digest = await publish(archive, ref, auth_registry.settings, container="worker")
    host, repo, tag = split_reference(ref)
    async with contextlib.aclosing(
        Registry(host, insecure=True, authfile=auth_registry.settings.authfile)
    ) as reg:
        assert await reg.digest(repo, tag) == digest
    # No credentials: 401, not the digest.
    async with contextlib.aclosing(Registry(host, insecure=True)) as reg:
        response = await reg.request("HEAD", f"/v2/{repo}/manifests/{tag}", repository=repo)
        assert response.status_code == 401
    assert auth_registry.login is not None
    assert auth_registry.login[1] not in str(refused.value)


async def test_push_to_a_dead_registry_fails_in_one_line(tmp_path: Path) -> None:
    from tests.helpers.registry import buildah_unusable

    if reason := buildah_unusable():
        pytest.skip(reason)
    async with run_registry(tmp_path / "gone") as address:
        pass  # stopped: nothing listens there now
    settings = ImageSettings(registry=f"{address}/ckpt", insecure=True, retries=0)
    archive, _ = checkpoint_archive(tmp_path / "node", "p", "ns", "c", AT)
    ref = image_ref(settings.registry, "ns", "p", "c", AT)
    async with build_storage(settings) as root:
        await build_image(archive, "c", ref, settings, root=root)
        with pytest.raises(PushFailed) as failed:
            await push_image(ref, settings, root=root)
    message = str(failed.value)
    assert "\n" not in message and message.startswith(f"cannot push {ref}: registry")


async def test_archive_deleted_only_in_the_checkpoint_dir(tmp_path: Path) -> None:
    node_root = str(tmp_path / "nodes" / "{node}")
    archive, on_node = checkpoint_archive(tmp_path / "nodes" / "n1", "p", "ns", "c", AT)
    outside = tmp_path / "nodes" / "n1" / "etc" / "passwd"
    outside.parent.mkdir(parents=True)
    outside.write_text("root:x:0:0")
    link = archive.parent / "checkpoint-link.tar"
    os.symlink(outside, link)

    for refused in ("/etc/passwd", f"{on_node}/../../x.tar", "var/lib/kubelet/checkpoints/a.tar"):
        with pytest.raises(ArchiveRefused):
            await delete_archive(node_root, "n1", refused)
    with pytest.raises(ArchiveRefused, match="symlink"):
        await delete_archive(node_root, "n1", "/var/lib/kubelet/checkpoints/checkpoint-link.tar")
    assert outside.exists() and link.is_symlink()

    assert await delete_archive(node_root, "n1", on_node) is True
    assert not archive.exists()
    assert await delete_archive(node_root, "n1", on_node) is False  # gone already: done
    assert await delete_archive(node_root, "n2", on_node) is False  # no such node dir


async def test_retention_deletes_the_oldest_beyond_keep_from_the_registry(
    registry: LocalRegistry, tmp_path: Path
) -> None:
    settings = registry.settings.model_copy(update={"keep": 2, "max_age": None})
    times = [AT + timedelta(minutes=i) for i in range(3)]
    digests = []
    for i, at in enumerate(times):
        archive, _ = checkpoint_archive(tmp_path / f"node{i}", "p", "team-a", "worker", at)
        ref = image_ref(settings.registry, "team-a", "p", "worker", at)
        digests.append(await publish(archive, ref, settings, container="worker"))
    host, repo, _ = split_reference(image_ref(settings.registry, "team-a", "p", "worker", AT))

    removed = await prune(f"{host}/{repo}", settings, now=times[-1])

    assert removed == ["20260304122030"]
    async with contextlib.aclosing(Registry(host, insecure=True)) as reg:
        assert sorted(await reg.tags(repo)) == ["20260304122130", "20260304122230"]
        assert await reg.manifest(repo, digests[0]) is None  # GET by digest: 404
        assert await reg.digest(repo, "20260304122230") == digests[2]
    assert await prune(f"{host}/{repo}", settings, now=times[-1]) == []  # nothing more
