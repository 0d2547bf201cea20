"""What the falco service keeps in KV beside its node marks (`marks_bucket`): one record per
isolation it decided (`ISOLATIONS`, key `isolations.<namespace>.<pod>`), kept true to the
API by `services/falco/isolations.py`."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from schemas.state import Bucket
from schemas.state.marks import FALCO_MARKS
from schemas.tokens import token


class IsolationRecord(BaseModel):
    """One isolation nodeward decided: which pod (by uid), for which alert, since when."""

    namespace: str
    pod: str
    uid: str | None = Field(description="the isolated pod's uid: another pod of its name is not it")
    node: str | None = None
    falco_rule: str
    policy: str | None = Field(default=None, description="the nodeward rule that isolated it")
    event_id: str = Field(description="the alert event that isolated it (the end's trigger)")
    event_time: datetime
    at: datetime = Field(description="when nodeward isolated it")
    dry_run: bool = Field(default=False, description="decided in a dry run: never labelled")

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.pod}"


def isolation_key(namespace: str, pod: str) -> str:
    return f"isolations.{token(namespace)}.{token(pod)}"


ISOLATIONS = Bucket(
    FALCO_MARKS.name,
    IsolationRecord,
    prefix="isolations.",
    key=isolation_key,
    description="the falco service's isolations, isolations.<namespace>.<pod>",
)
"""Beside the cordon's intents (`marks.<node>`) in the service's `marks_bucket`."""
