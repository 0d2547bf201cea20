"""A request to tell people something (on-call, a session's owner)."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import ClassVar

from pydantic import Field

from schemas.base import EventData
from schemas.common import ObjectRef
from schemas.examples import example
from schemas.tokens import subject


class Severity(StrEnum):
    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"


NODE_TOPICS: tuple[str, ...] = ("power-limit",)
"""The topics a node's credentials may publish notices on (`notify.*.<topic>`: the energy
agent's power-cap notices). The subject does not say which node published, so the notifier
lets a notice there address only on-call (`services/notifier/speakers.py`); the node agents'
declared grants name exactly these (tests/unit/test_notify_speakers.py)."""


class Notification(EventData):
    """What to say, to whom, and how to group repeats."""

    TYPE: ClassVar[str] = "notify.v1"
    STREAM: ClassVar[str] = "NOTIFY"
    SUBJECT_PATTERN: ClassVar[str] = "notify.<severity>.<topic>"
    EXAMPLE_SOURCE: ClassVar[str] = "service/cordon"

    severity: Severity
    topic: str = Field(
        min_length=1, description="gpu-health, idle-session, credentials, security, ..."
    )
    title: str = Field(min_length=1, max_length=300)
    body: str = ""
    audience: str = Field(default="oncall", description="oncall, or user:<namespace>/<name>")
    targets: list[ObjectRef] = Field(default_factory=list)
    dedup_key: str | None = Field(default=None, description="repeats with the same key are grouped")
    incident: str | None = Field(
        default=None,
        description="what the notices of one incident share (e.g. gpu-health/node/gpu-node-07): "
        "Alertmanager's alerts, and a page's end (`resolves`), are per incident",
    )
    decision: str | None = Field(
        default=None,
        max_length=200,
        description="the kernel's decision it tells of (`quarantine applied`, `quarantine "
        "refused (circuit_breaker)`): a storm's page counts them",
    )
    resolves: bool = Field(
        default=False,
        description="this notice ends its incident (a release, a cancellation): "
        "Alertmanager resolves the incident's alerts",
    )
    audit_event_id: str | None = None
    links: dict[str, str] = Field(default_factory=dict)
    why: str = Field(default="", description="why it happened (a user's notice says this)")
    what_you_can_do: list[str] = Field(
        default_factory=list, description="what the recipient can do about it"
    )
    deadline: datetime | None = Field(
        default=None, description="when the announced action happens if nothing changes"
    )

    model_config = example(
        {
            "severity": "critical",
            "topic": "gpu-health",
            "title": "gpu-node-07 quarantined: GPU 3 fell off the bus (XID 79)",
            "body": "Tainted nodeward.io/gpu-unhealthy:NoSchedule and cordoned. Pods affected: user-alice/jupyter-alice-0.",
            "audience": "oncall",
            "targets": [{"kind": "Node", "name": "gpu-node-07"}],
            "dedup_key": "quarantine/gpu-node-07",
            "incident": "gpu-health/node/gpu-node-07",
            "audit_event_id": "01920000-0000-7000-8000-000000000002",
        }
    )

    def nats_subject(self) -> str:
        return subject(f"notify.{self.severity.value}", self.topic)

    def about(self) -> str:
        return self.targets[0].key() if self.targets else f"topic/{self.topic}"

    def concern(self) -> str:
        return str(self.severity.value)

    def incident_key(self) -> str:
        """The incident this notice belongs to: `incident`, else its dedup key, else its target."""
        return self.incident or self.dedup_key or f"{self.topic}/{self.about()}"
