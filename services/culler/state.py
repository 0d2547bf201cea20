"""What the culler remembers of each session in KV: its warning, its deadline, its stop.

One key per session (`SESSIONS`: bucket `culler`, key `session.<ns>.<pod>`), updated with
revision checks, so a restarted or second replica neither repeats a warning nor forgets a
deadline.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel

from schemas.state import Bucket
from schemas.tokens import token

BUCKET = "culler"

Reason = Literal["idle", "max_age"]


class SessionRecord(BaseModel):
    uid: str | None = None
    node: str | None = None
    reason: Reason | None = None
    """Why a warning is pending: idleness or the maximum session age."""
    idle_since: datetime | None = None
    """The start of the idle period the warning is about."""
    warned_at: datetime | None = None
    warn_id: str | None = None
    warn_sent: bool = False
    deadline: datetime | None = None
    dry_run: bool = False
    stopped_at: datetime | None = None
    stop_outcome: str | None = None
    cancelled: int = 0
    last_cancel_at: datetime | None = None
    active_at: datetime | None = None
    """When activity last withdrew a warning: an idle period that began before it is over."""
    last_decision: str | None = None
    """The last refusal or skip audited, so a repeat each interval is not audited again."""

    @property
    def pending(self) -> bool:
        return self.warned_at is not None and self.stopped_at is None

    def cancelled_now(self, at: datetime, *, active_at: datetime | None) -> SessionRecord:
        """The warning withdrawn: the session was used at `active_at`, or kept (None)."""
        return self.model_copy(
            update={
                "active_at": active_at or self.active_at,
                "reason": None,
                "idle_since": None,
                "warned_at": None,
                "warn_id": None,
                "warn_sent": False,
                "deadline": None,
                "dry_run": False,
                "cancelled": self.cancelled + 1,
                "last_cancel_at": at,
                "last_decision": None,
            }
        )


def session_key(namespace: str, pod: str) -> str:
    return f"session.{token(namespace)}.{token(pod)}"


SESSIONS: Bucket[SessionRecord] = Bucket(
    BUCKET, SessionRecord, prefix="session.", key=session_key, description="per session"
)
