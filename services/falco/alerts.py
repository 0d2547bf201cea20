"""Pure helpers over one alert: what it is about, how it reads, how identical alerts are keyed."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from nodeward.kube.base import Obj
from schemas.base import Event
from schemas.common import ObjectRef
from schemas.falco import FalcoAlert, FalcoPriority
from schemas.notify import Severity
from schemas.state.dedup import FALCO
from schemas.tokens import falco_rule_token
from services.kernel.proposal import node_ref


@dataclass(frozen=True)
class Target:
    """What an alert is about, as read from the cluster."""

    pod: Obj | None
    no_pod: str | None  # why there is no pod to act on
    node: str | None

    @property
    def ref(self) -> ObjectRef:
        if self.pod is not None:
            meta = self.pod["metadata"]
            return ObjectRef(
                kind="Pod", name=meta["name"], namespace=meta["namespace"], api_version="v1"
            )
        return node_ref(self.node or "unknown")


def where(alert: FalcoAlert) -> str:
    if alert.namespace and alert.pod:
        return f"pod {alert.namespace}/{alert.pod}"
    return f"node {alert.hostname or 'unknown'}"


def describe(alert: FalcoAlert, limit: int = 600) -> str:
    text = f"Falco {alert.priority.value} '{alert.rule}' on {where(alert)}: {alert.message()}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def severity_of(priority: FalcoPriority) -> Severity:
    if priority.rank <= FalcoPriority.ERROR.rank:
        return Severity.CRITICAL
    if priority == FalcoPriority.WARNING:
        return Severity.WARNING
    return Severity.INFO


def dedup_key(alert: FalcoAlert) -> str:
    """Identical alerts: same rule, pod (or node) and output without its time prefix."""
    raw = "\x1f".join(
        (alert.rule, alert.namespace or "", alert.pod or "", alert.hostname or "", alert.message())
    )
    return FALCO.key(hashlib.sha256(raw.encode()).hexdigest()[:40])


def label_value(text: str) -> str:
    """A valid label value (63 characters of [A-Za-z0-9_.-], alphanumeric at both ends)."""
    out = "".join(c if c.isascii() and (c.isalnum() or c in "-_.") else "_" for c in text)
    return out[:63].strip("-_.")


def render(template: str, alert: FalcoAlert, event: Event[Any]) -> str:
    """`{rule}`, `{rule_token}`, `{priority}`, `{event_id}` and `{time}` filled in."""
    values = {
        "rule": alert.rule,
        "rule_token": falco_rule_token(alert.rule),
        "priority": alert.priority.value,
        "event_id": event.id,
        "time": alert.time.isoformat(),
    }
    out = str(template)
    for key, value in values.items():
        out = out.replace("{" + key + "}", value)
    return out
