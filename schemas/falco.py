"""A Falco runtime alert, in Falco's own JSON form.

The body is exactly what Falcosidekick publishes on NATS (`falco.<priority>.<rule>`) and
what Falco's `http_output` POSTs (the same, without `uuid`), so either parses unchanged.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any, ClassVar

from pydantic import ConfigDict, Field, field_validator

from schemas.base import EventData
from schemas.tokens import falco_rule_token


class FalcoPriority(StrEnum):
    """Falco priorities, most severe first, spelled as Falcosidekick normalises them."""

    EMERGENCY = "Emergency"
    ALERT = "Alert"
    CRITICAL = "Critical"
    ERROR = "Error"
    WARNING = "Warning"
    NOTICE = "Notice"
    INFORMATIONAL = "Informational"
    DEBUG = "Debug"

    @property
    def rank(self) -> int:
        """0 for Emergency up to 7 for Debug."""
        return list(FalcoPriority).index(self)


_PRIORITY_ALIASES = {p.value.lower(): p for p in FalcoPriority} | {
    "info": FalcoPriority.INFORMATIONAL
}


class FalcoAlert(EventData):
    """One Falco alert."""

    TYPE: ClassVar[str] = "falco.alert.v1"
    STREAM: ClassVar[str] = "SECURITY"
    SUBJECT_PATTERN: ClassVar[str] = "falco.<priority>.<rule>"
    EXAMPLE_SOURCE: ClassVar[str] = "falco/gpu-node-07"

    uuid: str | None = Field(default=None, description="set by Falcosidekick, absent from Falco")
    output: str
    priority: FalcoPriority
    rule: str = Field(min_length=1)
    time: datetime
    output_fields: dict[str, Any] = Field(default_factory=dict)
    source: str = "syscall"
    tags: list[str] = Field(default_factory=list)
    hostname: str | None = None

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "uuid": "6f1d0c3e-8a2b-4c7d-9e10-2b3a4c5d6e71",
                    "output": "14:02:11.318274915: Notice A shell was spawned in a container with an attached terminal | user=root process=bash k8s_pod_name=jupyter-alice-0 k8s_ns_name=user-alice",
                    "priority": "Notice",
                    "rule": "Terminal shell in container",
                    "time": "2026-08-20T14:02:11.318274915Z",
                    "output_fields": {
                        "container.id": "3f9c2a7d81be",
                        "container.name": "notebook",
                        "k8s.ns.name": "user-alice",
                        "k8s.pod.name": "jupyter-alice-0",
                        "proc.name": "bash",
                        "user.name": "root",
                    },
                    "source": "syscall",
                    "tags": ["T1059", "container", "maturity_stable", "mitre_execution", "shell"],
                    "hostname": "gpu-node-07",
                }
            ]
        }
    )

    @field_validator("priority", mode="before")
    @classmethod
    def _priority(cls, value: Any) -> Any:
        if isinstance(value, str):
            found = _PRIORITY_ALIASES.get(value.strip().lower())
            if found is None:
                raise ValueError(f"unknown Falco priority {value!r}")
            return found
        return value

    @property
    def namespace(self) -> str | None:
        value = self.output_fields.get("k8s.ns.name")
        return str(value) if value else None

    @property
    def pod(self) -> str | None:
        value = self.output_fields.get("k8s.pod.name")
        return str(value) if value else None

    def nats_subject(self) -> str:
        return ".".join(("falco", self.priority.value.lower(), falco_rule_token(self.rule)))

    def about(self) -> str:
        if self.namespace and self.pod:
            return f"pod/{self.namespace}/{self.pod}"
        return f"node/{self.hostname or 'unknown'}"
