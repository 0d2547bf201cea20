"""The isolations the falco service holds, kept true to the API.

Every isolation nodeward decides (applied, or a dry run) is recorded in the service's
`marks_bucket` (key `isolations.<namespace>.<pod>`, no TTL) with the pod's uid. A
reconcile pass (`isolation_check_interval`) reads the records in one pass and each
recorded pod once: a pod gone from the API (deleted, evicted), replaced by another of the
same name (another uid: not the isolated one), ended (phase Succeeded or Failed) or
unlabelled by someone else's hand is no longer isolated by nodeward. Its end is audited
once on the isolation's own subject (`remediation.isolate.<pod>`, outcome `skipped`,
guard `pod_gone` or `label_removed`, the isolating alert as trigger: a retried audit has
the same id), which is what `nodeward status` and the console read, then the record is
deleted. An operator's release (`control.falco.release`) deletes it with its own audit.

The pod's lock (`Isolations.lock`) is held by the isolate action, the release and the
check of its record, so none of them decides on what another is changing.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import structlog
from nats.js.errors import APIError
from nats.js.kv import KeyValue
from pydantic import ValidationError

from nodeward.aio import KeyedLocks
from nodeward.bus import Bus
from nodeward.bus.kv import TypedKV
from nodeward.bus.snapshot import kv_entries
from nodeward.kube import Cluster, KubeError, NotFound
from nodeward.kube.base import Obj
from schemas.common import ObjectRef
from schemas.falco import ISOLATE_LABEL
from schemas.notify import Severity
from services.falco.state import ISOLATIONS, IsolationRecord, isolation_key
from services.kernel import ActionRunner, Proposal

ACTION = "isolate"
"""The end of an isolation is audited as a decision of the isolate action."""
POD_GONE = "pod_gone"
LABEL_REMOVED = "label_removed"
TERMINAL = frozenset({"Succeeded", "Failed"})
CHECKS_AT_ONCE = 8
"""Recorded pods read at the same time in one pass."""


@dataclass(frozen=True)
class Ended:
    """Why a recorded isolation no longer holds: the audit's guard, reason and details."""

    guard: str
    reason: str
    details: Mapping[str, Any]


def _stamp(at: datetime) -> str:
    return at.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def ended(record: IsolationRecord, pod: Obj | None, now: datetime) -> Ended | None:
    """Pure: whether `record` still describes `pod` (as read now; None: not in the API)."""
    ref = record.ref
    tail = "; its isolation record ends"
    if pod is None:
        why = (
            f"{ref}: the isolated pod is gone (deleted or evicted: not in the API at {_stamp(now)})"
        )
        return Ended(POD_GONE, why + tail, {"pod_gone": "deleted"})
    meta = pod.get("metadata") or {}
    uid = meta.get("uid")
    if record.uid is not None and uid != record.uid:
        made = f", created {meta['creationTimestamp']}" if meta.get("creationTimestamp") else ""
        why = (
            f"{ref}: the isolated pod (uid {record.uid}) is gone; the pod of that name now is "
            f"another one (uid {uid}{made}), not the one nodeward isolated"
        )
        return Ended(POD_GONE, why + tail, {"pod_gone": "replaced", "new_pod_uid": uid})
    status = pod.get("status") or {}
    phase = status.get("phase")
    if phase in TERMINAL:
        said = f"phase {phase}" + (f": {status['reason']}" if status.get("reason") else "")
        why = f"{ref}: the isolated pod has ended ({said}); nothing of it runs any more"
        return Ended(POD_GONE, why + tail, {"pod_gone": "ended", "phase": phase})
    labels = meta.get("labels") or {}
    if not record.dry_run and labels.get(ISOLATE_LABEL) != "true":
        why = (
            f"{ref}: its {ISOLATE_LABEL}=true label was removed, not by nodeward: the pod is "
            "on the network again"
        )
        return Ended(LABEL_REMOVED, why + tail, {"label": labels.get(ISOLATE_LABEL)})
    return None


def _record(raw: bytes) -> IsolationRecord | None:
    try:
        return ISOLATIONS.load(raw)
    except (ValidationError, ValueError, OSError):
        return None


class Isolations:
    """The service's isolation records: remembered, forgotten, and checked against the API."""

    def __init__(
        self,
        bus: Bus,
        cluster: Cluster,
        kv: KeyValue,
        runner: ActionRunner,
        *,
        bucket: str,
    ) -> None:
        self.bus = bus
        self.cluster = cluster
        self.store: TypedKV[IsolationRecord] = TypedKV(kv, IsolationRecord)
        self.runner = runner
        self.bucket = bucket
        self._locks = KeyedLocks()
        self.log = structlog.get_logger().bind(service="falco")

    def lock(self, namespace: str, pod: str) -> contextlib.AbstractAsyncContextManager[None]:
        """One pod's isolation decided by one of the action, the release or the check."""
        return self._locks(isolation_key(namespace, pod))

    async def get(self, namespace: str, pod: str) -> IsolationRecord | None:
        found = await self.store.get(isolation_key(namespace, pod))
        return found.value if found is not None else None

    async def remember(self, record: IsolationRecord) -> None:
        """Record an isolation (the caller holds the pod's lock). A dry run does not turn the
        record of an applied isolation of the same pod into a dry run's."""

        def change(current: IsolationRecord | None) -> IsolationRecord | None:
            same = current is not None and current.uid == record.uid
            if same and record.dry_run and current is not None and not current.dry_run:
                return None
            return record

        await self.store.update(isolation_key(record.namespace, record.pod), change)

    async def forget(self, namespace: str, pod: str) -> None:
        """Delete the record (the isolation was lifted and audited by its lifter)."""
        await self.store.delete(isolation_key(namespace, pod))

    # the reconcile ---------------------------------------------------------------------
    async def check_all(self, now: datetime | None = None) -> int:
        """One pass: every record read at once, each recorded pod read once (a few at a
        time); the isolations that no longer hold are ended. How many were ended."""
        raw = await kv_entries(self.bus.nc, self.bucket, [ISOLATIONS.prefix])
        keys = sorted(raw or {})
        if not keys:
            return 0
        gate = asyncio.Semaphore(CHECKS_AT_ONCE)

        async def one(key: str) -> bool:
            record = _record((raw or {})[key])
            if record is None:
                self.log.warning("falco.isolation_unreadable", key=key)
                return False
            async with gate:
                try:
                    return await self.check(record.namespace, record.pod, now)
                except KubeError as exc:  # the API is away: the next pass looks again
                    self.log.warning("falco.isolation_check_failed", pod=record.ref, error=str(exc))
                    return False

        return sum(await asyncio.gather(*(one(k) for k in keys)))

    async def check(self, namespace: str, pod: str, now: datetime | None = None) -> bool:
        """End the record of `namespace/pod` if the API says it no longer holds (audited
        once, then deleted). True when it was ended."""
        key = isolation_key(namespace, pod)
        async with self.lock(namespace, pod):
            current = await self.store.get(key)
            if current is None:
                return False
            record = current.value
            try:
                obj: Obj | None = await self.cluster.pods.get(namespace, pod)
            except NotFound:
                obj = None
            why = ended(record, obj, now or datetime.now(UTC))
            if why is None:
                return False
            await self.runner.skip(self._proposal(record, why), guard=why.guard, reason=why.reason)
            try:
                await self.store.delete(key, revision=current.revision)
            except APIError as exc:  # rewritten meanwhile (another replica): that one stays
                if "wrong last sequence" not in str(exc).lower():
                    raise
            self.log.info("falco.isolation_ended", pod=record.ref, guard=why.guard)
            return True

    def _proposal(self, record: IsolationRecord, why: Ended) -> Proposal:
        return Proposal(
            action=ACTION,
            target=ObjectRef(
                kind="Pod", name=record.pod, namespace=record.namespace, api_version="v1"
            ),
            reason=why.reason,
            policy=record.policy,
            # The isolating alert: a retried audit of this end has the same id (stored once).
            trigger_id=record.event_id,
            trigger_time=record.event_time,
            protective=False,
            details={
                "falco_rule": record.falco_rule,
                "hostname": record.node,
                "pod_uid": record.uid,
                "isolated_at": _stamp(record.at),
                "dry_run_isolation": record.dry_run,
                **why.details,
            },
            severity=Severity.INFO,
            title=f"isolation of pod {record.ref}",
        )

    async def loop(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await self.check_all()
            except Exception:  # one bad pass must not stop the loop
                self.log.exception("falco.isolation_pass_failed")
