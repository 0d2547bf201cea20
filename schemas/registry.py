"""Event type name → data model, stream and subject pattern."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from schemas.base import Event, EventData, make_event
from schemas.capacity import CapacityChanged
from schemas.credentials import CredentialDue, CredentialFailed, CredentialRenewed
from schemas.dlq import DeadLetter
from schemas.energy import EnergyNode, EnergyPod
from schemas.falco import FalcoAlert
from schemas.gpu import GpuHealth, GpuHeartbeat, GpuTelemetry, GpuXid
from schemas.maintenance import Maintenance
from schemas.node import NodeFinding, NodeHealth
from schemas.notify import Notification
from schemas.remediation import Remediation
from schemas.session import SessionActivity, SessionIdle
from schemas.streams import StreamSpec, patterns_overlap, stream_spec, subject_matches


@dataclass(frozen=True)
class EventType:
    name: str
    model: type[EventData]
    stream: StreamSpec
    subject_pattern: str
    description: str
    envelope: type[Event[Any]]

    @property
    def subject_wildcard(self) -> str:
        """The pattern with every `<placeholder>` as `*`."""
        return ".".join("*" if t.startswith("<") else t for t in self.subject_pattern.split("."))


_MODELS: tuple[type[EventData], ...] = (
    GpuHealth,
    GpuXid,
    GpuHeartbeat,
    GpuTelemetry,
    EnergyNode,
    EnergyPod,
    SessionActivity,
    SessionIdle,
    NodeFinding,
    NodeHealth,
    FalcoAlert,
    CredentialDue,
    CredentialRenewed,
    CredentialFailed,
    Maintenance,
    Remediation,
    Notification,
    DeadLetter,
    CapacityChanged,
)

REGISTRY: Mapping[str, EventType] = MappingProxyType(
    {
        m.TYPE: EventType(
            name=m.TYPE,
            model=m,
            stream=stream_spec(m.STREAM),
            subject_pattern=m.SUBJECT_PATTERN,
            description=(m.__doc__ or "").strip().splitlines()[0],
            envelope=Event[m],  # type: ignore[valid-type]
        )
        for m in _MODELS
    }
)

# Events that arrive without CloudEvents headers, in a producer's native JSON (Falcosidekick).
NATIVE_SUBJECTS: Mapping[str, str] = MappingProxyType({"falco.>": FalcoAlert.TYPE})


class UnknownEventType(KeyError):
    def __str__(self) -> str:
        return f"unknown event type {self.args[0]!r}; known: {', '.join(sorted(REGISTRY))}"


def lookup(type_name: str) -> EventType:
    try:
        return REGISTRY[type_name]
    except KeyError:
        raise UnknownEventType(type_name) from None


def native_type_for_subject(subject: str) -> EventType | None:
    for pattern, type_name in NATIVE_SUBJECTS.items():
        if subject_matches(pattern, subject):
            return REGISTRY[type_name]
    return None


def types_on(subjects: Iterable[str]) -> tuple[str, ...]:
    """The event types (sorted) whose subjects some of `subjects` (NATS subjects or
    wildcards, e.g. a publisher's grants) match: all a publisher granted `subjects` can
    publish; a type is in when any of its subjects is."""
    granted = tuple(subjects)
    return tuple(
        sorted(
            name
            for name, et in REGISTRY.items()
            if any(patterns_overlap(et.subject_wildcard, s) for s in granted)
        )
    )


def example_event(type_name: str) -> Event[EventData]:
    """A valid example event of this type, with a fresh id and time."""
    et = lookup(type_name)
    return make_event(et.model.example(), source=et.model.EXAMPLE_SOURCE)
