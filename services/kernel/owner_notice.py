"""Telling the owner of a pod or Secret, in plain words, what happens to it and what they can do.

The notifier sends a `notify.v1` with audience `user:<namespace>/<name>` to the owner's
address (the `nodeward.io/owner-email` annotation, the namespace's, or the directory).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from nodeward.bus import Bus
from schemas.base import make_event
from schemas.common import ObjectRef
from schemas.notify import Notification, Severity


@dataclass(frozen=True)
class OwnerNotice:
    """What to tell an owner: what happened or will, why, what they can do, and when."""

    severity: Severity
    title: str
    body: str
    why: str = ""
    steps: Sequence[str] = ()
    deadline: datetime | None = None


async def tell_owner(
    bus: Bus,
    notice: OwnerNotice,
    *,
    actor: str,
    topic: str,
    namespace: str,
    name: str,
    targets: Sequence[ObjectRef],
    notice_id: str,
    dedup_key: str | None = None,
) -> Notification:
    """Publish `notice` for the owner of `namespace/name` under `notice_id` (a stable id, so
    a retried step publishes it once); repeats group by `dedup_key`, by default the id."""
    note = Notification(
        severity=notice.severity,
        topic=topic,
        title=notice.title[:300],
        body=notice.body,
        audience=f"user:{namespace}/{name}",
        targets=list(targets),
        dedup_key=dedup_key or f"{topic}/{namespace}/{name}/{notice_id}",
        why=notice.why,
        what_you_can_do=list(notice.steps),
        deadline=notice.deadline,
    )
    await bus.publish(make_event(note, source=actor, id=notice_id))
    return note
