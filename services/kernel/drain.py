"""Drain: evict a node's pods through the Eviction API (PodDisruptionBudgets honoured), and
wait until they are gone (a pod terminates for up to its grace period).

DaemonSet pods, mirror (static) pods, finished pods, exempt pods, pods in exempt or
skipped namespaces, and pods the Falco response isolated (evidence) stay. Evictions run
concurrently under one deadline; a pod whose budget still allows no disruption at the
deadline is reported as blocked, never forced. `blockers` says which pods still stand in
the way of a GPU reset or a reboot once a drain is over: a drain that left any is not a
drained node. Both take an optional scope (`only`: `namespace/name` of the pods that count,
e.g. those holding a GPU to be reset): the same rules, applied to those pods alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import structlog
from pydantic import Field

from nodeward.config import Section
from nodeward.durations import Duration
from nodeward.kube import Cluster, EvictionBlocked, KubeError
from nodeward.kube.base import Obj
from schemas.falco import ISOLATE_LABEL
from services.kernel.exemptions import Exemptions

MIRROR_ANNOTATION = "kubernetes.io/config.mirror"


class DrainSettings(Section):
    enabled: bool = False
    """drain on every quarantine (else per rule)"""
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
    terminating: list[str] = field(default_factory=list)
    """Evicted, but still terminating (within their grace period) at the deadline."""

    @property
    def complete(self) -> bool:
        return not self.blocked and not self.terminating

    def incomplete(self) -> dict[str, str]:
        """What keeps the drain from being complete: pod -> why."""
        still = dict.fromkeys(self.terminating, "evicted, still terminating at the deadline")
        return {**self.blocked, **still}

    def to_json(self) -> dict[str, Any]:
        return {
            "evicted": self.evicted,
            "gone": self.gone,
            "kept": self.kept,
            "blocked": self.blocked,
            "held": self.held,
            "terminating": self.terminating,
            "complete": self.complete,
        }


def _ref(pod: Obj) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"


EVIDENCE = "isolated by the Falco response: kept as evidence until an operator lifts it"


def excused(pod: Obj, skip_namespaces: list[str]) -> str | None:
    """Why this pod may stay on a node that is reset or rebooted (a DaemonSet's, a mirror
    pod, a finished one, the platform's own namespaces), or None: it must be gone first."""
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


def is_evidence(pod: Obj) -> bool:
    """The pod carries the Falco response's isolation label (whoever put it there)."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return str(labels.get(ISOLATE_LABEL, "")).lower() == "true"


def keep_reason(pod: Obj, skip_namespaces: list[str]) -> str | None:
    """Why a drain leaves this pod alone, or None to evict it."""
    return excused(pod, skip_namespaces) or (EVIDENCE if is_evidence(pod) else None)


def in_scope(pod: Obj, only: Collection[str] | None) -> bool:
    """The pod counts for a drain of scope `only` (`namespace/name`; None: every pod)."""
    return only is None or _ref(pod) in only


async def blockers(
    cluster: Cluster,
    node: str,
    exemptions: Exemptions,
    skip_namespaces: list[str],
    *,
    only: Collection[str] | None = None,
) -> dict[str, str]:
    """Pods on `node` (of those in `only`, when given) that a GPU reset or a reboot would
    destroy: every pod not `excused`, whatever kept it (an exemption, Falco's evidence, a
    budget, a termination still under way): `namespace/name` -> why it is still there."""
    out: dict[str, str] = {}
    for pod in await cluster.pods.on_node(node):
        if not in_scope(pod, only) or excused(pod, skip_namespaces):
            continue
        meta = pod.get("metadata") or {}
        exempt = await exemptions.exempt_reason(pod)
        if exempt:
            out[_ref(pod)] = f"exempt from nodeward's actions ({exempt}): never evicted"
        elif is_evidence(pod):
            out[_ref(pod)] = EVIDENCE
        elif meta.get("deletionTimestamp"):
            out[_ref(pod)] = "terminating"
        else:
            out[_ref(pod)] = "still running: not evicted"
    return out


Hold = Callable[[Obj], str | None]


async def drain(
    cluster: Cluster,
    node: str,
    settings: DrainSettings,
    exemptions: Exemptions,
    *,
    hold: Hold | None = None,
    stop: asyncio.Event | None = None,
    only: Collection[str] | None = None,
) -> DrainResult:
    """Evict the node's pods (those in `only`, when given) but those `keep_reason` or the
    exemptions keep; a pod outside `only` is neither evicted nor reported.

    `hold(pod)` returns why a pod is not to be evicted yet (None: evict it); held pods are
    reported in `DrainResult.held`, to be evicted by a later drain. `stop` set: the
    evictions still waiting (on a budget) are given up at once, reported as blocked.
    """
    log = structlog.get_logger().bind(action="drain", node=node)
    result = DrainResult()
    end = time.monotonic() + settings.deadline.total_seconds()
    todo: list[Obj] = []
    for pod in await cluster.pods.on_node(node):
        if not in_scope(pod, only):
            continue
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
        if not done:
            result.gone.append(ref)
            return
        # As `kubectl drain` does: an evicted pod is Terminating for up to its grace period;
        # the node is not drained until it is gone from the API (or replaced: another uid).
        left = max(0.0, end - time.monotonic())
        if await cluster.pods.wait_gone(
            meta["namespace"], meta["name"], meta.get("uid"), within=left, interval=0.5
        ):
            result.evicted.append(ref)
        else:
            result.terminating.append(ref)

    evictions: asyncio.Future[Any] = asyncio.ensure_future(
        asyncio.gather(*(evict(p) for p in todo))
    )
    if stop is None:
        await evictions
    else:
        stopped: asyncio.Future[Any] = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({evictions, stopped}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            evictions.cancel()
            raise
        finally:
            stopped.cancel()
        if not evictions.done():
            evictions.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await evictions
            finished = {*result.evicted, *result.gone, *result.blocked, *result.terminating}
            for pod in todo:
                if _ref(pod) not in finished:
                    result.blocked[_ref(pod)] = "the drain was stopped"
    log.info(
        "drain.done",
        evicted=len(result.evicted),
        kept=len(result.kept),
        blocked=len(result.blocked),
        terminating=len(result.terminating),
        held=len(result.held),
    )
    return result
