"""What the recovery service's parts share: its names, settings, the retry-limit guard and
the `Kit` (bus, cluster, KV, kernel runner and guards, tools) each part acts with."""

from __future__ import annotations

import asyncio
import time
from dataclasses import InitVar, dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import structlog
from nats.js.errors import NoKeysError
from pydantic import Field

from nodeward.aio import KeyedLocks
from nodeward.bus import Bus
from nodeward.bus.kv import TypedKV
from nodeward.durations import Duration
from nodeward.handlers import Consuming
from nodeward.kube import Cluster
from nodeward.kube.base import Obj
from schemas.state.cordon import TAINT_KEY
from schemas.xid import XidCatalog, load_catalog
from services.kernel import (
    Acting,
    ActingSettings,
    ActionRunner,
    BreakerSettings,
    CircuitBreaker,
    Exemptions,
    Guard,
    Proposal,
    Stage,
    Verdict,
    per_action,
    table,
)
from services.kernel.control import (
    ControlSettings,
)
from services.kernel.marks import NodeMarks
from services.kernel.severities import FAILURE_WARNS, GOOD_NEWS, LOUD
from services.recovery.hang import HangSettings, floor_refusal, judge
from services.recovery.policy import (
    within_limit,
)
from services.recovery.remediators import (
    Tools,
)
from services.recovery.scope import DrainScope
from services.recovery.state import (
    BUCKET,
    PAUSE_KEY,
    PauseRecord,
    Plan,
    RecoveryCounts,
    RecoveryRecord,
    count_key,
)

NAME = "recovery"
ACTOR = "service/recovery"
OWNER = "recovery"  # of its marks on the node (the reboot request)
TOPIC = "recovery"
CORDON_ACTOR = "service/cordon"
GPU_RESOURCE = "nvidia.com/gpu"
# Steps that go well are news, not pages; a failed step that recovery tries again is a
# warning; the escalation (critical, set on its proposal) pages.
SEVERITIES = per_action(
    (
        table(GOOD_NEWS, FAILURE_WARNS),
        ("recover", "drain", "reset", "reboot", "validate", "release", "power-on", "unfence"),
    ),
    # a hung node taken out of service by its BMC: worth a look, not a page
    (table(LOUD, FAILURE_WARNS), ("power-off", "fence")),
)
BACKOFF_CAP_S = 600.0


class RecoverySettings(ActingSettings, Consuming):
    """`services.recovery` in the config file: its durables are `<consumer>-quarantines` and
    `<consumer>-maintenance` (`consumer`: `recovery` unless set)."""

    bucket: str = BUCKET
    subjects: list[str] = Field(default_factory=lambda: ["remediation.quarantine.>"], min_length=1)
    maintenance_subjects: list[str] = Field(
        default_factory=lambda: [
            "maintenance.done.>",
            "maintenance.failed.>",
            "maintenance.cancelled.>",
        ],
        min_length=1,
    )
    node_subjects: list[str] = Field(default_factory=lambda: ["node.health.>"], min_length=1)
    """the detector's findings (`<consumer>-nodes`)"""
    remediators: dict[Plan, str] = Field(
        default_factory=lambda: {Plan.RESET: "gpu-reset", Plan.REBOOT: "reboot-annotation"},
        description="the remediator per plan: gpu-reset, reboot-annotation, webhook",
    )
    webhook_url: str | None = None
    """for the `webhook` remediator"""
    max_trigger_age: Duration = timedelta(minutes=15)
    """an older quarantine (a replay on a new consumer) starts no recovery"""
    drain_deadline: Duration = timedelta(minutes=10)
    reset_drains: DrainScope = "gpu"
    """what a GPU reset drains: `gpu`, the pods holding the failed GPUs (whole, a MIG
    instance, a time-sliced share), as their agent named them; `node`, every pod, as a
    reboot does (systems whose GPUs must be reset together, e.g. NVSwitch without Fabric
    Manager). A node's label `nodeward.io/reset-drains` (`gpu` or `node`) overrides it"""
    move_sessions: bool = True
    """the drain moves opted-in stateful sessions (annotation nodeward.io/move=true) to other
    nodes first, when the fault leaves the GPU's memory sound (`policy.allows_move`)"""
    """the maintenance's deadline for every pod"""
    drain_timeout: Duration = timedelta(minutes=30)
    """the node not drained (no `maintenance.done`, or pods left) by then: escalate"""
    evict_retry: Duration = timedelta(seconds=30)
    """how often the pods a drain left are evicted again (budgets honoured)"""
    retry_backoff: Duration = timedelta(seconds=30)
    """the wait before the next reset or reboot after a failed one (doubling)"""
    skip_namespaces: list[str] = Field(
        default_factory=lambda: ["kube-system", "nodeward"],
        description="namespaces whose pods may stay on a node that is reset or rebooted",
    )
    reboot_timeout: Duration = timedelta(minutes=20)
    """no new bootID by then: a failed attempt"""
    validate_timeout: Duration = timedelta(minutes=5)
    """the GPU agent does not answer (still booting) this long: a failed attempt"""
    request_timeout: Duration = timedelta(seconds=30)
    """one request to an agent or a service"""
    dcgm_level: int = Field(default=1, ge=1, le=4, description="`dcgmi diag -r LEVEL`")
    burn_in: Duration = timedelta(0)
    """0: no GPU burn-in"""
    max_validation_failures: int = Field(default=2, ge=1)
    max_attempts: int = Field(
        default=3, ge=1, description="reset/reboot requests per recovery before escalating"
    )
    retry_limit: int = Field(default=3, ge=1, description="recoveries per node per window")
    retry_window: Duration = timedelta(hours=24)
    interval: Duration = timedelta(seconds=2)
    """the loop's pass"""
    breaker: BreakerSettings = BreakerSettings()
    controls: ControlSettings = ControlSettings()
    hang: HangSettings = HangSettings()
    """hung nodes: detected, and recovered through their group's ladder and their BMC"""


def has_quarantine(node: Obj) -> bool:
    taints = (node.get("spec") or {}).get("taints") or []
    return any(t.get("key") == TAINT_KEY for t in taints)


def expected_gpus(node: Obj) -> int | None:
    raw = ((node.get("status") or {}).get("capacity") or {}).get(GPU_RESOURCE)
    try:
        return int(raw) if raw is not None else None
    except (TypeError, ValueError):
        return None


class RetryLimit:
    """A guard: at most `limit` recoveries of one node per `window` (KV `count.<node>`)."""

    name = "retry_limit"
    stage = Stage.RATE_LIMIT

    def __init__(self, counts: TypedKV[RecoveryCounts], settings: RecoverySettings) -> None:
        self.counts = counts
        self.limit = settings.retry_limit
        self.window = settings.retry_window.total_seconds()

    async def check(self, proposal: Proposal) -> Verdict | None:
        if proposal.action != "recover":
            return None
        entry = await self.counts.get(count_key(proposal.target.name))
        started = entry.value.started if entry else []
        if within_limit(started, time.time(), limit=self.limit, window_s=self.window):
            return None
        return Verdict(
            self.name,
            f"refused: {self.why(proposal.target.name)}; it stays quarantined for on-call",
        )

    def why(self, node: str) -> str:
        return f"{node} started {self.limit} recoveries within {self.window / 3600:g}h"

    async def count(self, node: str, incident_time: float) -> None:
        def add(current: RecoveryCounts | None) -> RecoveryCounts | None:
            started = [
                t for t in (current.started if current else []) if time.time() - t < self.window
            ]
            if incident_time in started:
                return None
            return RecoveryCounts(started=[*started, incident_time])

        await self.counts.update(count_key(node), add)


class Paused:
    """A guard: no new remediation while the operators' pause (KV `pause`) is on;
    `nodeward recovery pause` / `resume`."""

    name = "paused"
    stage = Stage.EXEMPTIONS

    def __init__(self, pauses: TypedKV[PauseRecord]) -> None:
        self.pauses = pauses

    async def current(self) -> PauseRecord | None:
        entry = await self.pauses.get(PAUSE_KEY)
        return entry.value if entry else None

    async def check(self, proposal: Proposal) -> Verdict | None:
        pause = await self.current()
        if pause is None:
            return None
        return Verdict(
            self.name,
            f"refused: remediation paused by {pause.by} ({pause.reason}); "
            "`nodeward recovery resume` lifts it",
        )


class Floor:
    """A guard: remediating a node of a group (its ladder's selector) must leave at least
    the ladder's `min_healthy` of its other nodes healthy (Ready, in no recovery)."""

    name = "min_healthy"
    stage = Stage.BREAKER

    def __init__(
        self, cluster: Cluster, records: TypedKV[RecoveryRecord], settings: RecoverySettings
    ) -> None:
        self.cluster, self.records, self.settings = cluster, records, settings

    async def check(self, proposal: Proposal) -> Verdict | None:
        name = proposal.details.get("ladder")
        ladder = next((x for x in self.settings.hang.ladders if x.name == name), None)
        if ladder is None:
            return None
        group = await self.cluster.nodes.list(label_selector=ladder.selector or None)
        busy = []
        try:
            keys = await self.records.kv.keys()
        except NoKeysError:
            keys = []
        for key in keys:
            if key.startswith("node."):
                entry = await self.records.get(key)
                if entry is not None and not entry.value.terminal:
                    busy.append(entry.value.node)
        now = datetime.now(UTC)
        why = floor_refusal(
            ladder, group, proposal.target.name, busy,
            unhealthy=lambda n: bool(judge(n, now, self.settings.hang)),
        )  # fmt: skip
        return None if why is None else Verdict(self.name, f"refused: {why}")


@dataclass
class Kit:
    """What the intake, the workflow and the controls act with (one per service)."""

    bus: Bus
    cluster: Cluster
    records: TypedKV[RecoveryRecord]
    counts: TypedKV[RecoveryCounts]
    marks: NodeMarks
    breaker: CircuitBreaker
    settings: RecoverySettings
    acting: InitVar[Acting]
    """Its runner, exemptions and controls' guards (`acting_controlled`)."""
    catalog: XidCatalog = field(default_factory=load_catalog)
    runner: ActionRunner = field(init=False)
    exemptions: Exemptions = field(init=False)
    control_guards: tuple[Guard, ...] = field(init=False)
    retry_limit: RetryLimit = field(init=False)
    pause: Paused = field(init=False)
    floor: Floor = field(init=False)
    start_guards: list[Guard] = field(init=False)
    tools: Tools = field(init=False)
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when a recovery can move on: the loop passes now."""
    node_lock: KeyedLocks = field(default_factory=KeyedLocks)
    """One node's recovery stepped one at a time."""
    log: Any = field(init=False)

    def __post_init__(self, acting: Acting) -> None:
        self.runner, self.exemptions = acting.runner, acting.exemptions
        self.control_guards = acting.control_guards
        self.retry_limit = RetryLimit(self.counts, self.settings)
        self.pause = Paused(TypedKV(self.records.kv, PauseRecord))
        self.floor = Floor(self.cluster, self.records, self.settings)
        self.start_guards = [self.exemptions, self.pause, self.retry_limit, self.breaker]
        self.tools = Tools(
            nc=self.bus.nc,
            cluster=self.cluster,
            marks=self.marks,
            timeout_s=self.settings.request_timeout.total_seconds(),
            webhook_url=self.settings.webhook_url,
        )
        self.log = structlog.get_logger().bind(service=NAME)
