"""services.notifier: tells people what nodeward did, through the channels they already use.

A durable consumer on `notify.>` routes each `notify.v1` (YAML routes: severity, topic,
namespace, node, audience -> channels), groups notices per route and recipient, renders
them with replaceable templates and sends them by email, chat webhook, JSON webhook,
Alertmanager or into a file outbox. A user's notice (`audience: user:<ns>/<name>`) is
mailed to the owner's address (`nodeward.io/owner-email` on the pod or namespace, or the
owner directory).

At-least-once: a notice's message is acked only once every channel of its routes has
sent it or dead-lettered it (`dlq.v1` with the channel and the reason), so a crash
before that redelivers it; what was settled is recorded per event id in KV, so a
redelivered notice is not sent twice.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import structlog
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue
from prometheus_client import CollectorRegistry, Counter, Gauge
from pydantic import Field, ValidationError

from nodeward.bus import (
    Bus,
    ConsumerSpec,
    Delivery,
    IdentityRefused,
    PermanentError,
    RetryableError,
)
from nodeward.bus.dlq import dead_letter_event, one_line
from nodeward.bus.lanes import lanes as bus_lanes
from nodeward.config import ConfigError
from nodeward.durations import Duration
from nodeward.handlers import Consuming, FromSettings, Runtime, Service, setting
from nodeward.kube import Cluster, KubeError
from nodeward.metrics import at_zero
from schemas.base import Event
from schemas.dlq import DeadLetterReason
from schemas.notify import Notification, Severity
from services.kernel import DedupWindow
from services.notifier.access import ACCESS
from services.notifier.channels import (
    Channel,
    ChannelSettings,
    OutboxSettings,
    Outgoing,
    RetrySettings,
    deliver,
    make_channel,
)
from services.notifier.grouping import (
    Entry,
    Group,
    Grouper,
    GroupingSettings,
    Item,
    RateLimitSettings,
    RecentSends,
    SharedRecentSends,
    fold,
    summary,
)
from services.notifier.owners import DirectoryError, Owners, load_directory
from services.notifier.render import TemplateConfigError, Templates
from services.notifier.routing import (
    Audience,
    AudienceError,
    Facts,
    Route,
    Routes,
    RoutingError,
    load_routes,
)
from services.notifier.speakers import refusal
from services.notifier.state import SETTLED
from services.notifier.state import Settled as SettledRecord

NAME = "notifier"
SOURCE = "service/notifier"
DEFAULT_OUTBOX = Path(".nodeward") / "outbox"
SENT, DEAD, SUPPRESSED, DRY_RUN = "sent", "dead-lettered", "suppressed", "dry-run"
RESOLVED_FIRST = "resolved-first"


def _default_channels() -> dict[str, Any]:
    return {"outbox": OutboxSettings()}


class NotifierSettings(Consuming):
    """`services.notifier` in the config file."""

    dry_run: bool = False
    """render and write the outbox; send nothing external"""
    subjects: list[str] = Field(default_factory=lambda: ["notify.>"], min_length=1)
    bucket: str = SETTLED.name
    routes_file: Path | None = None
    """None: the shipped default"""
    templates_dir: Path | None = None
    """templates here replace the shipped ones of the same name"""
    owner_directory: Path | None = None
    """YAML: namespace -> owner email, after the annotations"""
    owner_lookup: bool = True
    """read owner annotations from the cluster (pods, namespaces get)"""
    owner_cache_ttl: Duration = timedelta(seconds=60)
    support_contact: str = "your platform team"
    max_lines: int = Field(default=25, ge=1, description="notices listed in one message")
    channels: dict[str, ChannelSettings] = Field(default_factory=_default_channels)
    grouping: GroupingSettings = GroupingSettings()
    rate_limit: RateLimitSettings = RateLimitSettings()
    retry: RetrySettings = RetrySettings()
    max_in_flight: int = Field(
        default=5000,
        ge=1,
        description="notices held unacked while their groups collect; at 90% every group is sent",
    )
    ack_wait: Duration = timedelta(seconds=30)
    settled_ttl: Duration = timedelta(days=7)
    """how long sent marks are kept (>= NOTIFY max age)"""
    refused_notice_window: Duration = timedelta(minutes=15)
    """on-call hears of refused notices from one publisher once per window"""


class NotifierMetrics:
    def __init__(self, registry: CollectorRegistry, channels: Iterable[str] = ()) -> None:
        """`channels`: those configured, each one's failures and dead letters counted
        from 0."""
        channels = tuple(channels)
        self.sent = Counter(
            "nodeward_notifications_sent",
            "Messages delivered, by channel and route (one per grouped message)",
            ["channel", "route"],
            registry=registry,
        )
        self.failed = Counter(
            "nodeward_notifications_failed",
            "Failed delivery attempts, by channel",
            ["channel"],
            registry=registry,
        )
        self.dead_lettered = Counter(
            "nodeward_notifications_dead_lettered",
            "Notices sent to the DLQ because a channel could not deliver them",
            ["channel"],
            registry=registry,
        )
        at_zero(self.failed, channel=channels)
        at_zero(self.dead_lettered, channel=channels)
        self.grouped = Counter(
            "nodeward_notifications_grouped",
            "Notices folded into a group another notice opened",
            ["route"],
            registry=registry,
        )
        self.waiting = Gauge(
            "nodeward_notifications_waiting",
            "Notices held (unacked) in groups that are not sent yet",
            registry=registry,
        )
        self.resolved_first = Counter(
            "nodeward_notifications_resolved_first",
            "Pages not sent: their incident ended while they waited for the rate limit",
            ["route"],
            registry=registry,
        )
        self.suppressed = Counter(
            "nodeward_notifications_suppressed",
            "Notices identical to one sent within the dedup window (recorded, not re-sent)",
            ["route"],
            registry=registry,
        )


class Settled:
    """Per event id and route: which channels have sent (or dead-lettered) the notice."""

    def __init__(self, kv: KeyValue) -> None:
        self.kv = kv

    async def get(self, event_id: str, route: str) -> dict[str, str]:
        try:
            entry = await self.kv.get(SETTLED.key(event_id, route))
        except KeyNotFoundError:
            return {}
        if entry.value is None:
            return {}
        try:
            return SETTLED.load(entry.value).root
        except ValidationError:
            return {}

    async def put(self, event_id: str, route: str, outcome: dict[str, str]) -> None:
        await self.kv.put(
            SETTLED.key(event_id, route), SettledRecord(outcome).model_dump_json().encode()
        )


app = Service(
    NAME,
    settings=NotifierSettings,
    buckets=(SETTLED.name,),
    # Refused notices are audited and told to on-call (`speakers`, and the runtime's
    # identity check): the security audit and on-call's security notice, nothing else.
    publishes=("remediation.identity_mismatch.>", "notify.critical.security"),
)
"""Its owner lookups connect the cluster only when `owner_lookup` is on (`setup`)."""


class NotifierService:
    def __init__(
        self,
        bus: Bus,
        *,
        settings: NotifierSettings,
        routes: Routes,
        channels: dict[str, Channel],
        templates: Templates,
        owners: Owners,
        settled: Settled,
        metrics: NotifierMetrics,
        dedup: DedupWindow | None = None,
    ) -> None:
        self.bus = bus
        self.settings = settings
        self.routes = routes
        self.channels = channels
        self.templates = templates
        self.owners = owners
        self.settled = settled
        self.metrics = metrics
        # Repeats are recognised across replicas when `dedup` (KV) is given.
        self.recent = SharedRecentSends(
            RecentSends(settings.grouping.dedup_window.total_seconds()), dedup
        )
        self.grouper = Grouper(
            settings.grouping,
            settings.rate_limit,
            self.flush,
            on_error=self._flush_failed,
            capacity=max(1, settings.max_in_flight * 9 // 10),
        )
        metrics.waiting.set_function(lambda: self.grouper.waiting)
        self.log = structlog.get_logger().bind(service=NAME)

    # one notice -------------------------------------------------------------------------
    @app.consumes(
        "NOTIFY",
        subjects=setting("subjects"),
        types=(Notification,),
        # A consumer per lane: pages are never fetched behind a backlog of info notices.
        lanes=lambda _, config: lanes(config),
        concurrency=setting("max_in_flight"),
        batch=FromSettings(lambda c: min(64, c.max_in_flight)),
        max_ack_pending=FromSettings(lambda c: c.max_in_flight + min(64, c.max_in_flight)),
        # The runtime sends in_progress every ack_wait/3 while a notice waits in its
        # group, so the wait may be longer than ack_wait.
        ack_wait=setting("ack_wait"),
        retry_delays=(5.0, 30.0, 120.0, 600.0),
        max_deliver=8,
        # A notice's severity and topic are its subject's (`speakers`): a publisher
        # allowed only `notify.*.power-limit` cannot send a `security` notice.
        identity=(ConsumerSpec.bind(Notification, "severity", "topic"),),
        identity_notice_window=setting("refused_notice_window"),
    )
    async def handle(self, event: Event[Any], delivery: Delivery) -> None:
        note: Notification = event.data
        with structlog.contextvars.bound_contextvars(
            event_id=event.id, topic=note.topic, severity=note.severity.value
        ):
            try:
                audience = Audience.parse(note.audience)
            except AudienceError as exc:
                raise PermanentError(str(exc)) from None
            refused = refusal(delivery.subject, audience)
            if refused is not None:
                # The runtime refuses it as it refuses an identity mismatch: audited as a
                # security event, on-call told once per window, dead-lettered.
                raise IdentityRefused(
                    refused,
                    claimed={"audience": note.audience, "topic": note.topic},
                    target=("Pod", audience.name or str(audience), audience.namespace),
                    publisher=f"a node agent (any node may publish on {delivery.subject})",
                )
            routes = self.routes.select(Facts.of(note, audience))
            if not routes and audience.kind == "user":
                raise PermanentError(
                    "no route with to_owner: true takes this user's notice "
                    "(a user's notice never goes to on-call's routes)"
                )
            if not routes:
                raise PermanentError("no route matches this notice (add a catch-all route)")
            owner: str | None = None
            if audience.kind == "user" and any(r.to_owner for r in routes):
                assert audience.namespace is not None and audience.name is not None
                owner, where = await self.owners.lookup(audience.namespace, audience.name)
                self.log.debug("notify.owner", owner_found=owner is not None, where=where)
            waits = []
            for route in routes:
                done = await self.settled.get(event.id, route.name)
                todo = tuple(c for c in route.channels if c not in done)
                if not todo:
                    self.log.info("notify.already_settled", route=route.name, outcome=done)
                    continue
                recipient = owner if route.to_owner and audience.kind == "user" else None
                entry = Entry(event, audience, todo, delivery)
                waits.append(self.grouper.add(route, recipient, entry))
            results = await asyncio.gather(*waits)
            unsettled = [c for r in results for c, outcome in r.items() if outcome == "unsettled"]
            if unsettled:
                raise RetryableError(
                    f"not settled on {', '.join(sorted(set(unsettled)))}; retried later"
                )

    # one group --------------------------------------------------------------------------
    def _flush_failed(self, exc: BaseException, group: Group) -> None:
        self.log.error("notify.flush_failed", error=one_line(exc), **summary(group))

    def _outgoing(self, group: Group, items: list[Item], *, dry_run: bool) -> Outgoing:
        context = self.templates.context(group, items, dry_run=dry_run)
        return Outgoing(
            route=group.route.name,
            recipient=group.recipient,
            to_owner=group.personal,
            severity=group.severity,
            items=items,
            rendered=self.templates.message(context),
            chat=self.templates.chat(context),
            dry_run=dry_run,
            addressee=group.addressee,
        )

    async def flush(self, group: Group) -> None:
        """Send one due group on every channel of its route; settle each entry's future."""
        route = group.route
        log = self.log.bind(route=route.name, recipient=group.recipient or group.who)
        if len(group.entries) > 1:
            self.metrics.grouped.labels(route.name).inc(len(group.entries) - 1)
        outcomes: dict[str, dict[str, str]] = {e.event.id: {} for e in group.entries}
        live: list[Item] = []
        for entry in group.entries:
            if entry.event.id in group.resolved_first:
                outcomes[entry.event.id] |= dict.fromkeys(entry.channels, RESOLVED_FIRST)
                self.metrics.resolved_first.labels(route.name).inc()
                log.info(
                    "notify.resolved_before_sent",
                    event_id=entry.event.id,
                    incident=entry.note.incident_key(),
                    title=entry.note.title,
                )
        for item in fold([e for e in group.entries if e.event.id not in group.resolved_first]):
            first = item.entries[0]
            earlier = await self.recent.repeat_of(route.name, item.note)
            if earlier is not None and earlier not in {e.event.id for e in item.entries}:
                for entry in item.entries:
                    outcomes[entry.event.id] |= dict.fromkeys(entry.channels, SUPPRESSED)
                self.metrics.suppressed.labels(route.name).inc(item.count)
                log.info(
                    "notify.repeat_not_sent",
                    event_id=first.event.id,
                    repeat_of=earlier,
                    title=item.note.title,
                    dedup_window_s=self.settings.grouping.dedup_window.total_seconds(),
                )
            else:
                live.append(item)
        if live:
            await asyncio.gather(
                *(self._send_on(name, group, live, outcomes, log) for name in route.channels)
            )
        await asyncio.gather(
            *(
                self._record(entry, route, outcomes[entry.event.id])
                for entry in group.entries
                if outcomes[entry.event.id]
            )
        )
        for entry in group.entries:
            result = dict(outcomes[entry.event.id])
            for channel in entry.channels:
                result.setdefault(channel, "unsettled")
            if not entry.done.done():
                entry.done.set_result(result)

    async def _record(self, entry: Entry, route: Route, outcome: dict[str, str]) -> None:
        settled = {c: o for c, o in outcome.items() if o != "unsettled"}
        if not settled:
            return
        try:
            await self.settled.put(entry.event.id, route.name, settled)
        except Exception as exc:  # noqa: BLE001 - a redelivery may send once more; never lose it
            self.log.warning(
                "notify.settled_mark_failed",
                event_id=entry.event.id,
                route=route.name,
                error=one_line(exc),
            )

    async def _send_on(
        self,
        name: str,
        group: Group,
        live: list[Item],
        outcomes: dict[str, dict[str, str]],
        log: Any,
    ) -> None:
        channel = self.channels[name]
        items = [
            Item([e for e in item.entries if name in e.channels])
            for item in live
            if any(name in e.channels for e in item.entries)
        ]
        if not items:
            return
        ids = [e.event.id for i in items for e in i.entries]
        log = log.bind(channel=name, event_id=ids[0], notices=len(ids))
        dry_run = self.settings.dry_run
        out = self._outgoing(group, items, dry_run=dry_run)
        if dry_run and channel.external:
            log.info("notify.dry_run", subject=out.rendered.subject, event_ids=ids[:20])
            for item in items:
                for entry in item.entries:
                    outcomes[entry.event.id][name] = DRY_RUN
            return
        retry = getattr(getattr(channel, "settings", None), "retry", None) or self.settings.retry

        def failed(attempt: int, error: str, permanent: bool) -> None:
            self.metrics.failed.labels(name).inc()
            log.warning(
                "notify.attempt_failed",
                attempt=attempt,
                attempts=retry.attempts,
                error=error,
                permanent=permanent,
            )

        result = await deliver(channel, out, retry, on_failure=failed)
        if result.ok:
            self.metrics.sent.labels(name, group.route.name).inc()
            await asyncio.gather(
                *(
                    self.recent.sent(group.route.name, item.note, item.latest.event.id)
                    for item in items
                )
            )
            for item in items:
                for entry in item.entries:
                    outcomes[entry.event.id][name] = SENT
            log.info("notify.sent", subject=out.rendered.subject, attempts=result.attempts)
            return
        reason = f"channel {name}: not delivered after {result.attempts} attempt(s): {result.error}"
        log.error("notify.channel_failed", error=result.error, attempts=result.attempts)
        why = DeadLetterReason.PERMANENT if result.permanent else DeadLetterReason.EXHAUSTED
        entries = [e for item in items for e in item.entries]
        settled = await asyncio.gather(
            *(self._dead_letter(e, name, reason, why, log) for e in entries)
        )
        for entry, outcome in zip(entries, settled, strict=True):
            outcomes[entry.event.id][name] = outcome

    async def _dead_letter(
        self, entry: Entry, channel: str, reason: str, why: DeadLetterReason, log: Any
    ) -> str:
        """Publish the notice's `dlq.v1` for this channel; "unsettled" if that fails."""
        log = log.bind(event_id=entry.event.id, channel=channel)
        if entry.delivery is None:
            return "unsettled"
        dl = dead_letter_event(
            entry.delivery.msg,
            stream="NOTIFY",
            consumer=app.base(self.settings),
            reason=why,
            error=reason,
            source=f"{SOURCE}/{app.base(self.settings)}",
            extra_key=(channel,),
        )
        try:
            await self.bus.publish(dl)
        except Exception as exc:  # noqa: BLE001 - not settled: the notice comes back later
            log.error("notify.dlq_publish_failed", error=one_line(exc))
            return "unsettled"
        self.metrics.dead_lettered.labels(channel).inc()
        log.warning("notify.dead_lettered", error=reason, dlq_subject=dl.data.nats_subject())
        return DEAD


CRITICAL_SUFFIX = "-critical"


def lanes(settings: NotifierSettings) -> list[tuple[str, list[str]]]:
    """The notifier's consumers, (durable name, subjects): critical notices on
    `<consumer>-critical`, the others on `<consumer>`; one consumer for subjects whose
    severity cannot be told apart."""
    return bus_lanes(
        app.base(settings),
        settings.subjects,
        prefix="notify",
        urgent=[Severity.CRITICAL.value],
        other=[Severity.INFO.value, Severity.WARNING.value],
        suffix=CRITICAL_SUFFIX,
    )


def load_parts(
    config: NotifierSettings,
) -> tuple[Routes, Templates, dict[str, str]]:
    """Routes, templates and owner directory, checked: a problem is one-line ConfigError."""
    try:
        routes = load_routes(config.routes_file)
        routes.check(set(config.channels))
        routes.check_personal({name: ch.type for name, ch in config.channels.items()})
        templates = Templates(
            config.templates_dir,
            support_contact=config.support_contact,
            max_lines=config.max_lines,
        )
        directory = load_directory(config.owner_directory)
    except (RoutingError, TemplateConfigError, DirectoryError) as exc:
        raise ConfigError(f"services.{NAME}: {exc}") from None
    return routes, templates, directory


@app.prepare
async def prepare(config: NotifierSettings) -> tuple[Routes, Templates, dict[str, str]]:
    """Routes, templates and owner directory, checked before anything is connected."""
    routes, templates, directory = load_parts(config)
    try:
        await templates.check()
    except TemplateConfigError as exc:
        raise ConfigError(f"services.{NAME}: {exc}") from None
    return routes, templates, directory


@app.setup
async def setup(rt: Runtime[NotifierSettings]) -> NotifierService:
    """The notifier over its channels. `settings.cluster` must authenticate as the notifier
    ServiceAccount (context `nodeward-notifier` of the `nodeward up` kubeconfig) when
    `owner_lookup` is on. Outbox channels without a `dir` write to `outbox_dir` (a `build`
    option), else `<state-dir>/outbox` under `nodeward up`, else `.nodeward/outbox`."""
    config, bus = rt.config, rt.bus
    routes, templates, directory = rt.prepared
    cluster: Cluster | None = None
    if config.owner_lookup:
        try:
            cluster = Cluster.connect(rt.settings.cluster, access=ACCESS)
        except KubeError as exc:
            raise ConfigError(
                f"services.{NAME}.owner_lookup needs the cluster ({exc}); "
                "set owner_lookup: false to use the owner directory only"
            ) from None
    http = httpx.AsyncClient(timeout=config.retry.timeout.total_seconds())
    grace = rt.settings.daemon.shutdown_timeout.total_seconds() / 2
    kv = await rt.kv(config.bucket, history=1, ttl_s=config.settled_ttl.total_seconds())
    outbox = rt.options.get("outbox_dir") or (
        rt.up.state_dir / "outbox" if rt.up is not None else DEFAULT_OUTBOX
    )
    channels = {
        name: make_channel(name, ch, http=http, outbox_dir=outbox)
        for name, ch in config.channels.items()
    }
    service = NotifierService(
        bus,
        settings=config,
        routes=routes,
        channels=channels,
        templates=templates,
        owners=Owners(cluster, directory, ttl=config.owner_cache_ttl.total_seconds()),
        settled=Settled(kv),
        metrics=NotifierMetrics(rt.daemon.metrics.registry, tuple(channels)),
        dedup=DedupWindow(kv, config.grouping.dedup_window, prefix="said"),
    )

    async def close() -> None:
        # Hooks run last-added first. Open groups are sent now, so their notices are acked
        # while the consumer drains (what is not settled in time is nak'ed, not lost);
        # then the clients are closed. Closing the bus again later is harmless.
        service.grouper.hurry_all()
        await bus.close(grace=grace)
        await service.grouper.close(0.5)
        await http.aclose()
        if cluster is not None:
            await cluster.close()

    rt.daemon.add_shutdown_hook(close)
    service.log.info(
        "notifier.configured",
        channels={n: type(c).__name__ for n, c in channels.items()},
        routes=[r.name for r in routes.routes],
        dry_run=config.dry_run,
        outbox=str(outbox),
    )
    return service


build = app.build
component, standalone = app.daemon()
_build_for_up = component.build
