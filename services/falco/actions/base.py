"""What every Falco action gets, and what it declares about itself (as Falco Talon's actionners do)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import structlog

from nodeward.bus import Bus
from nodeward.kube import Cluster, KubeError
from nodeward.kube.base import Obj
from schemas.base import Event
from schemas.falco import FalcoAlert
from schemas.remediation import Remediation
from services.falco.alerts import Target
from services.falco.rules import ActionKind, ActionSpec
from services.falco.settings import FalcoSettings

Scope = Literal["pod", "node", "none"]


@dataclass(frozen=True)
class ActionContext:
    """One action of one rule for one alert, with the ports it may use."""

    event: Event[Any]
    alert: FalcoAlert
    spec: ActionSpec
    target: Target
    earlier: Sequence[tuple[ActionKind, Remediation]]
    """The decisions of the rule's earlier actions for this alert."""
    cluster: Cluster
    bus: Bus
    settings: FalcoSettings
    done_words: Mapping[ActionKind, str]
    """What each action kind did, in the owner's words (from the table)."""

    def pod(self) -> tuple[str, str, Obj]:
        """(namespace, name, object) of the alert's pod; only for pod-scoped actions."""
        assert self.target.pod is not None
        meta = self.target.pod["metadata"]
        return meta["namespace"], meta["name"], self.target.pod

    async def record_event(self, obj: Obj, reason: str, note: str) -> None:
        """A Kubernetes Event on the object, so `kubectl describe` shows it (best effort)."""
        try:
            await self.cluster.events.create(
                obj, reason=reason, action=reason, note=note[:1000], type_="Warning"
            )
        except KubeError as exc:
            structlog.get_logger().warning("falco.event_failed", reason=reason, error=str(exc))


@dataclass(frozen=True)
class Actionner:
    """One action kind: what it acts on, what the owner is told it did, and how it runs.

    `scope`: `pod` actions are skipped for an alert without a pod and pass the pod guards
    (skipped namespaces, exemptions, rate limits per pod and per rule); `node` actions pass
    the node guards; `none` acts on nothing in the cluster and passes none.
    """

    kind: ActionKind
    description: str
    scope: Scope
    run: Callable[[ActionContext], Awaitable[dict[str, Any]]]
    done_words: str | None = None
    removes_node: bool = False
    """It takes a node out of service: the shared circuit breaker guards it too."""
