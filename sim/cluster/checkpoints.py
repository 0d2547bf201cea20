"""The archive a node's kubelet writes for a container checkpoint, as CRI-O exports it.

The kubelet's checkpoint endpoint asks the runtime (CRI `CheckpointContainer`) to export the
container to `/var/lib/kubelet/checkpoints/checkpoint-<pod>_<ns>-<container>-<stamp>.tar`.
CRI-O writes an uncompressed tar, mode 0600 ("it contains every memory page"), whose members
sit at its root: `config.dump` and `spec.dump` (JSON), the CRIU image directory
`checkpoint/`, `stats-dump`, `dump.log`, `rootfs-diff.tar` (the container's file changes),
`bind.mounts` (when the container has bind mounts) and the container's log under the name
`io.kubernetes.cri-o.LogPath`.

Sources read (github.com/cri-o/cri-o): `internal/lib/checkpoint.go` (`prepareCheckpointExport`,
`exportCheckpoint`), `server/container_checkpoint.go`, `server/container_restore.go` (what a
restore reads back: `spec.dump`'s `io.kubernetes.cri-o.Annotations`, `config.dump`'s
`rootfsImageRef`/`rootfsImageName`, the spec's mounts), `internal/annotations/annotations.go`
and `internal/annotations/checkpoint.go`; its vendored
`github.com/checkpoint-restore/checkpointctl/lib/metadata.go` (`ConfigDumpFile`,
`SpecDumpFile`, `CheckpointDirectory`, `RootFsDiffTar`, `DeletedFilesFile`, `DumpLogFile`,
`ContainerConfig`'s JSON fields) and `github.com/checkpoint-restore/go-criu/v8/stats`
(`StatsDump = "stats-dump"`).

The CRIU images here are stand-ins: `inventory.img` starts with CRIU's image magics, and
`pages-1.img` (one 4 KiB page) carries the session's marker, `{"sim": "nodeward", "node",
"namespace", "pod", "podUID", "container", "checkpointedAt"}` as JSON, so that whoever restores
the archive can tell which session's memory it holds.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sim.cluster.store import Obj

CHECKPOINT_DIR = "checkpoint"
CONFIG_DUMP = "config.dump"
SPEC_DUMP = "spec.dump"
STATS_DUMP = "stats-dump"
DUMP_LOG = "dump.log"
ROOTFS_DIFF = "rootfs-diff.tar"
BIND_MOUNTS = "bind.mounts"
LOG_MEMBER = "io.kubernetes.cri-o.LogPath"
PAGES = f"{CHECKPOINT_DIR}/pages-1.img"
INVENTORY = f"{CHECKPOINT_DIR}/inventory.img"
MARKER_PREFIX = b"nodeward-sim-session "
PAGE_SIZE = 4096
_CRIU_MAGICS = bytes.fromhex("1943565416313158")  # IMG_COMMON_MAGIC, INVENTORY_MAGIC (LE)
_GO_ZERO_TIME = "0001-01-01T00:00:00Z"
# the mounts every CRI-O container has; a restore ignores them (server/container_restore.go)
RUNTIME_MOUNTS = (
    "/proc",
    "/dev",
    "/dev/pts",
    "/dev/mqueue",
    "/sys",
    "/sys/fs/cgroup",
    "/dev/shm",  # noqa: S108 (a container path, not a temp file)
    "/etc/resolv.conf",
    "/etc/hostname",
    "/run/.containerenv",
)
KUBELET_MOUNTS = ("/etc/hosts", "/dev/termination-log")
"""Bind mounts the kubelet asks for in every container's CRI create request."""


def local_path(root: Path, node: str, kubelet_path: str) -> Path:
    """Where a node's file lies in the sim: `root/<node>/<path without its leading />`."""
    return root / node / kubelet_path.lstrip("/")


def container_mounts(container: Mapping[str, Any]) -> list[str]:
    """The bind mounts' destinations in a container's CRI create request: its volume mounts
    and the kubelet's own."""
    paths = [str(m.get("mountPath")) for m in container.get("volumeMounts") or []]
    return [*paths, *KUBELET_MOUNTS]


def _member(tar: tarfile.TarFile, name: str, data: bytes, at: float) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o600
    info.mtime = int(at)
    tar.addfile(info, io.BytesIO(data))


def _dir(tar: tarfile.TarFile, name: str, at: float) -> None:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    info.mode = 0o700
    info.mtime = int(at)
    tar.addfile(info)


def _json(value: Any) -> bytes:
    return json.dumps(value, indent=2).encode()  # Go's json.MarshalIndent(v, "", "  ")


def marker_page(marker: Mapping[str, Any]) -> bytes:
    """One memory page that holds the session's marker."""
    data = MARKER_PREFIX + json.dumps(dict(marker), sort_keys=True).encode()
    return data + b"\0" * (-len(data) % PAGE_SIZE)


def read_marker(page: bytes) -> dict[str, Any] | None:
    """The marker `marker_page` wrote, or None if the page holds none."""
    if not page.startswith(MARKER_PREFIX):
        return None
    try:
        value = json.loads(page[len(MARKER_PREFIX) :].rstrip(b"\0"))
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def archive_bytes(pod: Obj, container: str, node: str, checkpointed_at: str, at: float) -> bytes:
    """The tar CRI-O exports for `container` of `pod` checkpointed at `checkpointed_at`."""
    meta = pod["metadata"]
    spec = pod.get("spec") or {}
    ctr = next(c for c in spec.get("containers") or [] if c.get("name") == container)
    statuses = {s.get("name"): s for s in (pod.get("status") or {}).get("containerStatuses") or []}
    status = statuses.get(container) or {}
    ctr_id = (
        str(status.get("containerID") or "").partition("://")[2]
        or hashlib.sha256(f"{meta['uid']}/{container}".encode()).hexdigest()
    )
    sandbox_id = hashlib.sha256(f"sandbox/{meta['uid']}".encode()).hexdigest()
    image = str(ctr.get("image") or "")
    image_id = str(status.get("imageID") or "").rpartition("sha256:")[2] or (
        hashlib.sha256(image.encode()).hexdigest()
    )
    created = (
        ((status.get("state") or {}).get("running") or {}).get("startedAt")
        or (pod.get("status") or {}).get("startTime")
        or meta.get("creationTimestamp")
    )
    attempt = int(status.get("restartCount") or 0)
    crio_name = f"k8s_{container}_{meta['name']}_{meta['namespace']}_{meta['uid']}_{attempt}"
    config = {
        "id": ctr_id,
        "name": crio_name,
        "rootfsImage": image,
        "rootfsImageRef": image_id,
        "rootfsImageName": image,
        "runtime": "runc",
        "createdTime": created,
        "checkpointedTime": checkpointed_at,
        "restoredTime": _GO_ZERO_TIME,
        "restored": False,
    }
    labels = {
        "io.kubernetes.container.name": container,
        "io.kubernetes.pod.name": meta["name"],
        "io.kubernetes.pod.namespace": meta["namespace"],
        "io.kubernetes.pod.uid": meta["uid"],
    }
    kubelet_annotations = {
        "io.kubernetes.container.hash": hashlib.sha256(
            json.dumps(ctr, sort_keys=True).encode()
        ).hexdigest()[:8],
        "io.kubernetes.container.restartCount": str(attempt),
        "io.kubernetes.container.terminationMessagePath": ctr.get(
            "terminationMessagePath", "/dev/termination-log"
        ),
        "io.kubernetes.container.terminationMessagePolicy": ctr.get(
            "terminationMessagePolicy", "File"
        ),
        "io.kubernetes.pod.terminationGracePeriod": str(
            spec.get("terminationGracePeriodSeconds", 30)
        ),
    }
    log_path = (
        f"/var/log/pods/{meta['namespace']}_{meta['name']}_{meta['uid']}/{container}/{attempt}.log"
    )
    mounts = [
        {"destination": d, "type": "bind", "source": f"/var/lib/kubelet/pods/{meta['uid']}{d}"}
        for d in container_mounts(ctr)
    ]
    oci_spec = {
        "ociVersion": "1.0.2-dev",
        "process": {
            "user": {"uid": 0, "gid": 0},
            "args": [*(ctr.get("command") or []), *(ctr.get("args") or [])] or ["/bin/sh"],
            "env": [f"{e['name']}={e.get('value', '')}" for e in ctr.get("env") or []],
            "cwd": ctr.get("workingDir") or "/",
        },
        "root": {"path": f"/var/lib/containers/storage/overlay/{ctr_id}/merged"},
        "hostname": meta["name"],
        "mounts": [{"destination": d, "type": "bind", "source": d} for d in RUNTIME_MOUNTS]
        + mounts,
        "annotations": {
            **labels,
            **kubelet_annotations,
            "io.kubernetes.cri-o.Annotations": json.dumps(kubelet_annotations),
            "io.kubernetes.cri-o.Labels": json.dumps(labels),
            "io.kubernetes.cri-o.ContainerID": ctr_id,
            "io.kubernetes.cri-o.ContainerName": crio_name,
            "io.kubernetes.cri-o.ContainerType": "container",
            "io.kubernetes.cri-o.Created": created,
            "io.kubernetes.cri-o.Image": image_id,
            "io.kubernetes.cri-o.ImageName": image,
            "io.kubernetes.cri-o.ImageRef": image_id,
            "io.kubernetes.cri-o.LogPath": log_path,
            "io.kubernetes.cri-o.Metadata": json.dumps({"name": container, "attempt": attempt}),
            "io.kubernetes.cri-o.Name": crio_name,
            "io.kubernetes.cri-o.SandboxID": sandbox_id,
            "io.kubernetes.cri-o.SandboxName": f"k8s_{meta['name']}_{meta['namespace']}_{meta['uid']}_0",
        },
    }
    marker = {
        "sim": "nodeward",
        "node": node,
        "namespace": meta["namespace"],
        "pod": meta["name"],
        "podUID": meta["uid"],
        "container": container,
        "checkpointedAt": checkpointed_at,
    }
    empty_tar = io.BytesIO()
    with tarfile.open(fileobj=empty_tar, mode="w", format=tarfile.PAX_FORMAT):
        pass
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _member(tar, STATS_DUMP, b"\x00\x00\x00\x00", at)  # CRIU's stats (protobuf), empty
        _member(tar, DUMP_LOG, b"(00.000000) Dumping finished successfully\n", at)
        _dir(tar, CHECKPOINT_DIR, at)
        _member(tar, INVENTORY, _CRIU_MAGICS + json.dumps(marker).encode(), at)
        _member(tar, PAGES, marker_page(marker), at)
        _member(tar, CONFIG_DUMP, _json(config), at)
        _member(tar, SPEC_DUMP, _json(oci_spec), at)
        bind = [
            {
                "source": m["source"],
                "destination": m["destination"],
                "file_type": "file" if m["destination"] in KUBELET_MOUNTS else "directory",
                "permissions": 0o644,
            }
            for m in mounts
        ]
        _member(tar, BIND_MOUNTS, _json(bind), at)
        _member(tar, ROOTFS_DIFF, empty_tar.getvalue(), at)
        _member(tar, LOG_MEMBER, f"{checkpointed_at} stdout F checkpointed\n".encode(), at)
    return out.getvalue()


def write_archive(target: Path, data: bytes) -> None:
    """Write an archive as CRI-O does: created 0600 (it holds memory), parents made."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(target, 0o600)


def archives(root: Path, node: str | None = None) -> list[Path]:
    """The checkpoint archives written under `root` (of `node`, or every node's), sorted."""
    if not root.is_dir():
        return []
    nodes = [root / node] if node else sorted(p for p in root.iterdir() if p.is_dir())
    found: list[Path] = []
    for base in nodes:
        found.extend(sorted((base / "var/lib/kubelet/checkpoints").glob("checkpoint-*.tar")))
    return found
