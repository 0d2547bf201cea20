"""Repeated XIDs: every XID is recorded (`gpu.xid.v1`); one that repeats on a GPU is reported.

Application XIDs (13, 31, 43, ...) never fail a GPU, and the catalog says to investigate
them when they repeat: the same XID `count` times within `window` on one GPU is a bad
application or the first sign of a bad GPU. The report is a `report` decision on the AUDIT
stream (on-call hears of it through its notice) and a notice to the owner of every pod that
held the GPU, once per window whichever replica counts it. The counts live in the cordon
service's bucket (`schemas.state.cordon.XIDS`), updated with revision checks.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from datetime import timedelta
from typing import Any

import structlog
from pydantic import Field

from nodeward.bus import Bus, Delivery
from nodeward.bus.kv import TypedKV
from nodeward.config import Section
from nodeward.durations import Duration, format_duration
from schemas.base import Event
from schemas.common import ObjectRef
from schemas.gpu import GpuXid
from schemas.ids import stable_id
from schemas.notify import Severity
from schemas.state.cordon import XIDS, XidRepeats
from services.kernel import ActionRunner, OwnerNotice, Proposal, node_ref, tell_owner


class XidRepeatSettings(Section):
    """`services.cordon.xid_repeats`: when a repeated XID is reported."""

    enabled: bool = True
    count: int = Field(default=3, ge=2, description="this many of one XID on one GPU ...")
    window: Duration = timedelta(minutes=10)
    """... within this"""
    categories: list[str] = Field(
        default_factory=lambda: ["application"],
        description="the catalog classes counted (others fail the GPU through its health)",
    )
    subjects: list[str] = Field(default_factory=lambda: ["gpu.xid.>"], min_length=1)


def counted(record: XidRepeats | None, at: float, event_id: str, window: float) -> XidRepeats:
    """The record with this XID added (once per event) and the ones outside the window gone."""
    record = record or XidRepeats()
    keep = [(t, e) for t, e in zip(record.seen, record.event_ids, strict=False) if at - t <= window]
    if event_id not in {e for _, e in keep}:
        keep.append((at, event_id))
    keep.sort()
    reported, by = record.reported_at, record.reported_by
    if reported is not None and at - reported > window:
        reported = by = None
    return XidRepeats(
        seen=[t for t, _ in keep],
        event_ids=[e for _, e in keep],
        reported_at=reported,
        reported_by=by,
    )


def decide(
    current: XidRepeats | None,
    at: float,
    event_id: str,
    *,
    window: float,
    count: int,
    now: float,
) -> tuple[XidRepeats, bool]:
    """The record with this XID counted, and whether this event reports the repeat: the
    one that reaches `count` within the window does, and so does its redelivery (its report
    may not have gone out; the same ids are stored once); nothing else in the window."""
    record = counted(current, at, event_id, window)
    if record.reported_at is not None:
        return record, record.reported_by == event_id
    if len(record.seen) < count:
        return record, False
    return record.model_copy(update={"reported_at": now, "reported_by": event_id}), True


@dataclass(eq=False)
class XidReports:
    """The `gpu.xid.>` handler of the cordon service."""

    bus: Bus
    records: TypedKV[XidRepeats]
    runner: ActionRunner
    settings: XidRepeatSettings
    _: KW_ONLY
    actor: str
    topic: str
    clock: Callable[[], float] = time.time
    log: Any = field(
        default_factory=lambda: structlog.get_logger().bind(service="cordon", handler="xids"),
        init=False,
    )

    async def handle(self, event: Event[Any], delivery: Delivery) -> None:
        xid: GpuXid = event.data
        with structlog.contextvars.bound_contextvars(
            node=xid.node, gpu=xid.gpu_index, xid=xid.xid, event_id=event.id
        ):
            self.log.info("gpu.xid", name=xid.name, category=xid.category)
            if xid.category not in self.settings.categories:
                return
            await self._count(event, xid)

    async def _count(self, event: Event[Any], xid: GpuXid) -> None:
        window = self.settings.window.total_seconds()
        at = xid.observed_at.timestamp()
        report = False

        def change(current: XidRepeats | None) -> XidRepeats:
            nonlocal report
            record, report = decide(
                current, at, event.id, window=window, count=self.settings.count, now=self.clock()
            )
            return record

        key = XIDS.key(xid.node, xid.gpu_index, xid.xid)
        result = await self.records.update(key, change)
        if report and result is not None:
            await self._report(event, xid, result.value)

    async def _report(self, event: Event[Any], xid: GpuXid, record: XidRepeats) -> None:
        window = format_duration(self.settings.window)
        times = len(record.seen)
        pods = ", ".join(f"{p.namespace}/{p.name}" for p in xid.pods) or "no pod"
        reason = (
            f"XID {xid.xid} ({xid.name}, {xid.category}) {times} times within {window} on "
            f"{xid.node} GPU {xid.gpu_index}; held by {pods}"
        )
        proposal = Proposal(
            action="report",
            target=node_ref(xid.node),
            reason=reason,
            policy="xid-repeats",
            trigger_id=event.id,
            trigger_time=event.time,
            protective=False,
            details={
                "xid": xid.xid,
                "gpu": xid.gpu_index,
                "gpu_uuid": xid.gpu_uuid,
                "count": times,
                "events": record.event_ids,
                "pods": [f"{p.namespace}/{p.name}" for p in xid.pods],
                "processes": [p.pid for p in xid.processes],
            },
            severity=Severity.WARNING,
            title=f"{xid.node} GPU {xid.gpu_index}: XID {xid.xid} repeated",
        )

        async def tell() -> dict[str, Any]:
            told = []
            for pod in xid.pods:
                await tell_owner(
                    self.bus,
                    OwnerNotice(
                        severity=Severity.WARNING,
                        title=f"Your pod {pod.name} keeps hitting GPU error XID {xid.xid}",
                        body=(
                            f"The GPU your pod {pod.namespace}/{pod.name} uses on {xid.node} "
                            f"reported XID {xid.xid} ({xid.name}) {times} times within "
                            f"{window}. NVIDIA classes it as an application error: usually "
                            "the program (an out-of-bounds access, an illegal instruction)."
                        ),
                        why=f"XID {xid.xid} repeated on GPU {xid.gpu_index} of {xid.node}",
                        steps=[
                            "Check the program's last CUDA errors and restart it.",
                            "If it keeps happening with code that ran before, tell the "
                            "platform team: the GPU itself may be failing.",
                        ],
                    ),
                    actor=self.actor,
                    topic=self.topic,
                    namespace=pod.namespace,
                    name=pod.name,
                    targets=[ObjectRef(kind="Pod", name=pod.name, namespace=pod.namespace)],
                    notice_id=stable_id(
                        event.time, event.id, "xid-repeat", pod.namespace, pod.name
                    ),
                )
                told.append(f"{pod.namespace}/{pod.name}")
            return {"owners_told": told, "count": times}

        self.log.warning("gpu.xid_repeated", count=times)
        await self.runner.run(proposal, tell)
