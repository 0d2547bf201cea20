"""One builder for the notices the notifier tests route, group and send."""

from __future__ import annotations

from typing import Any

from schemas.common import ObjectRef
from schemas.notify import Notification, Severity


def note(
    title: str = "t",
    severity: Severity = Severity.CRITICAL,
    *,
    topic: str = "gpu-health",
    node: str | None = None,
    namespace: str | None = None,
    **fields: Any,
) -> Notification:
    """A notice about `node` (a Node target) and a pod in `namespace` (a Pod target), each
    when given; `fields`: the rest of the notice (body, audience, dedup_key...)."""
    targets = []
    if node:
        targets.append(ObjectRef(kind="Node", name=node))
    if namespace:
        targets.append(ObjectRef(kind="Pod", name="p", namespace=namespace))
    return Notification(severity=severity, topic=topic, title=title, targets=targets, **fields)
