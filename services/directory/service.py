"""services.directory: each user namespace's owner from LDAP, kept on the namespace.

A namespace names its owner by the label `nodeward.io/owner=<login>` or Kubeflow's
annotation `owner=<mail>` (`schemas.directory`). Every `interval`, and at once for a
namespace created (or given an owner) meanwhile, the service looks the owners up in LDAP
(`services.directory.ldap`: paged searches, TLS) and merges the owner's uid, gid, primary
group, experiment, mail, display name and groups into the namespace's labels and
annotations with one JSON merge patch of its own keys (`services.directory.mapping`):
nobody else's label or annotation is touched, nothing is deleted.

An owner the directory no longer has is flagged: the annotation `nodeward.io/owner-left`
(the record, written first), then on-call is told once through the kernel (an audited
`owner-left` decision, published under an id derived from the annotation, `once`: a restart
does not tell it again); when the owner is back the return is audited (resolving the
incident) and the flag removed. The directory down, or the bind refused: one log line per
new error, retried with back-off, the namespaces keep what they have, readiness says so. An
entry that cannot be read (a uidNumber that is no number): one log line, its namespaces
skipped, the others synced.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Literal

import structlog
from prometheus_client import Counter, Gauge

from nodeward.aio import within
from nodeward.daemon import DaemonError
from nodeward.handlers import Runtime, Service
from nodeward.kube import Conflict, KubeError, NotFound
from nodeward.metrics import at_zero
from schemas.common import ObjectRef
from schemas.directory import OWNER_LEFT
from schemas.ids import stable_id
from schemas.notify import Severity
from schemas.remediation import Outcome
from services.directory.access import ACCESS
from services.directory.mapping import Wanted, left_patch, owner, sync_patch, wanted
from services.directory.settings import NAME, TOPIC, DirectorySettings
from services.kernel import Proposal, acting_for, per_action, table
from services.kernel.access import AUDIT_READ, PUBLISHES

if TYPE_CHECKING:
    from services.directory.ldap import Directory, Lookup

ACTION = "owner-left"
# Flagging changes nothing the owner or on-call relies on: a warning; the return, news.
SEVERITIES = per_action(
    (table({Outcome.APPLIED: Severity.WARNING, Outcome.UNDONE: Severity.INFO}), (ACTION,))
)
_EPOCH = datetime.fromtimestamp(0, UTC)

app = Service(
    NAME,
    settings=DirectorySettings,
    access=ACCESS,
    # AUDIT_READ: an owner's departure is told once across restarts (`Auditor.stored`).
    publishes=(*PUBLISHES, AUDIT_READ),
)

State = Literal["starting", "ok", "failing", "idle"]


def _stamp(at: datetime) -> str:
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _when(stamp: str) -> datetime:
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return _EPOCH


def _meta(ns: dict[str, Any]) -> tuple[str, dict[str, str], dict[str, str], str | None]:
    meta = ns.get("metadata") or {}
    return (
        str(meta.get("name", "")),
        dict(meta.get("labels") or {}),
        dict(meta.get("annotations") or {}),
        meta.get("resourceVersion"),
    )


class DirectoryService:
    """The sync loop, the namespace watch and the owner-left flag of one replica."""

    def __init__(self, rt: Runtime[DirectorySettings], directory: Directory | None) -> None:
        self.settings = rt.config
        self.cluster = rt.acting
        self.directory = directory
        self.runner = acting_for(rt, topic=TOPIC, severities=SEVERITIES).runner
        self.log = structlog.get_logger().bind(service=NAME)
        self.queue: asyncio.Queue[str] = asyncio.Queue()
        self.state: State = "idle" if directory is None else "starting"
        self.error: str | None = None
        self.seen: dict[str, str] = {}
        """namespace -> the owner key last queued or synced (a change queues it again)"""
        self.told: set[tuple[str, str, str]] = set()
        """(namespace, left_at, outcome) audited by this process"""
        self.said: set[str] = set()
        """bad entries logged by this process"""
        registry = rt.daemon.metrics.registry
        self.passes = Counter(
            "nodeward_directory_syncs",
            "Directory syncs (every namespace, or those new), by outcome",
            ["scope", "outcome"],
            registry=registry,
        )
        at_zero(self.passes, scope=("full", "new"), outcome=("ok", "failed"))
        self.left = Gauge(
            "nodeward_directory_owners_left",
            "Namespaces whose owner the directory no longer has (last full sync)",
            registry=registry,
        )

    # readiness --------------------------------------------------------------------------
    def ready(self) -> bool:
        """Ready once a sync went through, or with no directory configured; not while the
        directory cannot be read."""
        return self.state in ("ok", "idle")

    # the loop ---------------------------------------------------------------------------
    async def run(self) -> None:
        """A full sync every `interval`, the queued namespaces in between; while the
        directory (or the API) fails, full syncs after a growing delay only."""
        if self.directory is None:
            self.log.warning("directory.idle", why="services.directory.url is not set")
            return
        loop = asyncio.get_running_loop()
        initial = self.settings.retry_initial.total_seconds()
        delay = initial
        full_at = loop.time()
        while True:
            names: set[str] | None = None
            wait = max(full_at - loop.time(), 0.0)
            if self.state == "failing":
                await asyncio.sleep(wait)
            else:
                with contextlib.suppress(TimeoutError):
                    names = {await within(self.queue.get(), wait)}
                    while not self.queue.empty():
                        names.add(self.queue.get_nowait())
            scope = "full" if names is None else "new"
            try:
                await self.sync(names)
            except _Failed as exc:
                self.passes.labels(scope, "failed").inc()
                self._failing(exc.cause, str(exc), delay)
                full_at = loop.time() + delay
                delay = min(delay * 2, self.settings.retry_max.total_seconds())
                continue
            self.passes.labels(scope, "ok").inc()
            if self.state != "ok":
                self.log.info("directory.synced", recovered=self.state == "failing")
            self.state, self.error, delay = "ok", None, initial
            if names is None:
                full_at = loop.time() + self.settings.interval.total_seconds()

    def _failing(self, cause: str, message: str, delay: float) -> None:
        """One line per new error; the same error again only at debug."""
        if (self.state, self.error) != ("failing", message):
            self.log.error("directory.unavailable", cause=cause, error=message, retry_s=delay)
        else:
            self.log.debug("directory.still_unavailable", error=message, retry_s=delay)
        self.state, self.error = "failing", message

    async def sync(self, names: set[str] | None) -> None:
        """Sync every namespace naming an owner (`names` None) or just `names`."""
        from services.directory.ldap import DirectoryError

        assert self.directory is not None
        try:
            namespaces = await self._namespaces(names)
        except KubeError as exc:
            raise _Failed("kubernetes", f"listing namespaces failed: {exc}") from None
        owned = [(ns, who) for ns in namespaces if (who := wanted(*_meta(ns)[1:3])) is not None]
        if not owned:
            return
        try:
            found = await self.directory.lookup(who for _, who in owned)
        except DirectoryError as exc:
            raise _Failed(exc.cause, str(exc)) from None
        for message in found.bad_groups:
            self._bad(message)
        left = 0
        for ns, who in owned:
            name = _meta(ns)[0]
            self.seen.setdefault(name, who.key())
            with structlog.contextvars.bound_contextvars(
                namespace=name, owner=who.login or who.mail
            ):
                try:
                    left += await self.apply(ns, who, found)
                except NotFound:
                    continue
                except KubeError as exc:  # this one waits for the next pass; the others go on
                    self.log.warning("directory.write_failed", error=str(exc))
        if names is None:
            self.left.set(left)

    async def _namespaces(self, names: set[str] | None) -> list[dict[str, Any]]:
        if names is None:
            return await self.cluster.namespaces.list(
                label_selector=self.settings.namespace_selector
            )
        found = []
        for name in sorted(names):
            with contextlib.suppress(NotFound):
                found.append(await self.cluster.namespaces.get(name))
        return found

    def _bad(self, message: str, **context: str) -> None:
        """One line per bad entry (and namespace) in this process's life."""
        if message not in self.said:
            self.said.add(message)
            self.log.error("directory.bad_entry", error=message, **context)

    async def apply(self, ns: dict[str, Any], who: Wanted, found: Lookup) -> int:
        """Bring one namespace in line with the directory; 1 if its owner has left."""
        name, labels, annotations, version = _meta(ns)
        if who.key() in found.bad:
            self._bad(
                f"{found.bad[who.key()]}: skipped, namespace {name} keeps its labels",
                namespace=name,
            )
            return 0
        entry = found.find(who)
        now = _stamp(datetime.now(UTC))
        if entry is None:
            if self.settings.dry_run:
                self.log.info("directory.would_flag", namespace=name, owner=who.login or who.mail)
                return 1
            await self.flag(name, who, annotations, version, now)
            return 1
        if annotations.get(OWNER_LEFT) and not self.settings.dry_run:
            await self._tell(name, who, annotations[OWNER_LEFT], returned=True)
        patch = sync_patch(labels, annotations, owner(entry, found.groups, found.egroups), now=now)
        if patch and self.settings.dry_run:
            self.log.info(
                "directory.would_write",
                login=entry.login,
                labels=patch.labels,
                annotations=sorted(patch.annotations),
            )
        elif patch:
            await self.cluster.namespaces.merge_metadata(
                name, labels=patch.labels, annotations=patch.annotations
            )
            self.log.info(
                "directory.owner_written",
                login=entry.login,
                keys=sorted([*patch.labels, *patch.annotations]),
            )
        return 0

    async def flag(
        self, name: str, who: Wanted, annotations: dict[str, str], version: str | None, now: str
    ) -> None:
        """The departure recorded on the namespace first (at the version read: two replicas
        flag it once), then told."""
        patch = left_patch(annotations, now=now)
        if patch:
            try:
                await self.cluster.namespaces.merge_metadata(
                    name, annotations=patch.annotations, resource_version=version
                )
            except Conflict:
                self.log.info("directory.flag_conflict")  # read again on the next pass
                return
            self.log.warning("directory.owner_left")
        await self._tell(name, who, annotations.get(OWNER_LEFT) or now, returned=False)

    async def _tell(self, name: str, who: Wanted, left_at: str, *, returned: bool) -> None:
        """Audit the departure (on-call is told) or the return, once per departure: the id
        is derived from the flag's timestamp and `once` finds it stored after a restart."""
        outcome = Outcome.UNDONE if returned else Outcome.APPLIED
        if (name, left_at, outcome.value) in self.told:
            return
        whom = who.login or who.mail or "?"
        if returned:
            reason = f"namespace {name} has its owner ({whom}) in the directory again"
        else:
            reason = (
                f"the owner of namespace {name} ({whom}) is no longer in the directory "
                f"(since {left_at}); the namespace and everything in it were left as they are"
            )
        proposal = Proposal(
            action=ACTION,
            target=ObjectRef(kind="Namespace", name=name),
            reason=reason,
            trigger_id=stable_id(_when(left_at), ACTION, name, left_at, outcome.value),
            trigger_time=_when(left_at),
            protective=False,
            details={"owner": whom, "left_at": left_at},
            title=f"namespace {name}: owner {whom} {'back' if returned else 'left'}",
            resolves=returned,
        )
        await self.runner.record(proposal, outcome, once=True)
        self.told.add((name, left_at, outcome.value))

    # the watch --------------------------------------------------------------------------
    async def watch(self) -> None:
        """Queue a namespace created with an owner, or whose owner changed; the watch is
        resumed after an API outage."""
        delay = self.settings.retry_initial.total_seconds()
        selector = self.settings.namespace_selector
        while True:
            try:
                listing = await self.cluster.namespaces.listing(label_selector=selector)
                for ns in listing.items:
                    self._noticed(ns, queue=False)
                async for event in self.cluster.namespaces.watch(
                    label_selector=selector, resource_version=listing.resource_version
                ):
                    if event.type == "DELETED":
                        self.seen.pop(_meta(event.object)[0], None)
                    else:
                        self._noticed(event.object, queue=True)
                    delay = self.settings.retry_initial.total_seconds()
            except KubeError as exc:
                self.log.warning("directory.watch_failed", error=str(exc), retry_s=delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.settings.retry_max.total_seconds())

    def _noticed(self, ns: dict[str, Any], *, queue: bool) -> None:
        name, labels, annotations, _ = _meta(ns)
        who = wanted(labels, annotations)
        if who is None or self.seen.get(name) == who.key():
            return
        self.seen[name] = who.key()
        if queue:
            self.queue.put_nowait(name)


class _Failed(Exception):
    def __init__(self, cause: str, message: str) -> None:
        super().__init__(message)
        self.cause = cause


@app.prepare
async def prepare(config: DirectorySettings) -> None:
    """Refuse to start, in one line, without bonsai or a readable bind password."""
    if config.url is None:
        return
    try:
        import bonsai  # noqa: F401
    except ImportError as exc:
        raise DaemonError(
            f"services.directory needs bonsai ({exc}): pip install 'nodeward[ldap]'"
        ) from None
    if config.bind_password_file is not None and not config.bind_password_file.is_file():
        raise DaemonError(
            f"services.directory.bind_password_file {config.bind_password_file} is not a file"
        )


@app.setup
async def setup(rt: Runtime[DirectorySettings]) -> DirectoryService:
    """The service over its cluster port; `settings.cluster` must authenticate as its
    ServiceAccount."""
    directory = None
    if rt.config.url is not None:
        from services.directory.ldap import Directory

        directory = Directory(rt.config)
    return DirectoryService(rt, directory)


@app.task("sync")
async def sync(service: DirectoryService) -> None:
    await service.run()


@app.task("watch")
async def watch(service: DirectoryService) -> None:
    if service.directory is not None:
        await service.watch()


@app.ready("directory")
def ready(service: DirectoryService) -> bool:
    return service.ready()


build = app.build
component, standalone = app.daemon()
