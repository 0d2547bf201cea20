"""services.accounting: who used what energy and GPU time, rolled up per hour, durably.

Four durable consumers: `energy.>` (each pod's interval energy, its GPUs held and CO2e; each
node's interval, for what its readings cover), `session.>` (GPU utilisation samples; idle
periods), the culler's audit records (`remediation.warn.>`, `remediation.stop.>`: sessions
warned and stopped) and `node.>` (node findings, told to on-call once per change).

Each event is added to its KV record, hourly per pod and node (`services/accounting/state.py`;
a node interval across two hours to each, by time), together with its event id in one
revision-checked write: a redelivery or a restart finds its id and adds nothing. An idle period is kept as its start and the longest idle time
reported, so a repeat changes nothing either. Who a pod is charged to (its
`nodeward.io/owner-email` annotation, else its namespace) and its node's GPU model
(`nvidia.com/gpu.product`) are read from the API once and kept. `nodeward report` reads the
records; Prometheus counters per namespace count what was added.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from types import MappingProxyType
from typing import Any

import structlog
from prometheus_client import Counter
from pydantic import AliasChoices, Field

from nodeward.bus import Bus, ConsumerSpec, Delivery
from nodeward.bus.kv import TypedKV
from nodeward.config import Section
from nodeward.durations import Duration
from nodeward.handlers import EventHandler, Runtime, Service, setting
from nodeward.kube import NotFound
from nodeward.metrics import at_zero
from schemas.base import Event
from schemas.capacity import AMD_PRODUCT_LABEL
from schemas.energy import EnergyNode, EnergyPod
from schemas.node import FindingState, NodeFinding
from schemas.notify import Severity
from schemas.remediation import Outcome, Remediation
from schemas.session import SessionActivity, SessionIdle
from services.accounting.access import ACCESS
from services.accounting.rollup import (
    add_node_interval,
    add_pod_energy,
    add_session_action,
    add_utilisation,
    extend_idle,
    midpoint,
    node_hours,
)
from services.accounting.state import (
    BUCKET,
    NO_NODE,
    FindingRecord,
    IdlePeriod,
    NodeHour,
    PodCharge,
    UsageCell,
    finding_key,
    hour_of,
    idle_key,
    node_hour_key,
    period_token,
    pod_key,
    usage_key,
)
from services.kernel import Proposal, TtlCache, acting_for, node_ref
from services.kernel.access import PUBLISHES

NAME = "accounting"
ACTOR = "service/accounting"
TOPIC = "node-tuning"
OWNER_ANNOTATION = "nodeward.io/owner-email"
MODEL_LABEL = "nvidia.com/gpu.product"
_FINDING_SEVERITY = MappingProxyType(
    {FindingState.FINDING: Severity.WARNING, FindingState.OK: Severity.INFO}
)


class AccountingSettings(Section):
    """`services.accounting` in the config file."""

    bucket: str = BUCKET
    consumer: str | None = Field(
        default=None,
        validation_alias=AliasChoices("consumer", "consumer_prefix"),
        description="durable consumers <consumer>-energy, -sessions, -audit, -findings; "
        "the service's name if unset",
    )
    energy_subjects: list[str] = Field(default_factory=lambda: ["energy.>"], min_length=1)
    session_subjects: list[str] = Field(default_factory=lambda: ["session.>"], min_length=1)
    audit_subjects: list[str] = Field(
        default_factory=lambda: ["remediation.warn.>", "remediation.stop.>"], min_length=1
    )
    finding_subjects: list[str] = Field(default_factory=lambda: ["node.finding.>"], min_length=1)
    culler_actor: str = "service/culler"
    """whose warn and stop audits count as sessions"""
    owner_annotation: str = OWNER_ANNOTATION
    model_label: str = MODEL_LABEL
    concurrency: int = Field(default=8, ge=1)
    retention: Duration = timedelta(days=400)
    """a rollup is kept this long after its last change"""
    node_cache: Duration = timedelta(minutes=10)
    """how long a node's GPU model is cached"""


app = Service(
    NAME, settings=AccountingSettings, access=ACCESS, buckets=(BUCKET,), publishes=PUBLISHES
)


def _consumes(
    stream: str, what: str, subjects: str, types: tuple[type[Any], ...], **options: Any
) -> Callable[[EventHandler], EventHandler]:
    """The durable `<consumer>-<what>` on the section's field `subjects`."""
    declared: dict[str, Any] = {"concurrency": setting("concurrency")} | options
    return app.consumes(stream, suffix=what, subjects=setting(subjects), types=types, **declared)


def _per_node_pod(e: Event[Any]) -> str:
    return f"{e.data.node}/{getattr(e.data, 'pod', '')}"


def _per_pod(e: Event[Any]) -> str:
    return f"{e.data.namespace}/{e.data.pod}"


class _Metrics:
    """Per-namespace counters of what was added to the rollups (each event once)."""

    def __init__(self, bus: Bus) -> None:
        r = bus.metrics.registry
        self.energy = Counter(
            "nodeward_accounting_energy_joules",
            "Energy charged to a namespace (GPU energy and CPU-time share)",
            ["namespace"],
            registry=r,
        )
        self.co2e = Counter(
            "nodeward_accounting_co2e_grams",
            "CO2e charged to a namespace",
            ["namespace"],
            registry=r,
        )
        self.gpu = Counter(
            "nodeward_accounting_gpu_seconds",
            "GPU-seconds allocated to a namespace's pods",
            ["namespace"],
            registry=r,
        )
        self.idle = Counter(
            "nodeward_accounting_idle_gpu_seconds",
            "GPU-seconds a namespace's sessions held while idle",
            ["namespace"],
            registry=r,
        )
        self.sessions = Counter(
            "nodeward_accounting_sessions",
            "Sessions warned and stopped by the culler",
            ["namespace", "action"],
            registry=r,
        )
        self.uncovered = Counter(
            "nodeward_accounting_uncovered_seconds",
            "Seconds of a node's published intervals with no energy reading",
            ["node"],
            registry=r,
        )

    def of(self, namespace: str) -> _Metrics:
        """Every counter of `namespace` made at 0 the first time it is charged, so that a
        session warned later is an increase Prometheus sees, not a series born at 1."""
        for counter in (self.energy, self.co2e, self.gpu, self.idle):
            at_zero(counter, namespace=[namespace])
        at_zero(self.sessions, namespace=[namespace], action=["warned", "stopped"])
        return self


class AccountingService:
    def __init__(self, rt: Runtime[AccountingSettings], kv: Any) -> None:
        self.bus, self.cluster, self.settings = rt.bus, rt.acting, rt.config
        self.cells: TypedKV[UsageCell] = TypedKV(kv, UsageCell)
        self.nodes: TypedKV[NodeHour] = TypedKV(kv, NodeHour)
        self.idle: TypedKV[IdlePeriod] = TypedKV(kv, IdlePeriod)
        self.charges: TypedKV[PodCharge] = TypedKV(kv, PodCharge)
        self.findings: TypedKV[FindingRecord] = TypedKV(kv, FindingRecord)
        self.metrics = _Metrics(rt.bus)
        self.runner = acting_for(rt, topic=TOPIC).runner
        self.log = structlog.get_logger().bind(service=NAME)
        self._models = TtlCache[str, str | None](self.settings.node_cache.total_seconds())

    # who pays -------------------------------------------------------------------------
    async def _model(self, node: str) -> str | None:
        return await self._models.get(node, self._read_model)

    async def _read_model(self, node: str) -> str | None:
        try:
            obj = await self.cluster.nodes.get(node)
        except NotFound:
            model = None
        else:
            labels = (obj.get("metadata") or {}).get("labels") or {}
            model = labels.get(self.settings.model_label) or labels.get(AMD_PRODUCT_LABEL)
        return model

    async def charge(self, namespace: str, pod: str, node: str | None) -> PodCharge:
        """Who `namespace/pod` is charged to, from KV, else read from the API and kept."""
        key = pod_key(namespace, pod)
        found = await self.charges.get(key)
        if found is not None and (found.value.node or node is None):
            return found.value
        owner, source, uid = namespace, "namespace", None
        try:
            obj = await self.cluster.pods.get(namespace, pod)
        except NotFound:
            obj = None
        if obj is not None:
            meta = obj.get("metadata") or {}
            uid = meta.get("uid")
            node = node or (obj.get("spec") or {}).get("nodeName")
            email = (meta.get("annotations") or {}).get(self.settings.owner_annotation)
            if email:
                owner, source = str(email).strip(), "annotation"
        if found is not None:  # known owner, the node learnt now
            owner, source, uid = found.value.owner, found.value.owner_from, found.value.uid
        charge = PodCharge(
            owner=owner,
            owner_from=source,
            node=node,
            model=await self._model(node) if node else None,
            uid=uid,
        )
        await self.charges.put(key, charge)
        return charge

    async def _add(
        self, key: str, fresh: UsageCell, add: Callable[[UsageCell], UsageCell | None]
    ) -> bool:
        """Add to the cell at `key` (made from `fresh` if absent); False if already counted."""
        added = False

        def change(current: UsageCell | None) -> UsageCell | None:
            nonlocal added
            new = add(current or fresh)
            added = new is not None
            return new

        await self.cells.update(key, change)
        return added

    def _cell(self, hour: datetime, node: str, ns: str, pod: str, c: PodCharge) -> UsageCell:
        return UsageCell(hour=hour, node=node, namespace=ns, pod=pod, owner=c.owner, model=c.model)

    # handlers -------------------------------------------------------------------------
    @_consumes(
        "ENERGY", "energy", "energy_subjects", (EnergyPod, EnergyNode), order_key=_per_node_pod
    )
    async def handle_energy(self, event: Event[Any], delivery: Delivery) -> None:
        data: EnergyPod | EnergyNode = event.data
        with structlog.contextvars.bound_contextvars(event_id=event.id, node=data.node):
            if isinstance(data, EnergyNode):
                await self._node_interval(event.id, data)
                return
            c = await self.charge(data.namespace, data.pod, data.node)
            hour = hour_of(midpoint(data.interval.start, data.interval.end))
            key = usage_key(hour, data.node, data.namespace, data.pod)
            cell = self._cell(hour, data.node, data.namespace, data.pod, c)
            if await self._add(key, cell, lambda x: add_pod_energy(x, event.id, data)):
                self.metrics.of(data.namespace).energy.labels(data.namespace).inc(data.energy_j)
                if data.co2e_g is not None:
                    self.metrics.co2e.labels(data.namespace).inc(data.co2e_g)
                if data.gpus is not None:
                    seconds = (data.interval.end - data.interval.start).total_seconds()
                    self.metrics.gpu.labels(data.namespace).inc(data.gpus * seconds)

    async def _node_interval(self, event_id: str, data: EnergyNode) -> None:
        model = await self._model(data.node)
        for hour, seconds, covered in node_hours(data):
            added = False

            def change(
                current: NodeHour | None,
                hour: datetime = hour,
                s: float = seconds,
                c: float = covered,
            ) -> NodeHour | None:
                nonlocal added
                new = add_node_interval(
                    current, event_id, data, hour=hour, seconds=s, covered_s=c, model=model
                )
                added = new is not None
                return new

            await self.nodes.update(node_hour_key(hour, data.node), change)
            if added and seconds > covered:
                self.metrics.uncovered.labels(data.node).inc(seconds - covered)

    @_consumes(
        "SESSIONS",
        "sessions",
        "session_subjects",
        (SessionActivity, SessionIdle),
        order_key=_per_pod,
    )
    async def handle_session(self, event: Event[Any], delivery: Delivery) -> None:
        data: SessionActivity | SessionIdle = event.data
        with structlog.contextvars.bound_contextvars(
            event_id=event.id, namespace=data.namespace, pod=data.pod, node=data.node
        ):
            if isinstance(data, SessionActivity):
                pct = data.gpu_utilization_pct
                if pct is None or not data.gpu_uuids:
                    return
                c = await self.charge(data.namespace, data.pod, data.node)
                hour = hour_of(data.sampled_at)
                key = usage_key(hour, data.node, data.namespace, data.pod)
                cell = self._cell(hour, data.node, data.namespace, data.pod, c)
                await self._add(key, cell, lambda x: add_utilisation(x, event.id, pct))
                return
            if data.gpus_held <= 0:
                return
            c = await self.charge(data.namespace, data.pod, data.node)
            key = idle_key(data.namespace, data.pod, period_token(data.uid, data.idle_since))
            before = await self.idle.get(key)
            was = before.value.idle_for_s * before.value.gpus_held if before else 0.0
            after = await self.idle.update(key, lambda x: extend_idle(x, data, c.owner, c.model))
            now = after.value.idle_for_s * after.value.gpus_held if after else was
            if now > was:
                self.metrics.of(data.namespace).idle.labels(data.namespace).inc(now - was)

    @_consumes("AUDIT", "audit", "audit_subjects", (Remediation,))
    async def handle_audit(self, event: Event[Any], delivery: Delivery) -> None:
        data: Remediation = event.data
        if (
            data.actor != self.settings.culler_actor
            or data.outcome != Outcome.APPLIED
            or data.action not in ("warn", "stop")
        ):
            return
        ns, pod = data.target.namespace, data.target.name
        named = str(data.details.get("pod") or "")
        if "/" in named:
            ns, pod = named.split("/", 1)
        if not ns:
            return
        with structlog.contextvars.bound_contextvars(event_id=event.id, namespace=ns, pod=pod):
            c = await self.charge(ns, pod, None)
            node = c.node or NO_NODE
            hour = hour_of(event.time)
            key = usage_key(hour, node, ns, pod)
            cell = self._cell(hour, node, ns, pod, c)
            action = data.action
            if await self._add(key, cell, lambda x: add_session_action(x, event.id, action)):
                self.metrics.of(ns).sessions.labels(
                    ns, "warned" if action == "warn" else "stopped"
                ).inc()

    @_consumes(
        "NODES",
        "findings",
        "finding_subjects",
        (NodeFinding,),
        concurrency=1,
        order_key=lambda e: e.data.node,
        # node.finding.<node>.<check>: a node speaks only of itself.
        identity=(ConsumerSpec.bind(NodeFinding, "node", "check"),),
    )
    async def handle_finding(self, event: Event[Any], delivery: Delivery) -> None:
        """Tell on-call of a node finding once per change: a new finding, a different one,
        or one cleared; a node that starts clear, or repeats itself, says nothing new."""
        data: NodeFinding = event.data
        key = finding_key(data.node, data.check)
        digest = data.change_key()
        last = await self.findings.get(key)
        log = self.log.bind(event_id=event.id, node=data.node, check=data.check)
        if last is not None and last.value.digest == digest:
            return
        if last is not None or data.state == FindingState.FINDING:
            cleared = data.state == FindingState.OK
            proposal = Proposal(
                action="finding",
                target=node_ref(data.node),
                reason=data.summary if not cleared else f"{data.summary} (cleared)",
                policy=data.check,
                trigger_id=event.id,
                trigger_time=event.time,
                protective=False,
                details={
                    "check": data.check,
                    "state": data.state.value,
                    "problems": data.problems,
                    "governors": data.governors,
                    "spread_pct": data.spread_pct,
                },
                severity=_FINDING_SEVERITY[data.state],
                title=f"{data.node} {data.check} {data.state.value}",
                resolves=cleared,
            )
            await self.runner.record(proposal, Outcome.APPLIED)
            log.info("accounting.finding_told", state=data.state.value, summary=data.summary)
        record = FindingRecord(
            digest=digest,
            state=data.state.value,
            summary=data.summary,
            event_id=event.id,
            told_at=datetime.now(UTC),
        )
        await self.findings.put(key, record)


@app.setup
async def setup(rt: Runtime[AccountingSettings]) -> AccountingService:
    """Accounting over its bucket; `settings.cluster` must authenticate as its
    ServiceAccount."""
    kv = await rt.kv(rt.config.bucket, history=1, ttl_s=rt.config.retention.total_seconds())
    return AccountingService(rt, kv)


build = app.build
component, standalone = app.daemon()
