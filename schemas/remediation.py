"""The audit record of every action nodeward took, dry-ran or refused."""

from __future__ import annotations

from enum import StrEnum
from typing import Any, ClassVar

from pydantic import Field

from schemas.base import EventData
from schemas.common import ObjectRef
from schemas.examples import example
from schemas.tokens import subject


class Outcome(StrEnum):
    APPLIED = "applied"
    DRY_RUN = "dry_run"
    REFUSED = "refused"
    SKIPPED = "skipped"
    FAILED = "failed"
    UNDONE = "undone"


class Remediation(EventData):
    """One decision about one action on one target."""

    TYPE: ClassVar[str] = "remediation.v1"
    STREAM: ClassVar[str] = "AUDIT"
    SUBJECT_PATTERN: ClassVar[str] = "remediation.<action>.<target>"
    EXAMPLE_SOURCE: ClassVar[str] = "service/cordon"

    action: str = Field(min_length=1, description="quarantine, release, cull, warn, renew, ...")
    target: ObjectRef
    outcome: Outcome
    reason: str
    policy: str | None = Field(default=None, description="the policy rule that decided it")
    guard: str | None = Field(default=None, description="the guard that refused or skipped it")
    dry_run: bool = False
    actor: str = Field(description="the service that decided, e.g. service/cordon")
    trigger_event_id: str | None = None
    details: dict[str, Any] = Field(default_factory=dict)

    model_config = example(
        {
            "action": "quarantine",
            "target": {"kind": "Node", "name": "gpu-node-07"},
            "outcome": "applied",
            "reason": "GPU 3 failed: XID 79 (fallen off the bus)",
            "policy": "xid-reboot-node",
            "dry_run": False,
            "actor": "service/cordon",
            "trigger_event_id": "01920000-0000-7000-8000-000000000001",
            "details": {"taint": "nodeward.io/gpu-unhealthy:NoSchedule", "cordoned": True},
        }
    )

    def nats_subject(self) -> str:
        target = (
            self.target.name
            if self.target.namespace is None
            else f"{self.target.namespace}/{self.target.name}"
        )
        return subject("remediation", self.action, target)

    def about(self) -> str:
        return self.target.key()

    def concern(self) -> str:
        acted = self.outcome.value in ("failed", "refused", "applied", "undone")
        return "warning" if acted else "info"
