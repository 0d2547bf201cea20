"""Drain: evict a node's pods through the Eviction API (PodDisruptionBudgets honoured).

DaemonSet pods, mirror (static) pods, finished pods, exempt pods and pods in exempt or
skipped namespaces stay. Evictions run concurrently under one deadline; a pod whose
budget still allows no disruption at the deadline is reported as blocked, not forced.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import structlog
from pydantic import Field

from nodeward.config import Section
from nodeward.durations import Duration
from nodeward.kube import Cluster, EvictionBlocked, KubeError
from nodeward.kube.base import Obj
from services.kernel.exemptions import Exemptions

MIRROR_ANNOTATION = "kubernetes.io/config.mirror"


class DrainSettings(Section):
    enabled: bool = Field(default=False, description="drain on every quarantine (else per rule)")
    deadline: Duration = timedelta(minutes=5)
    grace_period: int | None = Field(default=None, ge=0, description="None: each pod's own")
    skip_namespaces: list[str] = Field(default_factory=lambda: ["kube-system", "nodeward"])


@dataclass
class DrainResult:
    evicted: list[str] = field(default_factory=list)
    gone: list[str] = field(default_factory=list)
    kept: dict[str, str] = field(default_factory=dict)
    blocked: dict[str, str] = field(default_factory=dict)
    held: dict[str, str] = field(default_factory=dict)
    """Pods the caller's `hold` kept for now (e.g. until their checkpoint is recorded)."""

    @property
    def complete(self) -> bool:
        return not self.blocked

    def to_json(self) -> dict[str, Any]:
        return {
            "evicted": self.evicted,
            "gone": self.gone,
            "kept": self.kept,
            "blocked": self.blocked,
            "held": self.held,
            "complete": self.complete,
        }


def _ref(pod: Obj) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"


def keep_reason(pod: Obj, skip_namespaces: list[str]) -> str | None:
    """Why a drain leaves this pod alone, or None to evict it."""
    meta = pod.get("metadata") or {}
    if any(o.get("kind") == "DaemonSet" for o in meta.get("ownerReferences") or []):
        return "DaemonSet pod"
    if MIRROR_ANNOTATION in (meta.get("annotations") or {}):
        return "mirror pod"
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return "finished"
    if meta.get("namespace") in skip_namespaces:
        return f"namespace {meta.get('namespace')} is skipped"
    return None


Hold = Callable[[Obj], str | None]


async def drain(
    cluster: Cluster,
    node: str,
    settings: DrainSettings,
    exemptions: Exemptions,
    *,
    hold: Hold | None = None,
) -> DrainResult:
    """Evict the node's pods but those `keep_reason` or the exemptions keep.

    `hold(pod)` returns why a pod is not to be evicted yet (None: evict it); held pods are
    reported in `DrainResult.held`, to be evicted by a later drain.
    """
    log = structlog.get_logger().bind(action="drain", node=node)
    result = DrainResult()
    end = time.monotonic() + settings.deadline.total_seconds()
    todo: list[Obj] = []
    for pod in await cluster.pods.on_node(node):
        reason = keep_reason(pod, settings.skip_namespaces) or await exemptions.exempt_reason(pod)
        if reason:
            result.kept[_ref(pod)] = reason
        elif hold is not None and (why := hold(pod)) is not None:
            result.held[_ref(pod)] = why
        else:
            todo.append(pod)

    async def evict(pod: Obj) -> None:
        meta = pod["metadata"]
        ref = _ref(pod)
        try:
            done = await cluster.pods.evict(
                meta["namespace"],
                meta["name"],
                deadline=max(0.0, end - time.monotonic()),
                grace_period=settings.grace_period,
                uid=meta.get("uid"),
            )
        except EvictionBlocked as exc:
            result.blocked[ref] = str(exc)
            return
        except KubeError as exc:
            result.blocked[ref] = str(exc)
            return
        (result.evicted if done else result.gone).append(ref)

    await asyncio.gather(*(evict(p) for p in todo))
    log.info(
        "drain.done",
        evicted=len(result.evicted),
        kept=len(result.kept),
        blocked=len(result.blocked),
        held=len(result.held),
    )
    return result
