"""What the accounting service keeps in KV (bucket `accounting`): hourly rollups.

- `USAGE`, key `usage.<hour>.<node>.<ns>.<pod>`: one pod's hour on one node: energy, CO2e,
  GPU-seconds held, GPU utilisation (measured GPU-seconds and sessions' samples), sessions
  warned and stopped, with the ids of the events counted into it. The totals and the ids
  are one value, written with a revision check, so an event is counted once whatever is
  redelivered or restarted.
- `NODE_HOURS`, key `node.<hour>.<node>`: the time a node's energy readings cover in that
  hour (the rest is a gap, shown as such), with the ids counted.
- `IDLE`, key `idle.<ns>.<pod>.<period>`: one idle period of a session (its start and the
  longest idle time reported); idle GPU-hours are GPUs held x idle time within a window.
- `PODS`, key `pod.<ns>.<pod>`: who a pod is charged to (its owner, node, GPU model), kept
  so a pod gone from the API is still charged to its owner.
- `FINDINGS`, key `finding.<node>.<check>`: the last node finding on-call was told about.

`<hour>` is `YYYYMMDDHH` (UTC).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TypeVar

from pydantic import BaseModel, Field

from schemas.state import Bucket
from schemas.tokens import token

M = TypeVar("M", bound=BaseModel)

BUCKET = "accounting"
HOUR = timedelta(hours=1)
NO_NODE = "-"
"""The node token of a cell whose node is not known (a session stopped before any energy)."""


def hour_of(at: datetime) -> datetime:
    """The UTC hour `at` falls in."""
    return at.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def hour_token(hour: datetime) -> str:
    return hour.astimezone(UTC).strftime("%Y%m%d%H")


def _kind(record: type[M], prefix: str, key: Callable[..., str], what: str) -> Bucket[M]:
    """A kind of record in the accounting bucket (`what`: its description; the key layouts
    are the module's docstring's)."""
    return Bucket(BUCKET, record, prefix=prefix, key=key, description=f"accounting: {what}")


class Counted(BaseModel):
    """A rollup that remembers which events it counted (ids), so none counts twice."""

    counted: list[str] = Field(default_factory=list)

    def has(self, event_id: str) -> bool:
        return event_id in self.counted


class UsageCell(Counted):
    """One pod's hour on one node."""

    hour: datetime
    node: str
    namespace: str
    pod: str
    owner: str
    model: str | None = None
    energy_j: float = 0.0
    cpu_energy_j: float = 0.0
    gpu_energy_j: float = 0.0
    co2e_g: float = 0.0
    carbon_energy_j: float = 0.0
    """Energy that came with a carbon intensity (the rest has no CO2e)."""
    carbon: list[str] = Field(default_factory=list, description="provider/basis/zone used")
    gpu_s: float = 0.0
    """GPU-seconds held (GPUs x interval seconds, as energy.pod.v1 says)."""
    gpu_unknown_j: float = 0.0
    """Energy of intervals whose GPUs held were not said (older agents)."""
    util_sum: float = 0.0
    """Sum of the sessions' utilisation samples (%, the idleness agent's)."""
    util_samples: int = 0
    gpu_util_s: float = 0.0
    """GPU-seconds whose utilisation the energy agent measured (energy.pod.v1's
    `gpu_utilization_pct`); where there are any they are the cell's utilisation, not the
    samples."""
    gpu_busy_s: float = 0.0
    """Those GPU-seconds x their utilisation: GPU-seconds at full utilisation."""
    warned: int = 0
    stopped: int = 0


def usage_key(hour: datetime, node: str, namespace: str, pod: str) -> str:
    return f"usage.{hour_token(hour)}.{token(node)}.{token(namespace)}.{token(pod)}"


class NodeHour(Counted):
    """What a node's energy readings cover in one hour."""

    hour: datetime
    node: str
    model: str | None = None
    first_start: datetime
    last_end: datetime
    interval_s: float = 0.0
    """Seconds of the hour the node's published intervals span."""
    covered_s: float = 0.0
    """Seconds of those the readings cover (an interval's `covered_s`; 0 when nothing read)."""
    energy_j: float = 0.0
    """What the node measured (all of it: pods, system, idle GPUs), not what its pods were
    attributed."""
    co2e_g: float = 0.0
    carbon_energy_j: float = 0.0
    """The part of `energy_j` with a carbon intensity (so `co2e_g` / it is the intensity)."""


def node_hour_key(hour: datetime, node: str) -> str:
    return f"node.{hour_token(hour)}.{token(node)}"


class IdlePeriod(BaseModel):
    """One idle period of a session: GPUs held and the longest idle time reported."""

    node: str
    namespace: str
    pod: str
    owner: str
    model: str | None = None
    idle_since: datetime
    idle_for_s: float = 0.0
    gpus_held: int = 0

    def idle_gpu_s(self, start: datetime, end: datetime) -> float:
        """GPU-seconds idle within [start, end)."""
        lo = max(self.idle_since, start)
        hi = min(self.idle_since + timedelta(seconds=self.idle_for_s), end)
        return max((hi - lo).total_seconds(), 0.0) * self.gpus_held


def period_token(uid: str | None, idle_since: datetime) -> str:
    raw = f"{uid or ''}/{idle_since.astimezone(UTC).isoformat()}"
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def idle_key(namespace: str, pod: str, period: str) -> str:
    return f"idle.{token(namespace)}.{token(pod)}.{period}"


class PodCharge(BaseModel):
    """Who a pod is charged to, as first read from the API."""

    owner: str
    owner_from: str = Field(description="annotation or namespace")
    node: str | None = None
    model: str | None = None
    uid: str | None = None


def pod_key(namespace: str, pod: str) -> str:
    return f"pod.{token(namespace)}.{token(pod)}"


class FindingRecord(BaseModel):
    """The last finding on-call was told about for one node and check."""

    digest: str
    """`NodeFinding.change_key()` of the finding told."""
    state: str
    summary: str
    event_id: str
    told_at: datetime


def finding_key(node: str, check: str) -> str:
    return f"finding.{token(node)}.{token(check)}"


USAGE = _kind(UsageCell, "usage.", usage_key, "a pod's hour on a node")
NODE_HOURS = _kind(NodeHour, "node.", node_hour_key, "a node's energy coverage per hour")
IDLE = _kind(IdlePeriod, "idle.", idle_key, "a session's idle period")
PODS = _kind(PodCharge, "pod.", pod_key, "who a pod is charged to")
FINDINGS = _kind(FindingRecord, "finding.", finding_key, "the last node finding told to on-call")
