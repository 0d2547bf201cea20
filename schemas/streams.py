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
class Partitioning:
    """How a stream's subjects split into partitions by key (NATS deterministic subject
    partitioning). With `bus.partitions` P > 1 the stream stores a subject matching `source`
    with `{{partition(P, keys)}}` appended as its last token: `gpu.health.n1.0` is stored
    as `gpu.health.n1.0.5`. `keys` are the wildcards of `source` (1-based, as NATS counts
    them) whose tokens are the key: every subject of one key lands in one partition."""

    source: str
    keys: tuple[int, ...]

    def __post_init__(self) -> None:
        wildcards = self.source.split(".").count("*")
        if ">" in self.source.split(".") or not self.keys:
            raise ValueError("a partitioned source has only `*` wildcards and at least one key")
        if any(k < 1 or k > wildcards for k in self.keys):
            raise ValueError(f"keys {self.keys} name wildcards {self.source} does not have")

    @staticmethod
    def index(keys: tuple[str, ...], count: int) -> int:
        """The partition the server stores a key in: FNV-1a (32 bit) of the key's tokens
        concatenated, modulo `count`, as nats-server's `partition` transform computes it."""
        h = 0x811C9DC5
        for byte in "".join(keys).encode():
            h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
        return h % count

    def destination(self, count: int) -> str:
        """The stream's subject transform destination for `count` partitions."""
        out, n = [], 0
        for t in self.source.split("."):
            if t == "*":
                n += 1
                out.append(f"{{{{wildcard({n})}}}}")
            else:
                out.append(t)
        keys = ",".join(str(k) for k in self.keys)
        return ".".join([*out, f"{{{{partition({count},{keys})}}}}"])

    def stored(self, subject: str, count: int) -> str:
        """The subject the stream stores `subject` (one matching `source`) under with
        `count` partitions: `gpu.heartbeat.n1` as `gpu.heartbeat.n1.<partition>`."""
        tokens, src = subject.split("."), self.source.split(".")
        if count <= 1 or len(tokens) != len(src):
            return subject
        wild = [t for t, s in zip(tokens, src, strict=True) if s == "*"]
        return f"{subject}.{self.index(tuple(wild[k - 1] for k in self.keys), count)}"

    def narrow(self, pattern: str, index: int) -> str:
        """Consumer filter `pattern` (e.g. `gpu.health.>`) limited to partition `index`:
        `gpu.health.*.*.<index>`. ValueError if no subject of `source` matches `pattern`."""
        src, flt = self.source.split("."), pattern.split(".")
        out: list[str] = []
        for i, s in enumerate(src):
            f = flt[i] if i < len(flt) else None
            if f == ">":
                out += src[i:]
                break
            if f is None or (s != "*" and f not in ("*", s)):
                raise ValueError(f"{pattern!r} has no subject partitioned by {self.source!r}")
            out.append(s if f == "*" else f)
        else:
            if len(flt) > len(src):
                raise ValueError(f"{pattern!r} has no subject partitioned by {self.source!r}")
        return ".".join([*out, str(index)])


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
    # Subjects split by key when `bus.partitions` > 1 (consumers that keep order per key).
    partitioning: Partitioning | None = None
    # Direct get (any replica answers a read of one message): a node's agent reads back its
    # own newest message for the bus's store time (`nodeward.bus.clock`).
    allow_direct: bool = False


DAY = timedelta(days=1)

STREAMS: tuple[StreamSpec, ...] = (
    StreamSpec(
        "GPU",
        ("gpu.health.>", "gpu.xid.>"),
        "GPU health changes and XIDs",
        30 * DAY,
        # gpu.{health,xid}.<node>.<gpu>: per node
        partitioning=Partitioning("gpu.*.*.*", (2,)),
    ),
    StreamSpec(
        "HEARTBEATS",
        ("gpu.heartbeat.>",),
        "every GPU of a node restated per heartbeat interval (routine, apart from changes)",
        timedelta(hours=1),
        duplicate_window=timedelta(seconds=30),
        partitioning=Partitioning("gpu.heartbeat.*", (1,)),  # gpu.heartbeat.<node>
        allow_direct=True,
    ),
    StreamSpec(
        "TELEMETRY",
        ("gpu.telemetry.>",),
        "sampled GPU telemetry",
        timedelta(hours=6),
        duplicate_window=timedelta(seconds=30),
    ),
    StreamSpec(
        "ENERGY", ("energy.>",), "energy and CO2e per node and pod", 30 * DAY, allow_direct=True
    ),
    StreamSpec(
        "SESSIONS",
        ("session.>",),
        "session activity and idleness",
        7 * DAY,
        # session.{activity,idle}.<node>.<ns>.<pod>: per pod
        partitioning=Partitioning("session.*.*.*.*", (3, 4)),
    ),
    StreamSpec("NODES", ("node.>",), "node checks' findings (CPU governor, ...)", 90 * DAY),
    StreamSpec("SECURITY", ("falco.>",), "Falco runtime alerts", 30 * DAY),
    StreamSpec("CREDENTIALS", ("credentials.>",), "credential renewal work and outcomes", 30 * DAY),
    StreamSpec(
        "MAINTENANCE",
        ("maintenance.>",),
        "node maintenance phases",
        90 * DAY,
        partitioning=Partitioning("maintenance.*.*", (2,)),  # maintenance.<phase>.<node>
    ),
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
