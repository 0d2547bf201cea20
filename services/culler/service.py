"""services.culler: warn the owners of idle sessions kindly, then stop the sessions, reversibly.

A durable consumer on `session.>` (in order per session). A `session.idle.v1` whose
idle time (counted from `nodeward.io/keep-until` if the user set one) reaches
`warn_after` warns the owner through the notifier: what is idle, since when, when it
stops, how to keep it and how to restart it. Once the owner has had the whole warning
period (`cull_after - warn_after`) and the session is still idle for `cull_after`, it is
stopped: a Kubeflow Notebook the way Kubeflow stops it (annotation
`kubeflow-resource-stopped`, restartable from the UI); a plain session pod is deleted
only if a controller that keeps its spec brings it back (StatefulSet, ReplicaSet),
otherwise it is left and reported. Activity after a warning (a `session.activity.v1`
that says active, or a later idle period) withdraws it and is recorded. Sessions older
than `max_age` are warned and stopped the same way even when active.

Every decision goes through the kernel's runner (the guard chain: exemptions, staleness,
the rate limit on stops; dry-run; audit; on-call notice), and so is audited, acted on or
not; warnings and deadlines live in KV, so a restart neither repeats a warning nor
forgets a deadline. An event older than `max_event_age` (a replay) is never acted on: a
stale `session.idle` that could have warned or stopped is audited as skipped `too_old`,
as cordon audits a stale failure, once per session and idle period. An event about a
pod that no longer exists, or about an earlier pod of the same name, changes nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import structlog
from pydantic import Field

from nodeward.bus import ConsumerSpec, Delivery
from nodeward.bus.kv import TypedKV
from nodeward.durations import Duration, format_duration
from nodeward.handlers import Consuming, Runtime, Service, setting
from nodeward.kube import NotFound
from nodeward.kube.base import Obj
from nodeward.kube.notebooks import STOP_ANNOTATION
from nodeward.kube.objects import PodView
from schemas.base import Event
from schemas.common import ObjectRef
from schemas.ids import stable_id
from schemas.notify import Severity
from schemas.remediation import Outcome
from schemas.session import ActivityState, SessionActivity, SessionIdle
from services.culler.access import ACCESS
from services.culler.policy import KEEP_UNTIL, CullPolicy, Limits, keep_until
from services.culler.state import SESSIONS, Reason, SessionRecord, session_key
from services.kernel import (
    ActingSettings,
    DedupWindow,
    GuardChain,
    OwnerNotice,
    Proposal,
    RateLimiter,
    RateLimitSettings,
    Staleness,
    TtlCache,
    acting_for,
    per_action,
    tell_owner,
)
from services.kernel.access import PUBLISHES
from services.kernel.severities import QUIET

NAME = "culler"
ACTOR = "service/culler"
TOPIC = "idle-session"
NOTEBOOK_LABEL = "notebook-name"
CULLED_ANNOTATION = "nodeward.io/culled"
# On-call hears of every decision; only a failure pages.
SEVERITIES = per_action((QUIET, ("warn", "stop", "cancel", "ignore")))
NEW_PERIOD_SLACK = timedelta(seconds=5)


class CullerSettings(CullPolicy, ActingSettings, Consuming):
    """`services.culler` in the config file."""

    subjects: list[str] = Field(default_factory=lambda: ["session.>"], min_length=1)
    bucket: str = SESSIONS.name
    concurrency: int = Field(default=8, ge=1)
    rate_limit: RateLimitSettings = RateLimitSettings(per_minute=10, burst=5)
    deletable_controllers: list[str] = Field(
        default_factory=lambda: ["StatefulSet", "ReplicaSet"],
        description="a plain session pod is deleted only if one of these controls it",
    )
    max_event_age: Duration = timedelta(minutes=10)
    """older events (a replay) are recorded, never acted on"""
    lease_ttl: Duration = timedelta(seconds=20)
    """with bus.partitions > 1: a replica's partitions are taken over this long after it dies; a
    replica that cannot renew for half of it stops its own, so keep it above twice nats-server's
    longest election (9 s) of the bucket's leader"""
    record_ttl: Duration = timedelta(days=14)
    """a session's record (warning, stop) is forgotten this long after its last change, so records
    of pods long gone do not pile up"""
    namespace_ttl: Duration = timedelta(seconds=60)
    """how long a namespace's policy annotations and labels are cached"""


app = Service(
    NAME, settings=CullerSettings, access=ACCESS, buckets=(SESSIONS.name,), publishes=PUBLISHES
)


@dataclass(frozen=True, kw_only=True)
class Session(PodView):
    """A session as the API shows it now."""

    notebook: Obj | None
    namespace_obj: Obj | None
    limits: Limits

    @property
    def stopped(self) -> bool:
        annotations = ((self.notebook or {}).get("metadata") or {}).get("annotations") or {}
        return STOP_ANNOTATION in annotations

    def target(self) -> ObjectRef:
        if self.notebook is not None:
            return ObjectRef(
                kind="Notebook",
                name=self.notebook["metadata"]["name"],
                namespace=self.namespace,
                api_version="kubeflow.org/v1",
            )
        return ObjectRef(kind="Pod", name=self.name, namespace=self.namespace, api_version="v1")

    def controller(self) -> dict[str, Any] | None:
        for ref in self.pod["metadata"].get("ownerReferences") or []:
            if ref.get("controller"):
                return dict(ref)
        return None

    def created(self) -> datetime | None:
        raw = self.pod["metadata"].get("creationTimestamp")
        if not raw:
            return None
        return datetime.fromisoformat(str(raw).replace("Z", "+00:00"))


def _when(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC")


def _ago(delta: timedelta) -> str:
    seconds = max(int(delta.total_seconds()), 0)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


class CullerService:
    def __init__(self, rt: Runtime[CullerSettings], records: TypedKV[SessionRecord]) -> None:
        self.bus, self.cluster, self.settings = rt.bus, rt.acting, rt.config
        settings, self.records = rt.config, records
        # Every decision is audited through the runner: the service never calls the auditor.
        kernel = acting_for(
            rt, topic=TOPIC, severities=SEVERITIES, namespace_labels=self._namespace_labels
        )
        self.runner, self.exemptions = kernel.runner, kernel.exemptions
        self.limiter = RateLimiter(settings.rate_limit)
        self.staleness = Staleness(settings.max_event_age)
        self.stop_guards = GuardChain([self.exemptions, self.limiter])
        # One audit per session and idle period for a replay's stale events, whichever
        # replica sees them.
        self.stale_seen = DedupWindow(records.kv, settings.max_event_age, prefix="stale")
        self.log = structlog.get_logger().bind(service=NAME)
        self._namespaces = TtlCache[str, Obj | None](settings.namespace_ttl.total_seconds())

    @app.consumes(
        "SESSIONS",
        subjects=setting("subjects"),
        types=(SessionIdle, SessionActivity),
        concurrency=setting("concurrency"),
        order_key=lambda e: f"{e.data.namespace}/{e.data.pod}",
        retry_delays=(1.0, 5.0, 15.0, 30.0),
        max_deliver=8,
        # session.*.<node>.<ns>.<pod>: a node speaks only of its own pods.
        identity=(
            ConsumerSpec.bind(SessionIdle, "node", "namespace", "pod"),
            ConsumerSpec.bind(SessionActivity, "node", "namespace", "pod"),
        ),
        # Per pod across replicas with bus.partitions > 1 (leases in its bucket).
        leases=lambda culler: culler.records.kv,
        lease_ttl=setting("lease_ttl"),
    )
    async def handle(self, event: Event[Any], delivery: Delivery) -> None:
        data: SessionIdle | SessionActivity = event.data
        with structlog.contextvars.bound_contextvars(
            event_id=event.id, namespace=data.namespace, pod=data.pod, node=data.node
        ):
            namespace_obj = await self._namespace(data.namespace)
            limits = self.settings.limits(data.kind.value, namespace_obj)
            if await self._stale(event, data, limits):
                return
            if not await self._worth_a_look(data, limits):
                return
            session = await self._session(data, namespace_obj, limits)
            if session is None:
                return
            if isinstance(data, SessionIdle):
                await self._on_idle(event, data, session)
            else:
                await self._on_activity(event, data, session)

    async def _stale(
        self, event: Event[Any], data: SessionIdle | SessionActivity, limits: Limits
    ) -> bool:
        """True when the event is older than `max_event_age`: it is never acted on.

        A stale `session.idle` past the warning time (one that could have warned or
        stopped) is audited as skipped `too_old`, once per session and idle period; other
        stale samples only restate state: logged, not audited.
        """
        target = ObjectRef(kind="Pod", name=data.pod, namespace=data.namespace, api_version="v1")
        pod = f"{data.namespace}/{data.pod}"
        if isinstance(data, SessionIdle):
            what = f"session.idle of {pod} (idle since {_when(data.idle_since)})"
        else:
            what = f"session.activity of {pod} ({data.state.value})"
        proposal = Proposal(
            action="ignore",
            target=target,
            reason=what,
            policy=limits.source,
            trigger_id=event.id,
            trigger_time=event.time,
            protective=False,
            details={"pod": pod, "event_type": event.type},
        )

        async def restates(outcome: Outcome, guard: str | None) -> bool:
            if (
                not isinstance(data, SessionIdle)
                or data.idle_for_s < limits.warn_after.total_seconds()
            ):
                return True
            period = f"{pod}/{data.uid or ''}/{data.idle_since.isoformat()}"
            first, _ = await self.stale_seen.first(period, event.id)
            return not first

        skipped = await self.runner.screen(proposal, [self.staleness], repeat=restates)
        if skipped is not None:
            self.log.info("culler.old_event", age_s=skipped.details.get("age_s"))
        return skipped is not None

    # reading the session ----------------------------------------------------------------
    async def _namespace(self, name: str) -> Obj | None:
        """The namespace object (its policy annotations, its labels), cached briefly."""
        return await self._namespaces.get(name, self._read_namespace)

    async def _read_namespace(self, name: str) -> Obj | None:
        try:
            obj: Obj | None = await self.cluster.namespaces.get(name)
        except NotFound:
            obj = None
        return obj

    async def _namespace_labels(self, name: str) -> dict[str, str]:
        obj = await self._namespace(name)
        return dict(((obj or {}).get("metadata") or {}).get("labels") or {})

    async def _worth_a_look(self, data: SessionIdle | SessionActivity, limits: Limits) -> bool:
        """False when the event cannot change anything: most events, read from KV alone.

        Every session's activity arrives each interval; only a pending warning, a maximum
        age, or idleness past the warning time needs the session read from the API.
        """
        current = await self.records.get(session_key(data.namespace, data.pod))
        record = current.value if current else None
        ours = record is not None and record.uid == data.uid
        if ours and record is not None and record.stopped_at is not None:
            return record.dry_run and not self.settings.dry_run
        if (ours and record is not None and record.pending) or limits.max_age is not None:
            return True
        if isinstance(data, SessionIdle):
            return data.idle_for_s >= limits.warn_after.total_seconds()
        return False

    async def _session(
        self, data: SessionIdle | SessionActivity, namespace_obj: Obj | None, limits: Limits
    ) -> Session | None:
        key = session_key(data.namespace, data.pod)
        try:
            pod = await self.cluster.pods.get(data.namespace, data.pod)
        except NotFound:
            await self.records.delete(key)
            return None
        if data.uid and pod["metadata"].get("uid") != data.uid:
            self.log.info("culler.other_pod", event_uid=data.uid)
            return None
        notebook = None
        name = (pod["metadata"].get("labels") or {}).get(NOTEBOOK_LABEL)
        if name:
            try:
                notebook = await self.cluster.notebooks.get(data.namespace, name)
            except NotFound:
                notebook = None
        for problem in limits.problems:
            self.log.warning("culler.policy_annotation", problem=problem)
        return Session(pod, notebook=notebook, namespace_obj=namespace_obj, limits=limits)

    async def _record(self, session: Session) -> SessionRecord:
        current = await self.records.get(session_key(session.namespace, session.name))
        record = current.value if current else SessionRecord()
        # Another pod of the same name, or what a dry run recorded now that it is off: afresh.
        if record.uid != session.uid or (record.dry_run and not self.settings.dry_run):
            record = SessionRecord(uid=session.uid, node=session.pod["spec"].get("nodeName"))
        return record

    async def _save(self, session: Session, record: SessionRecord) -> None:
        await self.records.put(session_key(session.namespace, session.name), record)

    # events -----------------------------------------------------------------------------
    async def _on_activity(
        self, event: Event[Any], data: SessionActivity, session: Session
    ) -> None:
        record = await self._record(session)
        if data.state == ActivityState.ACTIVE and record.pending and record.reason == "idle":
            used = data.last_activity or data.sampled_at
            await self._cancel(event, session, record, "the session was used again", used)
            return
        await self._check_age(event, session, record)

    async def _on_idle(self, event: Event[Any], data: SessionIdle, session: Session) -> None:
        record = await self._record(session)
        if await self._settled(event, session, record):
            return
        if record.active_at is not None and data.idle_since < record.active_at - NEW_PERIOD_SLACK:
            self.log.info("culler.idle_period_over", since=data.idle_since.isoformat())
            return  # a late or redelivered event: the session was used since
        now = datetime.now(UTC)
        keep, problem = keep_until(session.pod, session.notebook)
        if problem:
            self.log.warning("culler.keep_until_unreadable", problem=problem)
        if keep is not None and keep > now:
            if record.pending:
                why = f"{KEEP_UNTIL} asks to keep it until {_when(keep)}"
                await self._cancel(event, session, record, why, None)
            else:
                self.log.debug("culler.kept", until=keep.isoformat())
            return
        since = max(data.idle_since, keep) if keep is not None else data.idle_since
        if (
            record.pending
            and record.reason == "idle"
            and record.idle_since is not None
            and since > record.idle_since + NEW_PERIOD_SLACK
        ):
            # Idle again, but since later than the warning said: it was used in between.
            record = await self._cancel(
                event, session, record, "the session was used again", data.idle_since
            )
        idle_for = now - since
        limits = session.limits
        if not record.pending and idle_for >= limits.warn_after:
            deadline = max(since + limits.cull_after, now + limits.lead)
            why = f"idle for {_ago(idle_for)} (since {_when(since)}): " + "; ".join(
                f"{e.signal}: {e.detail}" for e in data.evidence
            )
            await self._warn(
                event, session, record, reason="idle", idle_since=since, deadline=deadline, why=why
            )
            return
        if record.pending and not record.warn_sent and not record.dry_run:
            await self._resend_warning(session, record)
        if (
            record.pending
            and record.reason == "idle"
            and record.deadline is not None
            and now >= record.deadline
            and idle_for >= limits.cull_after
        ):
            why = (
                f"idle for {_ago(idle_for)} since {_when(since)}, warned at "
                f"{_when(record.warned_at or now)}"
            )
            await self._stop(event, session, record, why)
            return
        await self._check_age(event, session, record)

    async def _settled(self, event: Event[Any], session: Session, record: SessionRecord) -> bool:
        """True when nothing is to be done: stopped already, exempt, or culling is off."""
        if record.stopped_at is not None:
            return True
        if session.stopped:
            self.log.info("culler.already_stopped")
            await self._save(
                session,
                record.model_copy(
                    update={"stopped_at": datetime.now(UTC), "stop_outcome": "stopped by others"}
                ),
            )
            return True
        exempt = await self.exemptions.exempt_reason(session.pod)
        if exempt is None and session.notebook is not None:
            exempt = await self.exemptions.exempt_reason(session.notebook)
        if exempt is None and not session.limits.enabled:
            exempt = f"culling is off for namespace {session.namespace} ({session.limits.source})"
        if exempt is None:
            return False
        decision = f"skipped/exempt/{exempt}"
        if record.last_decision != decision:
            proposal = self._proposal("warn", event, session, f"not culled: {exempt}")
            await self.runner.skip(proposal, guard="exempt")
            await self._save(session, record.model_copy(update={"last_decision": decision}))
        return True

    async def _check_age(self, event: Event[Any], session: Session, record: SessionRecord) -> None:
        """Warn, then stop, a session older than its `max_age` (even an active one)."""
        max_age = session.limits.max_age
        created = session.created()
        if max_age is None or created is None or session.stopped or record.stopped_at:
            return
        if await self._settled(event, session, record):
            return
        now = datetime.now(UTC)
        deadline = created + max_age
        if not record.pending and now >= deadline - session.limits.lead:
            why = f"it started at {_when(created)}; sessions may run at most {format_duration(max_age)}"
            await self._warn(
                event,
                session,
                record,
                reason="max_age",
                idle_since=None,
                deadline=max(deadline, now + session.limits.lead),
                why=why,
            )
        elif (
            record.pending
            and record.reason == "max_age"
            and record.deadline is not None
            and now >= record.deadline
        ):
            await self._stop(event, session, record, f"older than {format_duration(max_age)}")

    # actions ----------------------------------------------------------------------------
    def _proposal(
        self,
        action: str,
        event: Event[Any],
        session: Session,
        reason: str,
        *,
        protective: bool = False,
        **details: Any,
    ) -> Proposal:
        return Proposal(
            action=action,
            target=session.target(),
            reason=reason,
            policy=session.limits.source,
            trigger_id=event.id,
            trigger_time=event.time,
            protective=protective,
            obj=session.pod,
            details={"pod": f"{session.namespace}/{session.name}", **details},
        )

    async def _warn(
        self,
        event: Event[Any],
        session: Session,
        record: SessionRecord,
        *,
        reason: Reason,
        idle_since: datetime | None,
        deadline: datetime,
        why: str,
    ) -> None:
        now = datetime.now(UTC)
        warn_id = stable_id(now, "warn", session.namespace, session.name, session.uid or "")
        record = record.model_copy(
            update={
                "reason": reason,
                "idle_since": idle_since,
                "warned_at": now,
                "warn_id": warn_id,
                "warn_sent": False,
                "deadline": deadline,
                "dry_run": self.settings.dry_run,
                "last_decision": None,
            }
        )
        # The record first: a restart after it never warns twice, and resends the notice
        # under the same id (JetStream drops the duplicate) if it was not marked sent.
        await self._save(session, record)
        proposal = self._proposal(
            "warn",
            event,
            session,
            f"{session.target().key()} will stop at {_when(deadline)}: {why}",
            deadline=deadline.isoformat(),
            cause=reason,
        )

        async def act() -> dict[str, Any]:
            await self._send_warning(session, record)
            return {"deadline": deadline.isoformat()}

        await self.runner.run(proposal, act, [])
        if not self.settings.dry_run:
            await self._save(session, record.model_copy(update={"warn_sent": True}))

    async def _resend_warning(self, session: Session, record: SessionRecord) -> None:
        await self._send_warning(session, record)
        await self._save(session, record.model_copy(update={"warn_sent": True}))

    async def _send_warning(self, session: Session, record: SessionRecord) -> None:
        assert record.deadline is not None and record.warn_id is not None
        what = session.target()
        if record.reason == "max_age":
            title = f"Your session {session.namespace}/{session.name} reaches its maximum age"
            why = (
                "Sessions on this platform may run for a limited time, so that the shared GPUs "
                "return to everyone in turn."
            )
        else:
            since = record.idle_since or record.warned_at or datetime.now(UTC)
            title = f"Your idle session {session.namespace}/{session.name} will be stopped"
            why = (
                f"It has had no GPU, CPU or notebook activity since {_when(since)}. "
                "GPUs are shared: an idle session holds them from others who are waiting."
            )
        body = (
            f"{what.kind} {what.name} in namespace {session.namespace} will be stopped at "
            f"{_when(record.deadline)}."
        )
        await self._notify_user(
            session,
            record.warn_id,
            OwnerNotice(
                severity=Severity.WARNING,
                title=title,
                body=body,
                why=why,
                steps=self._keep_steps(session) + self._restart_steps(session),
                deadline=record.deadline,
            ),
        )

    def _keep_steps(self, session: Session) -> list[str]:
        what = session.target()
        ref = f"{what.kind.lower()}/{what.name} -n {session.namespace}"
        return [
            "To keep it, just use it: a running cell, GPU work or CPU work cancels the stop.",
            f"To keep it idle until a given time: kubectl annotate {ref} "
            f"{KEEP_UNTIL}=<time, e.g. 2026-12-01T18:00:00Z> --overwrite",
        ]

    def _restart_steps(self, session: Session) -> list[str]:
        if session.notebook is not None:
            return [
                "After it is stopped, start it again from the Kubeflow Notebooks page "
                "(Start); its volumes and files are kept."
            ]
        owner = session.controller()
        kind = owner.get("kind", "controller") if owner else "controller"
        return [
            f"After it is stopped, its {kind} starts a fresh pod; files on its persistent "
            "volumes are kept, running processes are not."
        ]

    async def _notify_user(self, session: Session, notice_id: str, notice: OwnerNotice) -> None:
        await tell_owner(
            self.bus,
            notice,
            actor=ACTOR,
            topic=TOPIC,
            namespace=session.namespace,
            name=session.name,
            targets=[session.target()],
            notice_id=notice_id,
        )

    async def _news(
        self,
        session: Session,
        occasion: tuple[datetime, str, str],
        *,
        title: str,
        body: str,
        why: str,
        steps: list[str] | None = None,
    ) -> None:
        """Tell the owner what became of their session (info, no deadline); the notice's id
        is stable per (when, what, instance) of the session."""
        at, what, instance = occasion
        notice_id = stable_id(at, what, session.namespace, session.name, instance)
        notice = OwnerNotice(Severity.INFO, title, body, why, steps or [], None)
        await self._notify_user(session, notice_id, notice)

    async def _cancel(
        self,
        event: Event[Any],
        session: Session,
        record: SessionRecord,
        why: str,
        used_at: datetime | None,
    ) -> SessionRecord:
        """Withdraw the warning; `used_at`: when the session was used (None: kept)."""
        now = datetime.now(UTC)
        was_dry = record.dry_run
        cancelled = record.cancelled_now(now, active_at=used_at)
        await self._save(session, cancelled)
        proposal = self._proposal(
            "cancel",
            event,
            session,
            f"stop of {session.target().key()} withdrawn: {why}",
            warned_at=record.warned_at.isoformat() if record.warned_at else None,
        )
        # Its effect is the record just saved (and the notice): nothing for the runner to act.
        await self.runner.record(proposal, Outcome.APPLIED)
        if not was_dry and record.warn_sent:
            await self._news(
                session,
                (now, "cancel", record.warn_id or ""),
                title=f"Your session {session.namespace}/{session.name} will not be stopped",
                body=f"The stop announced for {_when(record.deadline or now)} is withdrawn: {why}.",
                why="nodeward stops only sessions that stay idle after a warning.",
            )
        self.log.info("culler.cancelled", why=why)
        return cancelled

    async def _stop(
        self, event: Event[Any], session: Session, record: SessionRecord, why: str
    ) -> None:
        now = datetime.now(UTC)
        target = session.target()
        controller = session.controller()
        if session.notebook is None and (
            controller is None or controller.get("kind") not in self.settings.deletable_controllers
        ):
            what = f"{controller.get('kind')} {controller.get('name')}" if controller else "nothing"
            reason = (
                f"{target.key()} left running: {why}, but it is controlled by {what}, which "
                "would not bring it back; an operator must decide"
            )
            decision = "skipped/no_controller"
            if record.last_decision != decision:
                proposal = self._proposal("stop", event, session, reason, protective=True)
                await self.runner.skip(proposal, guard="no_controller", reason=reason)
                await self._save(session, record.model_copy(update={"last_decision": decision}))
            return
        proposal = self._proposal(
            "stop", event, session, f"{target.key()} stopped: {why}", protective=True
        )
        mark = json.dumps(
            {"by": ACTOR, "at": now.isoformat(), "event": event.id, "reason": why},
            separators=(",", ":"),
        )

        async def act() -> dict[str, Any]:
            if session.notebook is not None:
                stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
                await self.cluster.notebooks.set_annotations(
                    session.namespace,
                    target.name,
                    {STOP_ANNOTATION: stamp, CULLED_ANNOTATION: mark},
                )
                return {"stopped": "notebook", STOP_ANNOTATION: stamp}
            deleted = await self.cluster.pods.delete(
                session.namespace, session.name, uid=session.uid
            )
            return {"stopped": "pod deleted" if deleted else "pod already gone"}

        result = await self.runner.run(proposal, act, self.stop_guards)
        if result.outcome not in (Outcome.APPLIED, Outcome.DRY_RUN):
            return
        await self._save(
            session,
            record.model_copy(update={"stopped_at": now, "stop_outcome": result.outcome.value}),
        )
        if result.outcome == Outcome.APPLIED:
            await self._news(
                session,
                (now, "stopped", session.uid or ""),
                title=f"Your session {session.namespace}/{session.name} was stopped",
                body=f"{target.kind} {target.name} in namespace {session.namespace} was stopped "
                f"at {_when(now)}: {why}.",
                why="It stayed idle after the warning nodeward sent.",
                steps=self._restart_steps(session),
            )


@app.setup
async def setup(rt: Runtime[CullerSettings]) -> CullerService:
    """The culler over its bucket; `settings.cluster` must authenticate as its ServiceAccount."""
    kv = await rt.kv(rt.config.bucket, history=5, ttl_s=rt.config.record_ttl.total_seconds())
    return CullerService(rt, TypedKV(kv, SessionRecord))


build = app.build
component, standalone = app.daemon()
