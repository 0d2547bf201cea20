"""What a node's container runtime learns of an image when it pulls it from a registry.

Only what the sim kubelet needs: the manifest (its digest and annotations, which say whether
it is a checkpoint image: `io.kubernetes.cri-o.annotations.checkpoint.name`, CRI-O's
`internal/annotations/checkpoint.go`), and for a checkpoint image the files CRI-O reads from
it on restore (`spec.dump`, `config.dump`, `checkpoint/inventory.img`, `checkpoint/pages-1.img`).

A failed pull reads as CRI-O reports it: `copy.Image`'s `initializing source docker://REF: `
before containers/image's `reading manifest TAG in HOST/REPO: manifest unknown`
(`vendor/go.podman.io/image/v5/docker/docker_client.go` `fetchManifest`, `docker/errors.go`
`registryHTTPResponseToError`: the registry's error message alone when it is the code's
default) behind the gRPC prefix the kubelet shows (`rpc error: code = Unknown desc = `).
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import tarfile
from dataclasses import dataclass, field
from typing import Any

import aiohttp

CHECKPOINT_ANNOTATION = "io.kubernetes.cri-o.annotations.checkpoint.name"
MANIFEST_ACCEPT = (
    "application/vnd.oci.image.manifest.v1+json, "
    "application/vnd.docker.distribution.manifest.v2+json"
)
WANTED = frozenset(
    {"spec.dump", "config.dump", "checkpoint/inventory.img", "checkpoint/pages-1.img"}
)
MAX_LAYER = 64 * 1024 * 1024
"""A checkpoint layer bigger than this is not read (its files count as absent)."""


class PullError(Exception):
    """The image cannot be pulled; the message is the one the kubelet shows."""


@dataclass(frozen=True)
class ImageRef:
    """`HOST/REPO:TAG` or `HOST/REPO@DIGEST`."""

    host: str
    repo: str
    reference: str

    @classmethod
    def parse(cls, image: str) -> ImageRef | None:
        host, slash, rest = image.partition("/")
        if not slash or not rest:
            return None
        if "@" in rest:
            repo, _, ref = rest.partition("@")
        else:
            head, colon, tag = rest.rpartition(":")
            repo, ref = (head, tag) if colon and "/" not in tag else (rest, "latest")
        return cls(host, repo, ref)

    def __str__(self) -> str:
        sep = "@" if self.reference.startswith("sha256:") else ":"
        return f"{self.host}/{self.repo}{sep}{self.reference}"


@dataclass(frozen=True)
class Pulled:
    """A pulled image: its manifest's digest and annotations; for a checkpoint image, the
    checkpoint files found in its layers (name → bytes)."""

    image: str
    digest: str
    annotations: dict[str, str]
    files: dict[str, bytes] = field(default_factory=dict)

    @property
    def checkpoint_of(self) -> str | None:
        """The checkpointed container's name if this is a checkpoint image."""
        return self.annotations.get(CHECKPOINT_ANNOTATION)


def _failure(ref: ImageRef, why: str) -> PullError:
    return PullError(
        f"rpc error: code = Unknown desc = initializing source docker://{ref}: "
        f"reading manifest {ref.reference} in {ref.host}/{ref.repo}: {why}"
    )


def _registry_error(status: int, body: bytes) -> str:
    try:
        errors = json.loads(body).get("errors") or []
        first = errors[0]
        return str(first.get("message") or first.get("code", "")).strip()
    except (ValueError, AttributeError, IndexError, TypeError):
        text = body.decode(errors="replace")
        return f"StatusCode: {status}, {json.dumps(text[:50] + ('...' if len(text) > 50 else ''))}"


def _layer_files(blob: bytes) -> dict[str, bytes]:
    found: dict[str, bytes] = {}
    try:
        with tarfile.open(fileobj=io.BytesIO(blob), mode="r:*") as tar:
            for member in tar:
                name = member.name.lstrip("./").lstrip("/")
                if name in WANTED and member.isfile():
                    f = tar.extractfile(member)
                    if f is not None:
                        found[name] = f.read()
    except (tarfile.TarError, OSError, EOFError):
        return found
    return found


async def pull(session: aiohttp.ClientSession, image: str) -> Pulled:
    """Read `image`'s manifest (plain HTTP) and, for a checkpoint image, its layers' checkpoint
    files. PullError as the kubelet reports a failed pull."""
    ref = ImageRef.parse(image)
    if ref is None:
        raise PullError(f"rpc error: code = Unknown desc = invalid image reference {image!r}")
    base = f"http://{ref.host}/v2/{ref.repo}"
    try:
        async with session.get(
            f"{base}/manifests/{ref.reference}", headers={"Accept": MANIFEST_ACCEPT}
        ) as answer:
            body = await answer.read()
            if answer.status != 200:
                raise _failure(ref, _registry_error(answer.status, body))
            digest = answer.headers.get("Docker-Content-Digest") or (
                "sha256:" + hashlib.sha256(body).hexdigest()
            )
        manifest: dict[str, Any] = json.loads(body)
        annotations = {str(k): str(v) for k, v in (manifest.get("annotations") or {}).items()}
        files: dict[str, bytes] = {}
        if CHECKPOINT_ANNOTATION in annotations:
            for layer in manifest.get("layers") or []:
                if int(layer.get("size") or 0) > MAX_LAYER:
                    continue
                async with session.get(f"{base}/blobs/{layer['digest']}") as blob:
                    if blob.status != 200:
                        raise PullError(
                            f"rpc error: code = Unknown desc = reading blob {layer['digest']}: "
                            f"{_registry_error(blob.status, await blob.read())}"
                        )
                    data = await blob.read()
                files.update(await asyncio.to_thread(_layer_files, data))
    except (aiohttp.ClientError, TimeoutError, ValueError, KeyError) as exc:
        raise _failure(ref, f"{type(exc).__name__}: {exc}") from None
    return Pulled(image, digest, annotations, files)
