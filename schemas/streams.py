"""The JetStream stream table: every subject nodeward uses belongs to exactly one stream."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum


class Retention(StrEnum):
    LIMITS = "limits"
    INTEREST = "interest"
    WORKQUEUE = "workqueue"


class Storage(StrEnum):
    FILE = "file"
    MEMORY = "memory"


@dataclass(frozen=True)
class StreamSpec:
    name: str
    subjects: tuple[str, ...]
    description: str
    max_age: timedelta
    retention: Retention = Retention.LIMITS
    storage: Storage = Storage.FILE
    replicas: int = 1
    duplicate_window: timedelta = timedelta(minutes=2)
    max_bytes: int = -1


DAY = timedelta(days=1)

STREAMS: tuple[StreamSpec, ...] = (
    StreamSpec("GPU", ("gpu.health.>", "gpu.xid.>"), "GPU health changes and XIDs", 30 * DAY),
    StreamSpec(
        "HEARTBEATS",
        ("gpu.heartbeat.>",),
        "every GPU of a node restated per heartbeat interval (routine, apart from changes)",
        timedelta(hours=1),
        duplicate_window=timedelta(seconds=30),
    ),
    StreamSpec(
        "TELEMETRY",
        ("gpu.telemetry.>",),
        "sampled GPU telemetry",
        timedelta(hours=6),
        duplicate_window=timedelta(seconds=30),
    ),
    StreamSpec("ENERGY", ("energy.>",), "energy and CO2e per node and pod", 30 * DAY),
    StreamSpec("SESSIONS", ("session.>",), "session activity and idleness", 7 * DAY),
    StreamSpec("NODES", ("node.>",), "node checks' findings (CPU governor, ...)", 90 * DAY),
    StreamSpec("SECURITY", ("falco.>",), "Falco runtime alerts", 30 * DAY),
    StreamSpec("CREDENTIALS", ("credentials.>",), "credential renewal work and outcomes", 30 * DAY),
    StreamSpec("MAINTENANCE", ("maintenance.>",), "node maintenance phases", 90 * DAY),
    StreamSpec("AUDIT", ("remediation.>",), "every action taken or refused", 365 * DAY),
    StreamSpec("NOTIFY", ("notify.>",), "notification requests for people", 7 * DAY),
    StreamSpec("CAPACITY", ("capacity.>",), "free GPUs per model and profile, on change", 7 * DAY),
    StreamSpec(
        "DLQ", ("dlq.>",), "messages a consumer could not process, with the error", 30 * DAY
    ),
)


def stream_spec(name: str) -> StreamSpec:
    for spec in STREAMS:
        if spec.name == name:
            return spec
    raise KeyError(f"no stream named {name!r}")


def subject_matches(pattern: str, subject: str) -> bool:
    """NATS wildcard matching: `*` is one token, a trailing `>` is one or more."""
    p_tokens = pattern.split(".")
    s_tokens = subject.split(".")
    for i, p in enumerate(p_tokens):
        if p == ">":
            return len(s_tokens) > i
        if i >= len(s_tokens) or (p != "*" and p != s_tokens[i]):
            return False
    return len(p_tokens) == len(s_tokens)


def stream_for_subject(subject: str) -> StreamSpec | None:
    for spec in STREAMS:
        if any(subject_matches(p, subject) for p in spec.subjects):
            return spec
    return None


def patterns_overlap(a: str, b: str) -> bool:
    """True if some subject matches both wildcard patterns."""
    ta, tb = a.split("."), b.split(".")
    for i in range(max(len(ta), len(tb))):
        x = ta[i] if i < len(ta) else None
        y = tb[i] if i < len(tb) else None
        if x == ">" or y == ">":
            return x is not None and y is not None  # `>` needs at least one token here
        if x is None or y is None:
            return False
        if x != y and "*" not in (x, y):
            return False
    return True


def pattern_within(a: str, b: str) -> bool:
    """True if every subject matching pattern `a` also matches pattern `b`."""
    ta, tb = a.split("."), b.split(".")
    for i, y in enumerate(tb):
        if y == ">":
            return len(ta) > i
        if i >= len(ta):
            return False
        x = ta[i]
        if x == ">" or y not in ("*", x):
            return False
    return len(ta) == len(tb)
