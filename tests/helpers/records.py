"""Builders for the schema records many tests make: a remediation on a node, a notebook's
idle report, an application XID."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from schemas.common import ObjectRef, PodRef
from schemas.gpu import GpuHealth, GpuXid, HealthState, RecommendedAction
from schemas.remediation import Outcome, Remediation
from schemas.session import IdleEvidence, SessionIdle, SessionKind


def node_action(
    action: str,
    node: str,
    reason: str,
    *,
    actor: str = "service/cordon",
    outcome: Outcome = Outcome.APPLIED,
    **more: Any,
) -> Remediation:
    """`actor`'s `action` on Node `node`, for `reason` (`more`: the rest of the record)."""
    target = ObjectRef(kind="Node", name=node)
    return Remediation(
        action=action, target=target, outcome=outcome, reason=reason, actor=actor, **more
    )


def notebook_idle(
    namespace: str,
    pod: str,
    node: str,
    since: datetime,
    idle_for_s: float,
    evidence: IdleEvidence,
    **more: Any,
) -> SessionIdle:
    """A notebook idle since `since` for `idle_for_s` seconds, on one piece of `evidence`."""
    return SessionIdle(
        namespace=namespace,
        pod=pod,
        node=node,
        kind=SessionKind.NOTEBOOK,
        idle_since=since,
        idle_for_s=idle_for_s,
        evidence=[evidence],
        **more,
    )


def app_xid(
    node: str, gpu: int, uuid: str, pods: list[PodRef], at: datetime, **more: Any
) -> GpuXid:
    """XID 13 (a graphics engine exception: the application's fault) on `node`'s GPU `gpu`,
    blamed on `pods`."""
    return GpuXid(
        node=node,
        gpu_index=gpu,
        gpu_uuid=uuid,
        xid=13,
        category="application",
        catalog_action=RecommendedAction.RESTART_APP,
        application=True,
        pods=pods,
        observed_at=at,
        **more,
    )


def gpu_health(
    node: str, gpu: int, uuid: str, state: HealthState, at: datetime, **more: Any
) -> GpuHealth:
    """GPU `gpu` (`uuid`) of `node` in `state` at `at` (`more`: reasons, pods, sequence...)."""
    return GpuHealth(node=node, gpu_index=gpu, gpu_uuid=uuid, state=state, observed_at=at, **more)
