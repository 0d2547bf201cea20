"""A Falco runtime alert, in Falco's own JSON form.

The body is exactly what Falcosidekick publishes on NATS (`falco.<priority>.<rule>`) and
what Falco's `http_output` POSTs (the same, without `uuid`), so either parses unchanged.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, ClassVar

from pydantic import Field, ValidationError, field_validator

from schemas.base import EventData
from schemas.examples import example
from schemas.ids import stable_id
from schemas.tokens import falco_rule_token

TRUNCATED = "[...]"
"""What Falcosidekick appends to a string it cut short (payloads over 4096 characters)."""
TEST_RULE = "Test rule"
TEST_OUTPUT = "This is a test from falcosidekick"
"""The rule of the event Falcosidekick's `/test` endpoint sends to every output."""
ISOLATE_LABEL = "nodeward.io/isolated"
"""On a pod the Falco response cut off the network: the pod is evidence, and no nodeward
drain evicts or deletes it (`services.kernel.drain`)."""


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

    @classmethod
    def parse(cls, text: str) -> FalcoPriority:
        """A priority from any spelling Falco or Falcosidekick uses (`info`, `CRITICAL`, ...)."""
        found = _PRIORITY_ALIASES.get(text.strip().lower())
        if found is None:
            raise ValueError(f"unknown Falco priority {text!r}")
        return found


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
    output: str = Field(default="", description="absent with json_include_output_property: false")
    priority: FalcoPriority
    rule: str = Field(min_length=1)
    time: datetime
    output_fields: dict[str, Any] = Field(default_factory=dict)
    source: str = "syscall"
    tags: list[str] = Field(default_factory=list)
    hostname: str | None = None

    model_config = example(
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
    )

    @field_validator("time", mode="before")
    @classmethod
    def _time(cls, value: Any) -> Any:
        """Integer (or digit-string) epoch times: nanoseconds, as Falco's `evt.time`, down to
        seconds, told apart by magnitude."""
        if isinstance(value, str) and value.strip().isdigit():
            value = int(value.strip())
        if isinstance(value, int | float) and not isinstance(value, bool):
            seconds = float(value)
            for scale in (1e9, 1e6, 1e3):
                if abs(seconds) >= scale * 1e8:  # after 1973 at that scale
                    seconds = value / scale
                    break
            try:
                return datetime.fromtimestamp(seconds, UTC)
            except (OverflowError, OSError, ValueError):
                raise ValueError(f"time {value!r} is out of range") from None
        return value

    @field_validator("output", "source", mode="before")
    @classmethod
    def _text(cls, value: Any) -> Any:
        return "" if value is None else value

    @field_validator("source", mode="after")
    @classmethod
    def _source(cls, value: str) -> str:
        return value or "syscall"

    @field_validator("output_fields", mode="before")
    @classmethod
    def _fields(cls, value: Any) -> Any:
        return {} if value is None else value

    @field_validator("tags", mode="before")
    @classmethod
    def _tags(cls, value: Any) -> Any:
        if value is None:
            return []
        if isinstance(value, str):  # a comma-separated list
            return [t.strip() for t in value.split(",") if t.strip()]
        return value

    @field_validator("hostname", "uuid", mode="before")
    @classmethod
    def _blank(cls, value: Any) -> Any:
        return value or None

    @field_validator("priority", mode="before")
    @classmethod
    def _priority(cls, value: Any) -> Any:
        if isinstance(value, str):
            return FalcoPriority.parse(value)
        return value

    @classmethod
    def parse(cls, body: bytes | str) -> FalcoAlert:
        """An alert from a JSON body, tolerating what real ones contain.

        The fast path is pydantic's own parser. A body it refuses as JSON (invalid UTF-8
        bytes, lone surrogate escapes such as `\\ud800`) is read again leniently: bad bytes
        and lone surrogates become U+FFFD. Raises `ValidationError` or `ValueError`.
        """
        try:
            return cls.model_validate_json(body)
        except ValidationError as exc:
            if not any(e["type"] == "json_invalid" for e in exc.errors(include_url=False)):
                raise
        text = body.decode("utf-8", errors="replace") if isinstance(body, bytes) else body
        data = _clean(json.loads(text))  # ValueError when it is not JSON at all
        return cls.model_validate(data)

    @property
    def namespace(self) -> str | None:
        """`k8s.ns.name`, or None when null, absent or cut short."""
        return _name(self.output_fields.get("k8s.ns.name"))

    @property
    def pod(self) -> str | None:
        """`k8s.pod.name`, or None when null (a host event, or before the runtime lookup
        finished), absent or cut short."""
        return _name(self.output_fields.get("k8s.pod.name"))

    @property
    def container(self) -> str | None:
        return _name(self.output_fields.get("container.name"))

    @property
    def is_test(self) -> bool:
        """Falcosidekick's test event (`POST /test`, `falco.debug.test_rule`): nothing to act on.

        Recognised by what its test handler has sent in every version: rule `Test rule`,
        priority Debug and output `This is a test from falcosidekick`. Its `source` is not
        reliable: absent before 2.25, then `syscalls` (Falcosidekick's default), `internal`
        (set for the test rule from 2.29) while the handler's own body says `debug` (2.31).
        """
        return (
            self.rule == TEST_RULE
            and self.priority == FalcoPriority.DEBUG
            and self.output.strip() == TEST_OUTPUT
        )

    def message(self) -> str:
        """`output` without the `HH:MM:SS.nnnnnnnnn: <Priority> ` prefix Falco puts first."""
        text = self.output
        head, sep, rest = text.partition(": ")
        if sep and head[:2].isdigit() and ":" in head:
            text = rest
            first, space, tail = text.partition(" ")
            if space and first.lower() in _PRIORITY_ALIASES:
                text = tail
        return text

    def stable_id(self) -> str:
        """The event id of this alert on the bus: the same alert gets the same id whether it
        arrives from Falcosidekick on NATS or through the HTTP ingest (JetStream drops the
        second within its duplicate window)."""
        return stable_id(self.time, self.hostname or "", self.rule, self.output)

    def nats_subject(self) -> str:
        return ".".join(("falco", self.priority.value.lower(), falco_rule_token(self.rule)))

    def about(self) -> str:
        if self.namespace and self.pod:
            return f"pod/{self.namespace}/{self.pod}"
        return f"node/{self.hostname or 'unknown'}"

    def concern(self) -> str:
        rank = self.priority.rank
        return "critical" if rank <= 2 else "warning" if rank <= 4 else "info"


def _name(value: Any) -> str | None:
    if value is None or value == "":
        return None
    text = str(value)
    return None if text.endswith(TRUNCATED) else text


def _clean(value: Any) -> Any:
    """Lone surrogates (from `\\udXXX` escapes) replaced by U+FFFD, recursively."""
    if isinstance(value, str):
        return value.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    if isinstance(value, list):
        return [_clean(v) for v in value]
    if isinstance(value, dict):
        return {_clean(k): _clean(v) for k, v in value.items()}
    return value
