"""A checkpoint archive as an OCI checkpoint image in a registry, so another node can restore
it: buildah builds it (`from scratch`, the archive's files at /, annotations), pushes it, the
registry is asked back for the digest, and only then may the node's archive go.

The image is what `checkpointctl build` makes (checkpoint-restore/checkpointctl
`internal/oci_image_build.go`, annotation names in `lib/annotations.go`), and what the
runtimes look for when a pod's image is a checkpoint:

- CRI-O restores from an image whose annotations hold
  `io.kubernetes.cri-o.annotations.checkpoint.name` (cri-o `pkg/annotations`,
  `server/container_restore.go` `checkIfCheckpointOCIImage`); it reads `config.dump`,
  `spec.dump` and `checkpoint/` from the image's root.
- containerd 2.x (`internal/cri/server/container_checkpoint_linux.go`
  `checkIfCheckpointOCIImage`) reads checkpointctl's `org.criu.checkpoint.container.name` from
  the annotations of the image's OCI *index*. Those `org.criu.checkpoint.*` annotations are set
  here on the image manifest; an index carrying them needs `buildah manifest annotate --index`,
  which Debian 12's buildah 1.28 lacks, so these images restore on CRI-O.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import re
import shutil
import stat
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path, PurePosixPath

import structlog
from pydantic import Field

from nodeward.config import Section
from nodeward.durations import Duration
from services.maintenance.registry import Registry, RegistryError, split_reference

CHECKPOINT_DIR = PurePosixPath("/var/lib/kubelet/checkpoints")
"""Where the kubelet writes checkpoint archives; the only place `delete_archive` removes from."""
CRIO_NAME = "io.kubernetes.cri-o.annotations.checkpoint.name"
"""What CRI-O looks for to restore from an image (cri-o `pkg/annotations`)."""
CRIU = "org.criu.checkpoint."
"""checkpointctl's annotation prefix (checkpointctl `lib/annotations.go`)."""
TAG_FORMAT = "%Y%m%d%H%M%S"
_COMPONENT_MAX = 96  # a repository path component; registries cap the whole name at 255
_INVALID = re.compile(r"[^a-z0-9._-]+")
_SEPARATORS = re.compile(r"[._-]{2,}")
_ARCHIVE_STAMP = re.compile(
    r"-(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:\d{2}))\.tar$"
)


class ImageSettings(Section):
    """How checkpoint archives become images in a registry (`services.checkpoint.images`)."""

    registry: str = ""
    """host[:port][/prefix] images are pushed under: <registry>/<namespace>/<pod>-<container>;
    empty: none, so a maintenance's moves fail and its pods are evicted as without --move"""
    insecure: bool = False
    """HTTPS without verification, or plain HTTP (buildah --tls-verify=false)"""
    authfile: Path | None = None
    """a containers/docker auth JSON (a kubernetes.io/dockerconfigjson Secret's
    .dockerconfigjson); None: anonymous"""
    buildah: str = "buildah"
    storage_driver: str = "vfs"
    storage_root: Path | None = None
    """buildah's --root (and --runroot under it); None: a temporary one per image, removed
    after its push"""
    retries: int = Field(default=2, ge=0, le=10, description="buildah push --retry")
    keep: int = Field(default=3, ge=1)
    """images kept per repository (a pod's container), newest first; as
    checkpoint-restore-operator's maxCheckpointsPerContainer (it also has
    maxCheckpointsPerPod/-Namespace and size caps, and removes the oldest first)"""
    max_age: Duration | None = timedelta(days=7)
    """older images go even within `keep` (the operator has no age limit); None: no limit"""
    node_root: str = "/"
    """where a node's filesystem is mounted here; may contain {node} (`nodeward up`:
    <state>/nodes/{node})"""


class ImageError(Exception):
    """A checkpoint image that could not be built, pushed or confirmed. `str()` is one line,
    without credentials. `final`: trying again will not help (a registry that does not
    answer may come back; a build that failed will fail again)."""

    final = False


class BuildFailed(ImageError):
    """buildah could not build the image (or is missing)."""

    final = True


class PushFailed(ImageError):
    """buildah could not push the image, or the registry could not be asked about it."""


class PushUnconfirmed(PushFailed):
    """The registry does not hold what was pushed (another digest, or none)."""

    final = True


class ArchiveRefused(ImageError):
    """An archive path `delete_archive` will not remove (outside the checkpoint directory, a
    symlink, not a file)."""

    final = True


def _separator(m: re.Match[str]) -> str:
    """A run of separators as one the grammar allows: `-`s and `__` stay, others become `-`."""
    run = m.group(0)
    return run if run == "__" or set(run) == {"-"} else "-"


def component(text: str) -> str:
    """`text` as one OCI repository path component: lowercase `[a-z0-9]+` runs joined by one
    `.`, `_`, `__` or `-`s (distribution's grammar); long ones end in a hash of the whole."""
    lowered = _INVALID.sub("-", text.lower())
    cleaned = _SEPARATORS.sub(_separator, lowered).strip("._-") or "x"
    if len(cleaned) > _COMPONENT_MAX:
        digest = hashlib.sha256(text.encode()).hexdigest()[:10]
        cleaned = cleaned[: _COMPONENT_MAX - 11].rstrip("._-") + "-" + digest
    return cleaned


def repository(registry: str, namespace: str, pod: str, container: str) -> str:
    """`<registry>/<namespace>/<pod>-<container>`: one repository per namespace, so registry
    permissions can be scoped to a namespace."""
    return f"{registry.rstrip('/')}/{component(namespace)}/{component(f'{pod}-{container}')}"


def tag(checkpointed_at: datetime) -> str:
    """The checkpoint's time (UTC) as a tag: YYYYMMDDHHMMSS."""
    if checkpointed_at.tzinfo is None:
        raise ValueError("checkpoint time must be timezone-aware")
    return checkpointed_at.astimezone(UTC).strftime(TAG_FORMAT)


def tag_time(text: str) -> datetime | None:
    """The time a tag made by `tag` stands for; None for any other tag."""
    if not re.fullmatch(r"\d{14}", text):
        return None
    try:
        return datetime.strptime(text, TAG_FORMAT).replace(tzinfo=UTC)
    except ValueError:
        return None


def image_ref(
    registry: str, namespace: str, pod: str, container: str, checkpointed_at: datetime
) -> str:
    """The image's full reference: `<registry>/<namespace>/<pod>-<container>:<tag>`."""
    return f"{repository(registry, namespace, pod, container)}:{tag(checkpointed_at)}"


def archive_time(path: str) -> datetime | None:
    """The time in a kubelet archive's name (`checkpoint-<pod>_<ns>-<container>-<RFC 3339>.tar`);
    None when the name has none."""
    m = _ARCHIVE_STAMP.search(PurePosixPath(path).name)
    if m is None:
        return None
    with contextlib.suppress(ValueError):
        return datetime.fromisoformat(m.group(1).replace("Z", "+00:00")).astimezone(UTC)
    return None


def checkpoint_annotations(
    container: str,
    *,
    pod: str | None = None,
    namespace: str | None = None,
    node: str | None = None,
    image: str | None = None,
    checkpointed_at: datetime | None = None,
) -> dict[str, str]:
    """The image's annotations: CRI-O's name, and checkpointctl's `org.criu.checkpoint.*`
    for what is known (its `rootfsImageName` is the original image)."""
    found = {CRIO_NAME: container, CRIU + "container.name": container}
    extra = {
        "pod.name": pod,
        "pod.namespace": namespace,
        "rootfsImageName": image,
        "host.name": node,
        "time": checkpointed_at.astimezone(UTC).isoformat() if checkpointed_at else None,
    }
    found.update({CRIU + k: v for k, v in extra.items() if v})
    return found


@dataclass(frozen=True)
class ImageRecord:
    """One image of a repository as retention sees it."""

    tag: str
    created: datetime


def expired(
    records: Sequence[ImageRecord], keep: int, max_age: timedelta | None, now: datetime
) -> list[ImageRecord]:
    """What retention removes, oldest first: all but the newest `keep`, and any older than
    `max_age`."""
    newest_first = sorted(records, key=lambda r: r.created, reverse=True)
    gone = [
        r
        for rank, r in enumerate(newest_first)
        if rank >= keep or (max_age is not None and now - r.created > max_age)
    ]
    return sorted(gone, key=lambda r: r.created)


def _tail(text: bytes) -> str:
    """The last meaningful line of buildah's stderr, its `msg="..."` when it logs one."""
    lines = [ln.strip() for ln in text.decode(errors="replace").splitlines() if ln.strip()]
    useful = [ln for ln in lines if "level=warning" not in ln] or lines
    if not useful:
        return "no output"
    line = useful[-1]
    m = re.search(r'msg="((?:[^"\\]|\\.)*)"', line)
    return (m.group(1) if m else line)[:400]


@dataclass(frozen=True)
class _Buildah:
    binary: str
    root: Path
    driver: str

    def args(self, *rest: str) -> list[str]:
        return [
            self.binary,
            "--root",
            str(self.root / "root"),
            "--runroot",
            str(self.root / "run"),
            "--storage-driver",
            self.driver,
            *rest,
        ]

    async def run(self, *rest: str, error: type[ImageError] = BuildFailed) -> str:
        """Run one buildah command; its stdout, or `error` with stderr's last line."""
        try:
            proc = await asyncio.create_subprocess_exec(
                *self.args(*rest),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        except OSError as exc:
            raise error(f"buildah ({self.binary}) cannot run: {exc.strerror or exc}") from None
        out, err = await proc.communicate()
        if proc.returncode != 0:
            raise error(f"buildah {rest[0]} failed (exit {proc.returncode}): {_tail(err)}")
        return out.decode(errors="replace").strip()


@contextlib.asynccontextmanager
async def build_storage(settings: ImageSettings) -> AsyncIterator[Path]:
    """buildah's storage for one image's build and push: `settings.storage_root`, or a
    temporary directory removed afterwards."""
    if settings.storage_root is not None:
        yield settings.storage_root
        return
    root = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="nodeward-buildah-"))
    try:
        yield root
    finally:
        await asyncio.to_thread(remove_tree, root)


def remove_tree(root: Path) -> None:
    """Remove buildah's storage, also as non-root: an image's root directory is read-only
    (0555) in vfs storage, so a parent is made writable where removal is refused."""

    def writable_parent(func: Callable[[str], object], path: str, _exc: object) -> None:
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(path), stat.S_IRWXU)
            func(path)

    if root.exists():
        shutil.rmtree(root, onerror=writable_parent)


def _buildah(settings: ImageSettings, root: Path | None) -> _Buildah:
    where = root or settings.storage_root
    if where is None:
        raise ValueError("no buildah storage: pass root= from build_storage(settings)")
    return _Buildah(settings.buildah, where, settings.storage_driver)


async def build_image(
    archive: Path,
    container: str,
    ref: str,
    settings: ImageSettings,
    *,
    root: Path | None = None,
    labels: Mapping[str, str] | None = None,
) -> None:
    """Build the checkpoint image `ref` from a kubelet archive: `from scratch`, `add` the
    archive (unpacked) at /, `config --annotation` (`checkpoint_annotations(container)` and `labels`),
    `commit` as OCI, `rm` the working container. `root`: from `build_storage`."""
    buildah = _buildah(settings, root)
    log = structlog.get_logger().bind(service="checkpoint", image=ref)
    if not await asyncio.to_thread(archive.is_file):
        raise BuildFailed(f"checkpoint archive {archive} is not a file")
    name = f"nodeward-{uuid.uuid4().hex[:12]}"
    await buildah.run("from", "--name", name, "scratch")
    try:
        await buildah.run("add", name, str(archive), "/")
        notes = {**checkpoint_annotations(container), **(labels or {})}
        await buildah.run(
            "config", *(f"--annotation={k}={v}" for k, v in sorted(notes.items())), name
        )
        await buildah.run("commit", "--format", "oci", "--quiet", name, ref)
    finally:
        with contextlib.suppress(ImageError):
            await buildah.run("rm", name)
    log.info("checkpoint_image.built", archive=str(archive))


async def push_image(ref: str, settings: ImageSettings, *, root: Path | None = None) -> str:
    """Push `ref` and confirm it: the registry's `Docker-Content-Digest` for the tag must be
    the pushed digest (`PushUnconfirmed` otherwise). Returns it; the local image is removed."""
    buildah = _buildah(settings, root)
    host, repo, reference = split_reference(ref)
    try:  # fail fast: buildah takes seconds to give up on a registry that is not there
        async with contextlib.aclosing(Registry(host, insecure=settings.insecure)) as reg:
            await reg.ping()
    except RegistryError as exc:
        raise PushFailed(f"cannot push {ref}: {exc}") from None
    digest_dir = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="nodeward-digest-"))
    try:
        digest_file = digest_dir / "digest"
        options = ["--digestfile", str(digest_file), "--retry", str(settings.retries)]
        options += ["--format", "oci", "--quiet"]
        if settings.insecure:
            options.append("--tls-verify=false")
        if settings.authfile is not None:
            options += ["--authfile", str(settings.authfile)]
        await buildah.run("push", *options, ref, f"docker://{ref}", error=PushFailed)
        pushed = (await asyncio.to_thread(digest_file.read_text)).strip()
    finally:
        await asyncio.to_thread(shutil.rmtree, digest_dir, True)
    try:
        async with contextlib.aclosing(
            Registry(host, insecure=settings.insecure, authfile=settings.authfile)
        ) as reg:
            held = await reg.digest(repo, reference)
    except RegistryError as exc:
        raise PushFailed(f"pushed {ref} but could not confirm it: {exc}") from None
    if held != pushed:
        raise PushUnconfirmed(f"pushed {ref} as {pushed}, the registry holds {held or 'nothing'}")
    try:
        await buildah.run("rmi", ref)
    except ImageError as exc:
        structlog.get_logger().warning("checkpoint_image.rmi_failed", image=ref, error=str(exc))
    structlog.get_logger().info("checkpoint_image.pushed", image=ref, digest=pushed)
    return pushed


async def publish(
    archive: Path,
    ref: str,
    settings: ImageSettings,
    *,
    container: str,
    labels: Mapping[str, str] | None = None,
) -> str:
    """Build, push and confirm in one storage (`build_storage`); the confirmed digest."""
    async with build_storage(settings) as root:
        await build_image(archive, container, ref, settings, root=root, labels=labels)
        return await push_image(ref, settings, root=root)


def node_path(node_root: str, node: str, path: str) -> Path:
    """Where a node's `path` is here: under `node_root` (its {node} filled in)."""
    return Path(node_root.format(node=node)) / PurePosixPath(path).relative_to("/")


async def delete_archive(node_root: str, node: str, path: str) -> bool:
    """Remove a pushed-and-confirmed archive; False when it was gone already. Refuses
    (`ArchiveRefused`) a path not directly in /var/lib/kubelet/checkpoints, a symlink, or
    anything but a regular file."""
    pure = PurePosixPath(path)
    if not pure.is_absolute() or ".." in pure.parts or pure.parent != CHECKPOINT_DIR:
        raise ArchiveRefused(f"refusing to delete {path}: not an archive in {CHECKPOINT_DIR}")
    directory = node_path(node_root, node, str(CHECKPOINT_DIR))

    def remove() -> bool:
        try:
            fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        except FileNotFoundError:
            return False
        try:
            try:
                info = os.lstat(pure.name, dir_fd=fd)
            except FileNotFoundError:
                return False
            if stat.S_ISLNK(info.st_mode):
                raise ArchiveRefused(f"refusing to delete {path}: a symlink")
            if not stat.S_ISREG(info.st_mode):
                raise ArchiveRefused(f"refusing to delete {path}: not a regular file")
            try:
                os.unlink(pure.name, dir_fd=fd)
            except FileNotFoundError:
                return False
            return True
        finally:
            os.close(fd)

    removed = await asyncio.to_thread(remove)
    structlog.get_logger().info(
        "checkpoint_archive.deleted", node=node, archive=path, removed=removed
    )
    return removed


async def prune(repo: str, settings: ImageSettings, now: datetime | None = None) -> list[str]:
    """Apply retention to one repository (`host/path`, no tag): delete the manifests of its
    expired tags (those `tag` made; others are left alone), never one a kept tag shares.
    Returns the tags removed."""
    host, _, path = repo.partition("/")
    at = now or datetime.now(UTC)
    async with contextlib.aclosing(
        Registry(host, insecure=settings.insecure, authfile=settings.authfile)
    ) as reg:
        tags = await reg.tags(path)
        records = [ImageRecord(t, when) for t in tags if (when := tag_time(t)) is not None]
        gone = expired(records, settings.keep, settings.max_age, at)
        gone_tags = {r.tag for r in gone}
        kept = {await reg.digest(path, r.tag) for r in records if r.tag not in gone_tags}
        removed: list[str] = []
        for record in gone:
            digest = await reg.digest(path, record.tag)
            if digest is None or digest in kept:
                continue
            await reg.delete(path, digest)
            removed.append(record.tag)
    if removed:
        structlog.get_logger().info("checkpoint_image.pruned", repository=repo, tags=removed)
    return removed
