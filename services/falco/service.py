"""services.falco: turn Falco alerts into proportionate, guarded responses.

Alerts reach the SECURITY stream on `falco.<priority>.<rule>`: from Falcosidekick's NATS
output directly, or through this service's HTTP ingest (`services/falco/ingest.py`:
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
retried, and the action's `continue` decides whether the rule's next actions run. An
operator lifts an isolation nodeward applied through `control.falco.release`.

Each isolation is recorded with the pod's uid (`services/falco/isolations.py`, KV
`marks_bucket`, `isolations.<namespace>.<pod>`); a reconcile pass every
`isolation_check_interval` ends, audited once, the record of a pod gone from the API,
replaced by another of its name, ended, or unlabelled by someone else, so that what
`nodeward status` and the console show as isolated is isolated.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import structlog
from nats.js.kv import KeyValue
from prometheus_client import CollectorRegistry, Counter

from nodeward.bus import ConsumerSpec, Delivery
from nodeward.bus.lanes import UrgentFirst
from nodeward.config import ConfigError, Settings
from nodeward.daemon import Daemon
from nodeward.handlers import Runtime, Service, setting
from nodeward.kube import NotFound
from nodeward.platform import Component, Standalone, UpContext
from schemas.base import Event
from schemas.common import ObjectRef, dns_label, dns_subdomain
from schemas.control import ControlReply, ControlRequest
from schemas.falco import ISOLATE_LABEL, FalcoAlert
from schemas.remediation import Outcome, Remediation
from schemas.state.breaker import SHARED
from schemas.state.dedup import FALCO
from schemas.state.marks import FALCO_MARKS
from services.falco.access import ACCESS
from services.falco.actions import ACTIONS, DONE_WORDS, ActionContext
from services.falco.actions.isolate import isolated, isolation_of, lift
from services.falco.alerts import Target, dedup_key, describe, severity_of, where
from services.falco.ingest import Ingest, IngestError
from services.falco.isolations import Isolations
from services.falco.rules import ActionKind, ActionSpec, Policy, Rule, RulesError, load_policy
from services.falco.settings import NAME, FalcoSettings
from services.falco.state import IsolationRecord
from services.kernel import (
    ActionRunner,
    CircuitBreaker,
    Dedup,
    DedupWindow,
    Guard,
    KeyedRateLimiter,
    Proposal,
    SkippedNamespaces,
    acting_controlled,
    breaker_for,
    node_ref,
)
from services.kernel.access import PUBLISHES
from services.kernel.control import operator_proposal, refuse, reply_for

TOKEN_FILE = "falco-token"  # noqa: S105 - the name of the file the token is kept in
SUCCEEDED = frozenset({Outcome.APPLIED, Outcome.DRY_RUN})


class Metrics:
    def __init__(self, registry: CollectorRegistry | None) -> None:
        self.alerts = Counter(
            "nodeward_falco_alerts",
            "Falco alerts consumed, by outcome (responded, duplicate, unmatched, test_dropped)",
            ["outcome"],
            registry=registry,
        )


app = Service(
    NAME,
    settings=FalcoSettings,
    access=ACCESS,
    buckets=(FALCO.name, FALCO_MARKS.name, SHARED.name),
    publishes=("falco.>", *PUBLISHES),
)


class FalcoService:
    def __init__(
        self,
        rt: Runtime[FalcoSettings],
        *,
        dedup: DedupWindow,
        breaker: CircuitBreaker | None = None,
        isolation_kv: KeyValue | None = None,
    ) -> None:
        bus, cluster, settings = rt.bus, rt.acting, rt.config
        self.bus, self.cluster, self.settings, self.policy = bus, cluster, settings, rt.prepared
        # An operator's release: exemptions and the operator's rate limit (never the breaker).
        kernel = acting_controlled(rt, topic=settings.topic, tally=settings.tally)
        self.runner, self.exemptions = kernel.runner, kernel.exemptions
        self.control_guards = kernel.control_guards
        # Identical alerts: the first of a window acts; a redelivery of that very message
        # (same event id and stream sequence) is handled again; the same alert arriving as
        # another message (from Falcosidekick and through the ingest, say) is a repeat.
        self.duplicates = Dedup(
            dedup,
            key=lambda p: str(p.details["dedup_key"]),
            instance=lambda p: str(p.details["message"]),
        )
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
        self.breaker = breaker
        # The isolation records (in `marks_bucket`), kept true to the API by `Isolations.loop`.
        self.isolations = (
            Isolations(bus, cluster, isolation_kv, self.runner, bucket=settings.marks_bucket)
            if isolation_kv is not None
            else None
        )
        self.metrics = Metrics(rt.daemon.metrics.registry)
        # Notices step aside, at each action, while a Warning or worse is in hand.
        self.gate = UrgentFirst()
        self.ingest: Ingest | None = None
        """The HTTP ingest, when enabled (`setup` starts it)."""
        self.log = structlog.get_logger().bind(service=NAME)

    # one alert --------------------------------------------------------------------------
    @app.consumes(
        "SECURITY",
        subjects=setting("subjects"),
        types=(FalcoAlert,),
        # A consumer per lane: a Critical alert is never fetched behind a flood of Notices.
        lanes=lambda _, config: config.lanes(),
        concurrency=setting("concurrency"),
        # Identical alerts in order (the first acts, the rest are duplicates); others,
        # for the same pod too, in parallel: every action is idempotent.
        order_key=lambda e: dedup_key(e.data),
        retry_delays=(0.5, 2.0, 10.0, 30.0),
        max_deliver=6,
        ack_wait=setting("ack_wait"),
        # falco.<priority>.<rule> names no node or pod: nothing to bind.
        identity=(ConsumerSpec.bind(FalcoAlert),),
    )
    async def handle(self, event: Event[Any], delivery: Delivery) -> None:
        alert: FalcoAlert = event.data
        with structlog.contextvars.bound_contextvars(
            falco_rule=alert.rule, priority=alert.priority.value, about=event.subject
        ):
            if self.settings.urgent(alert):
                async with self.gate.urgent():
                    await self.respond(event, alert, sequence=delivery.stream_sequence)
            else:
                await self.gate.clear()
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
            self.log.debug("falco.duplicate")
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
        """True for the first of identical alerts within `dedup_window` (or its redelivery):
        the kernel's duplicate guard, which counts repeats in KV and audits none of them."""
        proposal = Proposal(
            action="respond",
            target=node_ref(alert.hostname or "unknown"),
            reason=describe(alert),
            trigger_id=event.id,
            trigger_time=event.time,
            protective=False,
            details={"dedup_key": dedup_key(alert), "message": f"{event.id}/{sequence}"},
        )
        return await self.runner.screen(proposal, [self.duplicates]) is None

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
        low = not self.settings.urgent(alert)
        for spec in rule.actions:
            if low:
                await self.gate.clear()
            proposal = self.proposal(event, alert, rule, spec, target)
            if stopped_by is not None:
                reason = (
                    f"not run: {stopped_by.action.value} did not succeed and says continue: false; "
                    + proposal.reason
                )
                decision = await self.runner.skip(proposal, guard="stopped", reason=reason)
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
        if ACTIONS[spec.action].scope == "node":
            ref = node_ref(target.node or "unknown")
            obj = None
        details: dict[str, Any] = {
            "falco_rule": alert.rule,
            "priority": alert.priority.value,
            "hostname": alert.hostname,
            "container": alert.container,
            "falco_uuid": alert.uuid,
        }
        if ref.kind == "Pod" and target.pod is not None:
            # Which pod of that name: a later one (a new uid) is not the one decided on.
            details["pod_uid"] = target.pod["metadata"].get("uid")
        return Proposal(
            action=spec.action.value,
            target=ref,
            reason=describe(alert),
            policy=rule.name,
            trigger_id=event.id,
            trigger_time=event.time,
            protective=ACTIONS[spec.action].scope != "none",
            obj=obj,
            details=details,
            severity=severity_of(alert.priority),
            title=f"Falco {alert.priority.value} '{alert.rule}' on {where(alert)}"[:200],
            tally=(
                f"{alert.rule}@{target.node or alert.hostname or 'unknown'}"
                if ACTIONS[spec.action].scope == "none" and self.settings.tallied(alert)
                else None
            ),
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
        actionner = ACTIONS[spec.action]
        if actionner.scope == "pod" and target.pod is None:
            reason = f"not run: {target.no_pod}; {proposal.reason}"
            return await self.runner.skip(proposal, guard="no_pod", reason=reason)
        guards: list[Guard] = []
        if actionner.scope == "node":
            try:
                node = await self.cluster.nodes.get(proposal.target.name)
            except NotFound:
                reason = f"not run: node {proposal.target.name} not found; {proposal.reason}"
                return await self.runner.skip(proposal, guard="no_node", reason=reason)
            proposal = replace(proposal, obj=node)
            guards = [self.exemptions, self.per_rule]
            if actionner.removes_node and self.breaker is not None:
                guards.append(self.breaker)
        elif actionner.scope == "pod":
            guards = self.guards
        context = ActionContext(
            event=event,
            alert=alert,
            spec=spec,
            target=target,
            earlier=tuple(earlier),
            cluster=self.cluster,
            bus=self.bus,
            settings=self.settings,
            done_words=DONE_WORDS,
        )

        async def act() -> dict[str, Any]:
            return await actionner.run(context)

        runner = self.runner.with_dry_run() if rule.dry_run else self.runner
        if spec.action is ActionKind.ISOLATE and target.pod is not None:
            return await self.run_isolate(
                runner, proposal, act, guards=guards, event=event, rule=rule, target=target
            )
        # A failure is audited (on-call is told) and not retried: the alert repeats while
        # the behaviour goes on, and a checkpoint is not idempotent.
        return await runner.run(proposal, act, guards, retry=False)

    async def run_isolate(
        self,
        runner: ActionRunner,
        proposal: Proposal,
        act: Callable[[], Awaitable[dict[str, Any]]],
        *,
        guards: list[Guard],
        event: Event[Any],
        rule: Rule,
        target: Target,
    ) -> Remediation:
        """The isolate action under the pod's lock, its isolation recorded (with the pod's
        uid) once the pod is labelled, or once the dry run is decided."""
        isolations = self.isolations
        if isolations is None:
            return await runner.run(proposal, act, guards, retry=False)
        assert target.pod is not None
        meta = target.pod["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        alert: FalcoAlert = event.data

        def record(dry_run: bool) -> IsolationRecord:
            return IsolationRecord(
                namespace=namespace,
                pod=name,
                uid=meta.get("uid"),
                node=target.node,
                falco_rule=alert.rule,
                policy=rule.name,
                event_id=event.id,
                event_time=event.time,
                at=datetime.now(UTC),
                dry_run=dry_run,
            )

        async def isolate() -> dict[str, Any]:
            details = await act()
            await isolations.remember(record(dry_run=False))  # before its audit
            return details

        async with isolations.lock(namespace, name):
            decision = await runner.run(proposal, isolate, guards, retry=False)
            if decision.outcome is Outcome.DRY_RUN:
                await isolations.remember(record(dry_run=True))
        return decision

    # operator controls -----------------------------------------------------------------
    @app.control("release")
    async def release_control(self, request: ControlRequest) -> ControlReply:
        """`nodeward falco release NAMESPACE/POD`: lift an isolation nodeward applied, and
        none that someone else applied (the label without nodeward's record stays)."""
        namespace, _, name = (request.target or "").partition("/")
        try:
            dns_label(namespace)
            dns_subdomain(name)
        except ValueError as exc:
            return ControlReply.error(f"release: {request.target!r} is not NAMESPACE/POD: {exc}")
        async with self.isolation_lock(namespace, name):
            return await self.release(request, namespace, name)

    @contextlib.asynccontextmanager
    async def isolation_lock(self, namespace: str, name: str) -> AsyncIterator[None]:
        if self.isolations is None:
            yield
            return
        async with self.isolations.lock(namespace, name):
            yield

    async def release(self, request: ControlRequest, namespace: str, name: str) -> ControlReply:
        ref = f"{namespace}/{name}"
        try:
            pod = await self.cluster.pods.get(namespace, name)
        except NotFound:
            return ControlReply.refused(f"refused: no pod {ref}")
        note = isolation_of(pod)
        proposal = operator_proposal(
            request,
            action="release",
            target=ObjectRef(kind="Pod", name=name, namespace=namespace, api_version="v1"),
            what=f"lifting the network isolation of {ref}",
            obj=pod,
            policy=str(note["falco_rule"]) if note and note.get("falco_rule") else None,
            details={"isolation": note} if note else None,
            resolves=True,
        )
        if note is None or not isolated(pod):
            if note is not None:
                why = f"the isolation of {ref} was already lifted, not by nodeward"
            elif isolated(pod):
                why = (
                    f"{ref} is labelled {ISOLATE_LABEL}=true but not by nodeward (no isolation "
                    "record of its own), and stays isolated"
                )
            else:
                why = f"{ref} is not isolated by nodeward"
            reason = f"refused: {why}; nodeward undoes only what it did"
            return await refuse(self.runner, proposal, guard="not_ours", reason=reason)

        async def act() -> dict[str, Any]:
            return await lift(self.cluster, pod, proposal.reason)

        decided = await self.runner.run(proposal, act, self.control_guards, retry=False)
        if decided.outcome is Outcome.APPLIED and self.isolations is not None:
            await self.isolations.forget(namespace, name)  # lifted, and audited as such
        return reply_for(
            decided,
            done=f"lifted the isolation of {ref} (isolated for {note.get('falco_rule')!r} at "
            f"{note.get('at')}); the pod is on the network again",
        )


# daemon --------------------------------------------------------------------------------
@dataclass
class Assembled:
    daemon: Daemon
    service: FalcoService
    ingest: Ingest | None


@app.prepare
async def prepare(config: FalcoSettings) -> Policy:
    """The rules, and the ingest's settings checked: a bad one is one line, and nothing is
    connected."""
    try:
        policy = load_policy(config.rules_file)
    except RulesError as exc:
        raise ConfigError(f"services.{NAME}: {exc}") from None
    if config.ingest.enabled:
        try:
            Ingest.check(config.ingest)
        except IngestError as exc:
            raise ConfigError(f"services.{NAME}.ingest: {exc}") from None
    return policy


@app.setup
async def setup(rt: Runtime[FalcoSettings]) -> FalcoService:
    """The service over its buckets and breaker, its HTTP ingest started (already bound).

    `settings.cluster` must authenticate as the falco ServiceAccount (context
    `nodeward-falco` of the `nodeward up` kubeconfig).
    """
    config, bus, daemon = rt.config, rt.bus, rt.daemon
    started: list[Ingest] = []

    async def stop_ingest() -> None:
        for ingest in started:
            await ingest.stop()

    # Hooks run last-added first: the ingest stops before the bus and the cluster close.
    daemon.add_shutdown_hook(stop_ingest)
    kv = await rt.kv(
        config.bucket, history=1, ttl_s=max(config.dedup_window.total_seconds() * 2, 60)
    )
    breaker = await breaker_for(rt)
    # The cordon action's intents and the isolation records: no TTL (NodeMarks' history).
    marks_kv = await rt.kv(config.marks_bucket, history=5)
    service = FalcoService(
        rt,
        dedup=DedupWindow(kv, config.dedup_window, prefix="dedup"),
        breaker=breaker,
        isolation_kv=marks_kv,
    )
    if config.ingest.enabled:

        async def publish(events: list[Event[FalcoAlert]]) -> None:
            await bus.publish_many(events)

        bulk = config.lanes()[-1][0]  # the lowest priorities' lane

        async def backlog() -> int:
            info = await bus.js.consumer_info("SECURITY", bulk, timeout=2)
            return (info.num_pending or 0) + (info.num_ack_pending or 0)

        ingest = Ingest(
            config.ingest,
            publish,
            registry=daemon.metrics.registry,
            backlog=backlog,
            urgent=config.urgent,
            gate=service.gate,
        )
        try:
            await ingest.start()
        except IngestError as exc:
            raise ConfigError(f"services.{NAME}.ingest: {exc}") from None
        started.append(ingest)
        service.ingest = ingest
    return service


@app.task("isolations")
async def check_isolations(service: FalcoService) -> None:
    """Keep the isolation records true to the API."""
    assert service.isolations is not None
    await service.isolations.loop(service.settings.isolation_check_interval.total_seconds())


async def assemble(settings: Settings, *, up: UpContext | None = None) -> Assembled:
    """The daemon (consumers on `falco.>`), the service and its HTTP ingest (already bound)."""
    built = await app.assemble(settings, up=up)
    return Assembled(built.daemon, built.service, built.service.ingest)


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
    assembled = await assemble(settings, up=context)
    if assembled.ingest is not None:
        context.endpoints["falco_ingest_url"] = assembled.ingest.url
        token = assembled.ingest.settings.token_file
        if token is not None:
            context.endpoints["falco_token_file"] = token
    return [assembled.daemon]


component = Component(NAME, _build_for_up)
standalone = Standalone(build)
