"""The hung-node detector: every `hang.check_interval`, each node judged (`hang.judge`)
from its API object and its agents' newest heartbeat on the bus; a node that turns
unresponsive, or answers again, is published as a `NodeHealth` event on
`node.health.<node>`, which the recovery's own durable consumer acts on (so the finding and
the act are two records, and operators follow the first).

Silence is judged only for nodes heard since the stream's retention began and still
`Ready` (a node not Ready is judged by that); when more than `quiet_bus` of the nodes heard
are silent at once the bus is the suspect, not the nodes: nobody is judged silent and the
detector logs it. Every replica runs it: a finding's event id is stable (node, kind,
since), so the bus stores it once within its duplicate window, and the intake is idempotent.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

from nodeward.aio import within
from nodeward.bus.snapshot import SnapshotError, last_stored_times
from nodeward.kube import KubeError
from schemas.base import make_event
from schemas.ids import stable_id
from schemas.node import NodeCause, NodeHealth
from services.recovery.common import ACTOR, Kit
from services.recovery.hang import judge, ready, silent_nodes, summary

HEARTBEAT_STREAM = "HEARTBEATS"


@dataclass
class Detector:
    """Judges every node each pass; remembers what it last published of each."""

    kit: Kit
    told: dict[str, bool] = field(default_factory=dict)
    """node -> responsive, as last published by this replica"""
    told_at: dict[str, float] = field(default_factory=dict)
    """node -> when its unresponsiveness was last published"""
    quiet: bool = False

    async def run(self, stopping: asyncio.Event) -> None:
        interval = self.kit.settings.hang.check_interval.total_seconds()
        while not stopping.is_set():
            try:
                await self.pass_once()
            except Exception:  # one bad pass must not stop the detector
                self.kit.log.exception("recovery.detector_failed")
            with contextlib.suppress(TimeoutError):
                await within(stopping.wait(), interval)

    async def heard(self, nodes: list[str]) -> dict[str, datetime]:
        """Each node's newest GPU heartbeat's store time, for those the stream holds."""
        pattern = self.kit.settings.hang.heartbeat_subjects.split(".")
        at = pattern.index("*")
        filters = [".".join([*pattern[:at], n, *pattern[at + 1 :]]) + ".>" for n in nodes]
        filters += [".".join([*pattern[:at], n, *pattern[at + 1 :]]) for n in nodes]
        try:
            stored = await last_stored_times(self.kit.bus.nc, HEARTBEAT_STREAM, filters)
        except (SnapshotError, OSError, TimeoutError) as exc:
            self.kit.log.warning("recovery.heartbeats_unread", error=str(exc))
            return {}
        out: dict[str, datetime] = {}
        for subject, stored_at in stored.items():
            node = subject.split(".")[at]
            out[node] = max(out.get(node, stored_at), stored_at)
        return out

    async def pass_once(self, now: datetime | None = None) -> dict[str, list[NodeCause]]:
        """Judge every node; publish what changed. The unresponsive nodes and why."""
        settings = self.kit.settings.hang
        try:
            nodes = await self.kit.cluster.nodes.list()
        except KubeError as exc:
            self.kit.log.warning("recovery.nodes_unread", error=str(exc))
            return {}
        now = now or datetime.now(UTC)
        names = [str(n["metadata"]["name"]) for n in nodes]
        heard = await self.heard([str(n["metadata"]["name"]) for n in nodes if ready(n)])
        silent, quiet = silent_nodes(heard, now, settings.silent_after, settings.quiet_bus)
        if quiet != self.quiet:
            self.quiet = quiet
            log = self.kit.log.warning if quiet else self.kit.log.info
            log("recovery.bus_quiet" if quiet else "recovery.bus_heard", nodes=len(heard))
        found: dict[str, list[NodeCause]] = {}
        for node, name in zip(nodes, names, strict=True):
            causes = judge(node, now, settings, silent_since=silent.get(name))
            if causes:
                found[name] = causes
            await self._tell(name, causes, now)
        for gone in set(self.told) - set(names):
            del self.told[gone]
            self.told_at.pop(gone, None)
        return found

    async def _tell(self, node: str, causes: list[NodeCause], now: datetime) -> None:
        responsive, previous = not causes, self.told.get(node)
        if responsive and previous is not False:  # never told unresponsive: nothing to say
            self.told[node] = True
            return
        retell = self.kit.settings.hang.retell_after.total_seconds()
        if not responsive and previous is False and time.time() - self.told_at[node] < retell:
            return  # told; told again each `retell_after` (a start the floor or pause refused)
        since = min((c.since for c in causes), default=now)
        kinds = ",".join(sorted(c.kind.value for c in causes)) or "responsive"
        health = NodeHealth(
            node=node, responsive=responsive, causes=causes, since=since,
            summary=summary(node, causes),
        )  # fmt: skip
        event = make_event(
            health, source=ACTOR, id=stable_id(now, "node-health", node, kinds, since.isoformat())
        )
        await self.kit.bus.publish(event)
        self.told[node], self.told_at[node] = responsive, time.time()
        self.kit.log.info("recovery.node_health", node=node, responsive=responsive,
                          summary=health.summary)  # fmt: skip
