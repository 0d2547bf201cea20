"""Where a user's notice goes: the owner's address, from the cluster or a directory file.

Looked up in order: the annotation `nodeward.io/owner-email` on the pod the notice is
about, the same annotation on its namespace, then the directory (a YAML mapping of
namespace to address). Answers are cached briefly so a storm of notices about one
namespace reads the cluster once.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import Any

import structlog

from nodeward.bus import RetryableError
from nodeward.kube import Cluster, NotFound
from nodeward.kube.errors import Forbidden, KubeError
from nodeward.yamlfile import read_yaml
from services.kernel.cache import TtlCache

OWNER_ANNOTATION = "nodeward.io/owner-email"

Lookup = Callable[[str, str], Awaitable[dict[str, Any]]]


class DirectoryError(ValueError):
    """An owner directory that cannot be read or is not a mapping. One line."""


def load_directory(path: Path | None) -> dict[str, str]:
    """namespace -> address from the YAML file at `path` (empty without one)."""
    if path is None:
        return {}
    data = read_yaml(path, what="owner directory", error=DirectoryError, empty={})
    if not isinstance(data, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in data.items()
    ):
        raise DirectoryError(f"owner directory {path} must map namespace names to addresses")
    return dict(data)


def _annotation(obj: dict[str, Any]) -> str | None:
    value = ((obj.get("metadata") or {}).get("annotations") or {}).get(OWNER_ANNOTATION)
    return value.strip() if isinstance(value, str) and value.strip() else None


@dataclass(eq=False)
class Owners:
    """Finds the owner's address of `<namespace>/<name>` (None when nobody is on record)."""

    cluster: Cluster | None
    directory: dict[str, str]
    _: KW_ONLY
    ttl: float = 60.0
    clock: Callable[[], float] = time.monotonic
    _cache: TtlCache[tuple[str, str], str | None] = field(init=False, repr=False)
    log: Any = field(
        default_factory=lambda: structlog.get_logger().bind(component="notify.owners"),
        init=False,
        repr=False,
    )

    def __post_init__(self) -> None:
        self._cache = TtlCache(self.ttl, clock=self.clock)

    async def _read(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        assert self.cluster is not None
        try:
            if kind == "pod":
                return await self.cluster.pods.get(namespace, name)
            return await self.cluster.namespaces.get(namespace)
        except NotFound:
            return None
        except Forbidden as exc:
            self.log.warning("notify.owner_lookup_forbidden", kind=kind, error=str(exc))
            return None
        except KubeError as exc:  # the API is down: try the notice again later
            raise RetryableError(f"cannot read {kind} {namespace}/{name}: {exc}") from exc

    async def lookup(self, namespace: str, name: str) -> tuple[str | None, str]:
        """(address, where it came from): `pod`, `namespace`, `directory` or `nowhere`."""
        key = (namespace, name)
        if (cached := self._cache.fresh(key)) is not None:
            return cached[0], "cache"
        now = self.clock()
        address, where = await self._find(namespace, name)
        self._cache.put(key, address, now)
        return address, where

    async def _find(self, namespace: str, name: str) -> tuple[str | None, str]:
        if self.cluster is not None:
            pod = await self._read("pod", namespace, name)
            if pod is not None and (found := _annotation(pod)):
                return found, "pod"
            ns = await self._read("namespace", namespace, namespace)
            if ns is not None and (found := _annotation(ns)):
                return found, "namespace"
        if namespace in self.directory:
            return self.directory[namespace], "directory"
        return None, "nowhere"
