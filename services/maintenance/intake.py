"""The maintenance service's intake: `maintenance.requested` events recorded in KV as new
workflows (one per node at a time), and the node annotation `nodeward.io/maintenance=requested`
turned into a request."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from typing import Any

import structlog

from nodeward.aio import within
from nodeward.bus import Delivery, PermanentError
from nodeward.kube import NotFound
from schemas.base import Event, make_event
from schemas.ids import stable_id
from schemas.maintenance import Maintenance, MaintenancePhase
from services.maintenance.common import (
    ACTOR,
    MAINTENANCE_ANNOTATION,
    REASON_ANNOTATION,
    Kit,
    now,
)
from services.maintenance.state import MaintenanceState, state_key


@dataclass(frozen=True)
class Intake:
    """Requests in: each accepted one is a workflow stored in KV (the workflow loop is woken)."""

    kit: Kit

    async def handle(self, event: Event[Any], delivery: Delivery) -> None:
        """A `maintenance.requested`: recorded in KV for the workflow loop (one per node)."""
        data: Maintenance = event.data
        with structlog.contextvars.bound_contextvars(
            event_id=event.id, node=data.node, maintenance=data.maintenance_id
        ):
            if data.phase != MaintenancePhase.REQUESTED:
                return
            age = (now() - event.time).total_seconds()
            if age > self.kit.settings.max_request_age.total_seconds():
                # A replay (a new consumer reading the stream's history) starts nothing.
                self.kit.log.warning("maintenance.old_request", age_s=round(age))
                return
            try:
                await self.kit.cluster.nodes.get(data.node)
            except NotFound:
                error = f"no node named {data.node} in the cluster"
                await self._publish_request_failed(event, data, error)
                raise PermanentError(error) from None
            state = MaintenanceState(
                maintenance_id=data.maintenance_id,
                node=data.node,
                reason=data.reason,
                requested_by=data.requested_by,
                requested_at=event.time,
                trigger_id=event.id,
                start_at=data.start_at or event.time,
                deadline_s=data.deadline_s or self.kit.settings.deadline.total_seconds(),
                dry_run=self.kit.settings.dry_run,
                move=data.move,
                scope=data.pods,
                updated_at=now(),
            )

            def accept(current: MaintenanceState | None) -> MaintenanceState | None:
                if current is not None and (
                    not current.terminal or current.maintenance_id == data.maintenance_id
                ):
                    return None  # one maintenance at a time per node; a redelivery is a no-op
                return state

            stored = await self.kit.states.update(state_key(data.node), accept)
            assert stored is not None
            if stored.value.maintenance_id != data.maintenance_id:
                busy = stored.value
                await self._publish_request_failed(
                    event,
                    data,
                    f"node {data.node} is already in maintenance {busy.maintenance_id} "
                    f"({busy.phase.value})",
                )
                return
            self.kit.log.info("maintenance.accepted", start_at=state.start_at.isoformat())
            self.kit.wake.set()

    async def _publish_request_failed(
        self, event: Event[Any], data: Maintenance, error: str
    ) -> None:
        self.kit.log.warning("maintenance.request_failed", error=error)
        failed = data.model_copy(update={"phase": MaintenancePhase.FAILED, "error": error})
        await self.kit.bus.publish(
            make_event(
                failed,
                source=ACTOR,
                id=stable_id(event.time, data.maintenance_id, "failed", event.id),
            )
        )

    async def watch_annotations(self, stopping: asyncio.Event) -> None:
        """Publish a request for each node annotated `nodeward.io/maintenance=requested`."""
        interval = self.kit.settings.annotation_interval
        if interval is None:
            return
        while not stopping.is_set():
            try:
                await self._requests_from_annotations()
            except Exception as exc:  # noqa: BLE001 - a failed scan is retried, never fatal
                self.kit.log.warning("maintenance.annotation_scan_failed", error=str(exc))
            with contextlib.suppress(TimeoutError):
                await within(stopping.wait(), interval.total_seconds())

    async def _requests_from_annotations(self) -> None:
        if not self.kit.leading:
            return  # the replica holding the workflow lease scans (one request per node)
        for node in await self.kit.cluster.nodes.list():
            meta = node.get("metadata") or {}
            notes = meta.get("annotations") or {}
            if notes.get(MAINTENANCE_ANNOTATION) != "requested":
                continue
            name = str(meta["name"])
            current = await self.kit.states.get(state_key(name))
            if current is not None and not current.value.terminal:
                continue
            at = now()
            request = Maintenance(
                node=name,
                phase=MaintenancePhase.REQUESTED,
                maintenance_id=f"mnt-{at:%Y%m%dT%H%M%S}-{name}",
                reason=str(notes.get(REASON_ANNOTATION) or "requested by node annotation"),
                requested_by=f"annotation/{MAINTENANCE_ANNOTATION}",
            )
            await self.kit.bus.publish(make_event(request, source=ACTOR))
            # The handshake, not an action: the request is taken (the phases follow).
            await self.kit.cluster.nodes.set_annotations(name, {MAINTENANCE_ANNOTATION: "accepted"})
            self.kit.log.info("maintenance.requested_by_annotation", node=name)
