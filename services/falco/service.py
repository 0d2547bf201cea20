"""services.falco: turn Falco alerts into proportionate, guarded responses.

Alerts reach the SECURITY stream on `falco.<priority>.<rule>`: from Falcosidekick's NATS
output directly, or through this service's HTTP ingest (`services/falco_ingest.py`:
Falco's `http_output` or Falcosidekick's webhook, authenticated). A durable consumer on
`falco.>` (identical alerts in order) runs each alert through the rules
(`services/falco/rules.py`; the shipped `services/falco/rules.yaml` notifies on Notice,
annotates on Warning, and checkpoints, isolates and notifies on Critical; it never
terminates), then each action of the chosen rules through the shared path: guards (the
exemption label on the pod or its namespace, or on the node for `cordon`; a rate limit per
pod and one per Falco rule), act or dry-run, a `remediation.v1` audit and a `notify.v1`
for on-call. The `notify` action also tells the pod's owner, in plain words, what
happened and what they can do.

Identical alerts (same rule, pod or node, and output without its timestamp) within
`dedup_window` are acted on once; the repeats are counted in KV (bucket `falco`), not
acted on again. Isolation labels the one pod `nodeward.io/isolated=true`, which the
deny-all NetworkPolicy `nodeward-isolate` that nodeward creates in the pod's namespace
selects: sibling replicas of the same workload are untouched. A failed action (a runtime
without CRIU cannot checkpoint) is audited as failed and on-call hears of it; it is not
retried, and the action's `continue` decides whether the rule's next actions run.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import structlog
from prometheus_client import CollectorRegistry, Counter
from pydantic import BaseModel, Field

from nodeward.bus import Bus, ConsumerSpec, Delivery, RetryableError
from nodeward.bus.kv import TypedKV
from nodeward.config import ConfigError, Section, Settings, section
from nodeward.daemon import Daemon
from nodeward.durations import Duration
from nodeward.kube import AlreadyExists, Cluster, KubeError, NotFound
from nodeward.kube.base import Obj
from nodeward.kube.client import MERGE_PATCH
from nodeward.kube.netpol import isolate_pod_policy
from nodeward.platform import Component, Standalone, UpContext, bus_daemon
from schemas.base import Event
from schemas.common import ObjectRef
from schemas.falco import FalcoAlert, FalcoPriority
from schemas.ids import stable_id
from schemas.notify import Severity
from schemas.remediation import Outcome, Remediation
from schemas.tokens import falco_rule_token
from services.falco.access import ACCESS
from services.falco.ingest import Ingest, IngestError, IngestSettings
from services.falco.rules import (
    POD_ACTIONS,
    ActionKind,
    ActionSpec,
    Policy,
    Rule,
    RulesError,
    load_policy,
)
from services.kernel import (
    ActionRunner,
    Auditor,
    Exemptions,
    Guard,
    KeyedRateLimiter,
    OwnerNotice,
    Proposal,
    RateLimitSettings,
    SkippedNamespaces,
    tell_owner,
)

NAME = "falco"
ACTOR = "service/falco"
TOPIC = "security"
ISOLATE_LABEL = "nodeward.io/isolated"
ISOLATION_ANNOTATION = "nodeward.io/isolation"
ISOLATE_POLICY = "nodeward-isolate"
MANAGED_BY = {"app.kubernetes.io/managed-by": "nodeward", "nodeward.io/purpose": "isolate"}
NODE_ANNOTATION = "nodeward.io/falco"
DEFAULT_TAINT = "nodeward.io/falco-compromised"
TOKEN_FILE = "falco-token"  # noqa: S105 - the name of the file the token is kept in
SUCCEEDED = frozenset({Outcome.APPLIED, Outcome.DRY_RUN})


class FalcoSettings(Section):
    """`services.falco` in the config file."""

    dry_run: bool = False
    consumer: str = "falco"
    subjects: list[str] = Field(default_factory=lambda: ["falco.>"], min_length=1)
    bucket: str = "falco"
    concurrency: int = Field(default=16, ge=1)
    rules_file: Path | None = Field(default=None, description="None: the shipped default")
    dedup_window: Duration = Field(
        default=timedelta(minutes=10),
        description="identical alerts within this window are acted on once",
    )
    rate_limit_per_pod: RateLimitSettings = RateLimitSettings(per_minute=10, burst=10)
    rate_limit_per_rule: RateLimitSettings = RateLimitSettings(per_minute=60, burst=30)
    skip_namespaces: list[str] = Field(
        default_factory=lambda: ["kube-system", "nodeward"],
        description="pods here are never acted on (alerts about them only notify)",
    )
    checkpoint_timeout: Duration = timedelta(seconds=60)
    support_contact: str = "the platform's security team"
    topic: str = Field(default=TOPIC, min_length=1, description="the notices' topic")
    ingest: IngestSettings = IngestSettings()


class DedupRecord(BaseModel):
    """The first alert of a window, and how many identical ones followed it."""

    event_id: str
    stream_sequence: int | None = None
    first_seen: float
    last_seen: float
    repeats: int = 0


@dataclass(frozen=True)
class Target:
    """What an alert is about, as read from the cluster."""

    pod: Obj | None
    no_pod: str | None  # why there is no pod to act on
    node: str | None

    @property
    def ref(self) -> ObjectRef:
        if self.pod is not None:
            meta = self.pod["metadata"]
            return ObjectRef(
                kind="Pod", name=meta["name"], namespace=meta["namespace"], api_version="v1"
            )
        return node_ref(self.node or "unknown")


def node_ref(name: str) -> ObjectRef:
    return ObjectRef(kind="Node", name=name, api_version="v1")


def where(alert: FalcoAlert) -> str:
    if alert.namespace and alert.pod:
        return f"pod {alert.namespace}/{alert.pod}"
    return f"node {alert.hostname or 'unknown'}"


def describe(alert: FalcoAlert, limit: int = 600) -> str:
    text = f"Falco {alert.priority.value} '{alert.rule}' on {where(alert)}: {alert.message()}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def severity_of(priority: FalcoPriority) -> Severity:
    if priority.rank <= FalcoPriority.ERROR.rank:
        return Severity.CRITICAL
    if priority == FalcoPriority.WARNING:
        return Severity.WARNING
    return Severity.INFO


def dedup_key(alert: FalcoAlert) -> str:
    """Identical alerts: same rule, pod (or node) and output without its time prefix."""
    raw = "\x1f".join(
        (alert.rule, alert.namespace or "", alert.pod or "", alert.hostname or "", alert.message())
    )
    return "dedup." + hashlib.sha256(raw.encode()).hexdigest()[:40]


def label_value(text: str) -> str:
    """A valid label value (63 characters of [A-Za-z0-9_.-], alphanumeric at both ends)."""
    out = "".join(c if c.isascii() and (c.isalnum() or c in "-_.") else "_" for c in text)
    return out[:63].strip("-_.")


def render(template: str, alert: FalcoAlert, event: Event[Any]) -> str:
    """`{rule}`, `{rule_token}`, `{priority}`, `{event_id}` and `{time}` filled in."""
    values = {
        "rule": alert.rule,
        "rule_token": falco_rule_token(alert.rule),
        "priority": alert.priority.value,
        "event_id": event.id,
        "time": alert.time.isoformat(),
    }
    out = str(template)
    for key, value in values.items():
        out = out.replace("{" + key + "}", value)
    return out


_DONE_WORDS = {
    ActionKind.ISOLATE: "Your pod has been cut off from the network (in and out); its "
    "processes and files are untouched.",
    ActionKind.CHECKPOINT: "A snapshot (checkpoint) of the container was kept for the "
    "investigation.",
    ActionKind.TERMINATE: "Your pod has been stopped.",
    ActionKind.LABEL: "Your pod has been labelled for the security team.",
    ActionKind.ANNOTATE: "Your pod has been annotated for the security team.",
    ActionKind.CORDON: "No new work is scheduled on the node your pod ran on.",
}


class Metrics:
    def __init__(self, registry: CollectorRegistry | None) -> None:
        self.alerts = Counter(
            "nodeward_falco_alerts",
            "Falco alerts consumed, by outcome (responded, duplicate, unmatched, test_dropped)",
            ["outcome"],
            registry=registry,
        )


class FalcoService:
    def __init__(
        self,
        bus: Bus,
        cluster: Cluster,
        *,
        settings: FalcoSettings,
        policy: Policy,
        dedup: TypedKV[DedupRecord],
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.bus = bus
        self.cluster = cluster
        self.settings = settings
        self.policy = policy
        self.dedup = dedup
        self.clock = clock
        self.auditor = Auditor(bus, actor=ACTOR, topic=settings.topic)
        self.runner = ActionRunner(self.auditor, dry_run=settings.dry_run)
        self.dry_runner = ActionRunner(self.auditor, dry_run=True)
        self.exemptions = Exemptions(cluster.namespaces.labels)
        self.per_pod = KeyedRateLimiter(
            "rate_limit_pod",
            settings.rate_limit_per_pod,
            lambda p: p.target.key() if p.target.kind == "Pod" else None,
            what="pod",
        )
        self.per_rule = KeyedRateLimiter(
            "rate_limit_rule",
            settings.rate_limit_per_rule,
            lambda p: str(p.details.get("falco_rule")),
            what="Falco rule",
        )
        self.skipped = SkippedNamespaces(
            settings.skip_namespaces, setting="services.falco.skip_namespaces"
        )
        self.guards: list[Guard] = [self.skipped, self.exemptions, self.per_pod, self.per_rule]
        self.metrics = Metrics(registry)
        self.log = structlog.get_logger().bind(service=NAME)

    def consumer_spec(self) -> ConsumerSpec:
        return ConsumerSpec(
            name=self.settings.consumer,
            stream="SECURITY",
            subjects=tuple(self.settings.subjects),
            types=frozenset({FalcoAlert.TYPE}),
            concurrency=self.settings.concurrency,
            # Identical alerts in order (the first acts, the rest are duplicates); others,
            # for the same pod too, in parallel: every action is idempotent.
            order_key=lambda e: dedup_key(e.data),
            retry_delays=(0.5, 2.0, 10.0, 30.0),
            max_deliver=6,
            ack_wait=timedelta(seconds=90),
        )

    # one alert --------------------------------------------------------------------------
    async def handle(self, event: Event[Any], delivery: Delivery) -> None:
        alert: FalcoAlert = event.data
        with structlog.contextvars.bound_contextvars(
            falco_rule=alert.rule, priority=alert.priority.value, about=event.subject
        ):
            await self.respond(event, alert, sequence=delivery.stream_sequence)

    async def respond(
        self, event: Event[Any], alert: FalcoAlert, *, sequence: int | None = None
    ) -> list[Remediation]:
        """Every decision taken for this alert (empty when nothing was to be done).

        `sequence`: the message's stream sequence, which tells a redelivery of this very
        message (handled again) from the same alert arriving twice (a duplicate)."""
        if alert.is_test:
            self.metrics.alerts.labels("test_dropped").inc()
            return []
        rules = self.policy.select(alert)
        if not rules:
            self.metrics.alerts.labels("unmatched").inc()
            self.log.debug("falco.unmatched")
            return []
        if not await self.first_in_window(event, alert, sequence):
            self.metrics.alerts.labels("duplicate").inc()
            return []
        self.metrics.alerts.labels("responded").inc()
        target = await self.resolve(alert)
        out: list[Remediation] = []
        for rule in rules:
            out.extend(await self.run_rule(event, alert, rule, target))
        return out

    async def first_in_window(
        self, event: Event[Any], alert: FalcoAlert, sequence: int | None = None
    ) -> bool:
        """True for the first of identical alerts within `dedup_window` (or its redelivery)."""
        now = self.clock()
        window = self.settings.dedup_window.total_seconds()
        first = True

        def change(current: DedupRecord | None) -> DedupRecord | None:
            nonlocal first
            if current is None or now - current.first_seen > window:
                first = True
                return DedupRecord(
                    event_id=event.id, stream_sequence=sequence, first_seen=now, last_seen=now
                )
            if current.event_id == event.id and current.stream_sequence == sequence:
                # A redelivery of the message that opened the window: handled again
                # (idempotently). The same alert arriving again (from Falcosidekick and
                # through the ingest, say) is another message: a duplicate.
                first = True
                return None
            first = False
            return current.model_copy(update={"repeats": current.repeats + 1, "last_seen": now})

        await self.dedup.update(dedup_key(alert), change)
        if not first:
            self.log.debug("falco.duplicate")
        return first

    async def resolve(self, alert: FalcoAlert) -> Target:
        raw_pod = alert.output_fields.get("k8s.pod.name")
        if alert.pod is None or alert.namespace is None:
            why = (
                "the alert names no pod (a host event, or Falco had not looked the container up yet)"
                if raw_pod is None or alert.namespace is None
                else "the pod name in the alert was cut short"
            )
            return Target(None, why, alert.hostname)
        try:
            pod = await self.cluster.pods.get(alert.namespace, alert.pod)
        except NotFound:
            return Target(
                None,
                f"pod {alert.namespace}/{alert.pod} no longer exists",
                alert.hostname,
            )
        node = (pod.get("spec") or {}).get("nodeName") or alert.hostname
        return Target(pod, None, node)

    # one rule ---------------------------------------------------------------------------
    async def run_rule(
        self, event: Event[Any], alert: FalcoAlert, rule: Rule, target: Target
    ) -> list[Remediation]:
        results: list[tuple[ActionKind, Remediation]] = []
        stopped_by: ActionSpec | None = None
        for spec in rule.actions:
            proposal = self.proposal(event, alert, rule, spec, target)
            if stopped_by is not None:
                reason = (
                    f"not run: {stopped_by.action.value} did not succeed and says continue: false; "
                    + proposal.reason
                )
                decision = await self.auditor.record(
                    proposal, Outcome.SKIPPED, reason, guard="stopped"
                )
            else:
                decision = await self.run_action(
                    event,
                    alert=alert,
                    rule=rule,
                    spec=spec,
                    target=target,
                    proposal=proposal,
                    earlier=results,
                )
                if decision.outcome not in SUCCEEDED and not spec.continue_:
                    stopped_by = spec
            results.append((spec.action, decision))
        return [r for _, r in results]

    def proposal(
        self, event: Event[Any], alert: FalcoAlert, rule: Rule, spec: ActionSpec, target: Target
    ) -> Proposal:
        ref = target.ref
        obj = target.pod
        if spec.action == ActionKind.CORDON:
            ref = node_ref(target.node or "unknown")
            obj = None
        return Proposal(
            action=spec.action.value,
            target=ref,
            reason=describe(alert),
            policy=rule.name,
            trigger_id=event.id,
            trigger_time=event.time,
            protective=spec.action != ActionKind.NOTIFY,
            obj=obj,
            details={
                "falco_rule": alert.rule,
                "priority": alert.priority.value,
                "hostname": alert.hostname,
                "container": alert.container,
                "falco_uuid": alert.uuid,
            },
            severity=severity_of(alert.priority),
            title=f"Falco {alert.priority.value} '{alert.rule}' on {where(alert)}"[:200],
        )

    async def run_action(
        self,
        event: Event[Any],
        *,
        alert: FalcoAlert,
        rule: Rule,
        spec: ActionSpec,
        target: Target,
        proposal: Proposal,
        earlier: list[tuple[ActionKind, Remediation]],
    ) -> Remediation:
        if spec.action in POD_ACTIONS and target.pod is None:
            reason = f"not run: {target.no_pod}; {proposal.reason}"
            return await self.auditor.record(proposal, Outcome.SKIPPED, reason, guard="no_pod")
        guards: list[Guard] = []
        if spec.action == ActionKind.CORDON:
            try:
                node = await self.cluster.nodes.get(proposal.target.name)
            except NotFound:
                reason = f"not run: node {proposal.target.name} not found; {proposal.reason}"
                return await self.auditor.record(proposal, Outcome.SKIPPED, reason, guard="no_node")
            proposal = replace(proposal, obj=node)
            guards = [self.exemptions, self.per_rule]
        elif spec.action != ActionKind.NOTIFY:
            guards = self.guards
        act = self.act_for(event, alert, spec, target, earlier)
        runner = self.dry_runner if rule.dry_run else self.runner
        try:
            return await runner.run(proposal, act, guards)
        except RetryableError as exc:
            # Audited as failed by the runner (on-call is told). Not retried: the alert
            # repeats while the behaviour goes on, and a checkpoint is not idempotent.
            return self.auditor.build(proposal, Outcome.FAILED, f"{proposal.reason}; {exc}")

    def act_for(
        self,
        event: Event[Any],
        alert: FalcoAlert,
        spec: ActionSpec,
        target: Target,
        earlier: list[tuple[ActionKind, Remediation]],
    ) -> Callable[[], Awaitable[dict[str, Any]]]:
        acts: Mapping[ActionKind, Callable[[], Awaitable[dict[str, Any]]]] = {
            ActionKind.NOTIFY: lambda: self.notify(event, alert, spec, target, earlier),
            ActionKind.LABEL: lambda: self.label(event, alert, spec, target),
            ActionKind.ANNOTATE: lambda: self.annotate(event, alert, spec, target),
            ActionKind.ISOLATE: lambda: self.isolate(event, alert, target),
            ActionKind.CHECKPOINT: lambda: self.checkpoint(alert, spec, target),
            ActionKind.TERMINATE: lambda: self.terminate(spec, target),
            ActionKind.CORDON: lambda: self.cordon(event, alert, spec, target),
        }
        return acts[spec.action]

    # actions ----------------------------------------------------------------------------
    def _pod(self, target: Target) -> tuple[str, str, Obj]:
        assert target.pod is not None
        meta = target.pod["metadata"]
        return meta["namespace"], meta["name"], target.pod

    async def notify(
        self,
        event: Event[Any],
        alert: FalcoAlert,
        spec: ActionSpec,
        target: Target,
        earlier: list[tuple[ActionKind, Remediation]],
    ) -> dict[str, Any]:
        """On-call hears through this decision's audit notice; the owner gets their own."""
        if target.pod is None or not spec.params.get("owner", True):
            return {"owner_notified": False}
        namespace, name, _ = self._pod(target)
        done = [
            _DONE_WORDS[a] for a, r in earlier if r.outcome == Outcome.APPLIED and a in _DONE_WORDS
        ]
        contact = self.settings.support_contact
        can_do = [
            f"If this was you, tell {contact} what you were doing: most alerts are explained "
            "in minutes.",
            f"If it was not you, tell {contact} at once: your session or credentials may be "
            "compromised.",
        ]
        if any(a == ActionKind.ISOLATE and r.outcome == Outcome.APPLIED for a, r in earlier):
            can_do.append(
                f"The network isolation stays until {contact} lifts it; save your work inside "
                "the pod meanwhile."
            )
        body = (
            f"Falco, the platform's runtime security monitor, reported '{alert.rule}' "
            f"({alert.priority.value}) in your pod {namespace}/{name} at "
            f"{alert.time.isoformat()}. " + " ".join(done)
        ).strip()
        notice = OwnerNotice(
            severity=severity_of(alert.priority),
            title=f"Security alert on your pod {name}",
            body=body,
            why=f"Falco's rule '{alert.rule}' matched: {alert.message()}"[:1000],
            steps=can_do,
        )
        note = await tell_owner(
            self.bus,
            notice,
            actor=ACTOR,
            topic=self.settings.topic,
            namespace=namespace,
            name=name,
            targets=[target.ref],
            notice_id=stable_id(event.time, event.id, ACTOR, "notify-owner", target.ref.key()),
            dedup_key=f"falco/{namespace}/{name}/{falco_rule_token(alert.rule)}",
        )
        return {"owner_notified": True, "audience": note.audience}

    async def label(
        self, event: Event[Any], alert: FalcoAlert, spec: ActionSpec, target: Target
    ) -> dict[str, Any]:
        namespace, name, _ = self._pod(target)
        labels = {
            str(k): label_value(render(str(v), alert, event))
            for k, v in spec.params["labels"].items()
        }
        await self.cluster.pods.set_labels(namespace, name, labels)
        return {"labels": labels}

    async def annotate(
        self, event: Event[Any], alert: FalcoAlert, spec: ActionSpec, target: Target
    ) -> dict[str, Any]:
        namespace, name, _ = self._pod(target)
        notes = {
            str(k): render(str(v), alert, event) for k, v in spec.params["annotations"].items()
        }
        await self.cluster.pods.patch(
            namespace, name, {"metadata": {"annotations": notes}}, content_type=MERGE_PATCH
        )
        return {"annotations": notes}

    async def isolate(self, event: Event[Any], alert: FalcoAlert, target: Target) -> dict[str, Any]:
        """The namespace's deny-all policy (created once), then the one pod labelled into it."""
        namespace, name, pod = self._pod(target)
        policy = isolate_pod_policy(
            namespace, ISOLATE_POLICY, {ISOLATE_LABEL: "true"}, labels=dict(MANAGED_BY)
        )
        created = True
        try:
            await self.cluster.network_policies.create(policy)
        except AlreadyExists:
            created = False
        labels = pod["metadata"].get("labels") or {}
        already = labels.get(ISOLATE_LABEL) == "true"
        if not already:
            note = json.dumps(
                {
                    "by": ACTOR,
                    "falco_rule": alert.rule,
                    "event_id": event.id,
                    "at": alert.time.isoformat(),
                    "policy": ISOLATE_POLICY,
                },
                separators=(",", ":"),
            )
            await self.cluster.pods.patch(
                namespace,
                name,
                {
                    "metadata": {
                        "labels": {ISOLATE_LABEL: "true"},
                        "annotations": {ISOLATION_ANNOTATION: note},
                    }
                },
                content_type=MERGE_PATCH,
            )
            await self._record_event(
                pod, "Isolated", f"isolated by nodeward: {describe(alert, 300)}"
            )
        return {
            "network_policy": f"{namespace}/{ISOLATE_POLICY}",
            "policy_created": created,
            "selector": {ISOLATE_LABEL: "true"},
            "already_isolated": already,
            "pod_uid": pod["metadata"].get("uid"),
        }

    async def checkpoint(
        self, alert: FalcoAlert, spec: ActionSpec, target: Target
    ) -> dict[str, Any]:
        namespace, name, pod = self._pod(target)
        node = (pod.get("spec") or {}).get("nodeName")
        if not node:
            raise NotFound(f"pod {namespace}/{name} is not bound to a node: nothing to checkpoint")
        names = [c.get("name") for c in (pod.get("spec") or {}).get("containers") or []]
        containers = [alert.container] if alert.container in names else [n for n in names if n]
        timeout = int(spec.params.get("timeout", self.settings.checkpoint_timeout.total_seconds()))
        archives: dict[str, str] = {}
        for container in containers:
            assert container is not None
            archives[container] = await self.cluster.checkpoints.create(
                node, namespace, name, container, timeout_s=timeout
            )
        await self._record_event(
            pod, "Checkpointed", f"checkpoint kept on {node}: {', '.join(archives.values())}"
        )
        return {"node": node, "archives": archives}

    async def terminate(self, spec: ActionSpec, target: Target) -> dict[str, Any]:
        namespace, name, pod = self._pod(target)
        grace = int(spec.params.get("grace_period_seconds", 30))
        deleted = await self.cluster.pods.delete(
            namespace, name, grace_period=grace, uid=pod["metadata"].get("uid")
        )
        return {"deleted": deleted, "grace_period_seconds": grace}

    async def cordon(
        self, event: Event[Any], alert: FalcoAlert, spec: ActionSpec, target: Target
    ) -> dict[str, Any]:
        node = target.node or "unknown"
        taint = str(spec.params.get("taint", DEFAULT_TAINT))
        effect = spec.params.get("effect", "NoSchedule")
        cordon = bool(spec.params.get("cordon", True))
        note = json.dumps(
            {"by": ACTOR, "falco_rule": alert.rule, "event_id": event.id, "taint": taint},
            separators=(",", ":"),
        )
        await self.cluster.nodes.mark(
            node,
            add_taints=[(taint, effect)],
            unschedulable=True if cordon else None,
            annotations={NODE_ANNOTATION: note},
        )
        return {"node": node, "taint": f"{taint}:{effect}", "cordoned": cordon}

    async def _record_event(self, obj: Obj, reason: str, note: str) -> None:
        """A Kubernetes Event on the pod, so `kubectl describe pod` shows it (best effort)."""
        try:
            await self.cluster.events.create(
                obj, reason=reason, action=reason, note=note[:1000], type_="Warning"
            )
        except KubeError as exc:
            self.log.warning("falco.event_failed", reason=reason, error=str(exc))


# daemon --------------------------------------------------------------------------------
@dataclass
class Assembled:
    daemon: Daemon
    service: FalcoService
    ingest: Ingest | None


async def assemble(settings: Settings) -> Assembled:
    """The daemon (consumer on `falco.>`), the service and its HTTP ingest (already bound).

    `settings.cluster` must authenticate as the falco ServiceAccount (context
    `nodeward-falco` of the `nodeward up` kubeconfig).
    """
    config: FalcoSettings = section(settings, "services", NAME, FalcoSettings)
    try:
        policy = load_policy(config.rules_file)
    except RulesError as exc:
        raise ConfigError(f"services.{NAME}: {exc}") from None
    daemon, bus = await bus_daemon(NAME, settings, source=ACTOR, consumers=1)
    cluster = Cluster.connect(settings.cluster, access=ACCESS)
    grace = settings.daemon.shutdown_timeout.total_seconds() / 2
    ingest: Ingest | None = None

    async def close() -> None:
        if ingest is not None:
            await ingest.stop()
        await bus.close(grace=grace)
        await cluster.close()

    daemon.add_shutdown_hook(close)
    kv = await bus.kv(
        config.bucket, history=1, ttl_s=max(config.dedup_window.total_seconds() * 2, 60)
    )
    service = FalcoService(
        bus,
        cluster,
        settings=config,
        policy=policy,
        dedup=TypedKV(kv, DedupRecord),
        registry=daemon.metrics.registry,
    )
    if config.ingest.enabled:

        async def publish(events: list[Event[FalcoAlert]]) -> None:
            await bus.publish_many(events)

        try:
            ingest = Ingest(config.ingest, publish, registry=daemon.metrics.registry)
            await ingest.start()
        except IngestError as exc:
            await close()
            raise ConfigError(f"services.{NAME}.ingest: {exc}") from None

    async def consume() -> None:
        await bus.consume(service.consumer_spec(), service.handle)

    daemon.add_task(consume, name="consume")
    return Assembled(daemon, service, ingest)


async def build(settings: Settings) -> Daemon:
    """What `nodeward service falco` runs."""
    return (await assemble(settings)).daemon


def ensure_token(path: Path) -> Path:
    """A random ingest token in `path` (mode 0600), made once and kept across restarts."""
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(32) + "\n")
    return path


async def _build_for_up(context: UpContext) -> list[Daemon]:
    """The falco service under its own ServiceAccount, its ingest on a free loopback port
    with a token generated into the state dir (unless the config says otherwise)."""
    settings = context.settings_for(NAME)
    raw = dict(settings.services.get(NAME) or {})
    ingest = dict(raw.get("ingest") or {})
    ingest.setdefault("host", "127.0.0.1")
    ingest.setdefault("port", 0)
    if "token_file" not in ingest and "client_ca_file" not in ingest:
        ingest["token_file"] = str(ensure_token(context.state_dir / TOKEN_FILE))
    raw["ingest"] = ingest
    settings = settings.model_copy(update={"services": {**settings.services, NAME: raw}})
    assembled = await assemble(settings)
    if assembled.ingest is not None:
        context.endpoints["falco_ingest_url"] = assembled.ingest.url
        token = assembled.ingest.settings.token_file
        if token is not None:
            context.endpoints["falco_token_file"] = token
    return [assembled.daemon]


component = Component(NAME, _build_for_up)
standalone = Standalone(build)
