"""Hung nodes, pure: when a node is unresponsive (`judge`), the escalation ladder its node
group declares (`HangSettings.ladders`), and the `min_healthy` floor of a group.

A node is unresponsive when one of these has held past its duration:
- its `Ready` condition is `False` or `Unknown` (`not_ready_after`): the kubelet stopped
  posting (the node lifecycle controller's `NodeStatusUnknown`) or says it is not ready;
- a condition another detector sets is `True` (`conditions`, a duration each, as Node
  Health Check's `unhealthyConditions`): node-problem-detector's `KernelDeadlock`,
  `ReadonlyFilesystem`, or any the operator lists;
- none of its node agents was heard (`silent_after`), for a node heard before: its GPU
  heartbeat's newest message on the bus.

The ladder is tried rung by rung, each with its timeout: `reboot` (the reboot request a
reboot operator such as Kured carries out), `power-off-on` (the BMC's soft shutdown, then
power on), `power-cycle` (the BMC's hard power off, then on), `oncall` (on-call told,
"RMA suggested"; the node stays as it is for a human).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

from pydantic import Field, field_validator

from nodeward.config import Section
from nodeward.durations import Duration
from schemas.node import NodeCause, Unresponsiveness

OUT_OF_SERVICE = "node.kubernetes.io/out-of-service"
"""The taint of Kubernetes' non-graceful node shutdown (GA in 1.28): on a node that is not
Ready, the pod GC force-deletes its terminating pods and the attach/detach controller
detaches their volumes, so StatefulSet pods and their volumes move."""
OUT_OF_SERVICE_VALUE = "nodeshutdown"
BMC_ADDRESS_ANNOTATION = "nodeward.io/bmc-address"


class RungAction(StrEnum):
    REBOOT = "reboot"  # the reboot request (label and annotation) a reboot operator acts on
    POWER_OFF_ON = "power-off-on"  # BMC soft shutdown (ACPI), confirmed off, fenced, on
    POWER_CYCLE = "power-cycle"  # BMC hard power off, confirmed off, fenced, on
    ONCALL = "oncall"  # on-call: RMA suggested; nothing more is done

    @property
    def by_bmc(self) -> bool:
        return self in (RungAction.POWER_OFF_ON, RungAction.POWER_CYCLE)


class Rung(Section):
    """One step of a ladder: what is done, and how long the node has to come back after."""

    action: RungAction
    timeout: Duration = timedelta(minutes=10)
    """from the step's start: no new boot, `Ready` and validated by then, the next rung"""


def _default_rungs() -> list[Rung]:
    return [
        Rung(action=RungAction.REBOOT, timeout=timedelta(minutes=10)),
        Rung(action=RungAction.POWER_OFF_ON, timeout=timedelta(minutes=10)),
        Rung(action=RungAction.POWER_CYCLE, timeout=timedelta(minutes=10)),
        Rung(action=RungAction.ONCALL),
    ]


class Ladder(Section):
    """The escalation ladder of one node group (the nodes its label selector selects)."""

    name: str = Field(min_length=1, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    selector: str = ""
    """a label selector (the API server's syntax); empty: every node"""
    min_healthy: int | str = "50%"
    """no new remediation of the group while fewer of its other nodes are healthy (Ready and
    in no recovery): a count, or a percentage of the group's nodes (rounded up)"""
    steps: list[Rung] = Field(default_factory=_default_rungs, min_length=1)

    @field_validator("min_healthy")
    @classmethod
    def _floor(cls, value: int | str) -> int | str:
        if isinstance(value, str):
            number = value.removesuffix("%")
            if not value.endswith("%") or not number.isdigit() or int(number) > 100:
                raise ValueError(f"min_healthy {value!r}: a count or a percentage like '50%'")
        elif value < 0:
            raise ValueError("min_healthy must not be negative")
        return value

    def floor(self, group_size: int) -> int:
        """The healthy nodes the group must keep, of `group_size`."""
        if isinstance(self.min_healthy, int):
            return self.min_healthy
        return math.ceil(group_size * int(self.min_healthy.removesuffix("%")) / 100)


class HangSettings(Section):
    """`services.recovery.hang`: hung nodes, detected and recovered through their BMC."""

    enabled: bool = True
    not_ready_after: Duration = timedelta(minutes=5)
    """`Ready` `False` or `Unknown` this long: unresponsive"""
    conditions: dict[str, Duration] = Field(
        default_factory=lambda: {
            "KernelDeadlock": timedelta(minutes=5),
            "ReadonlyFilesystem": timedelta(minutes=5),
        },
        description="node conditions (`True` = unhealthy) other detectors set, and how long "
        "each must hold: node-problem-detector's, or any the operator lists",
    )
    silent_after: Duration = timedelta(minutes=3)
    """no GPU heartbeat of a node heard before for this long: its agents are silent"""
    heartbeat_subjects: str = "gpu.heartbeat.*"
    """the agents' heartbeats on the bus (the node is the subject's last token)"""
    quiet_bus: float = Field(default=0.5, gt=0, le=1)
    """more than this fraction of the nodes heard silent at once is the bus, not the
    nodes: nobody is judged silent (on-call is told)"""
    check_interval: Duration = timedelta(seconds=10)
    retell_after: Duration = timedelta(minutes=5)
    """a node still unresponsive is published again this often: a start the floor or the
    pause refused is decided again (one already under way ignores it)"""
    ladders: list[Ladder] = Field(default_factory=lambda: [Ladder(name="default")])
    """the first whose selector selects a node is its ladder; a node none selects is left
    alone (its findings are still published)"""
    bmc_secret: str = "nodeward-bmc"  # noqa: S105 - a Secret's name
    """the Secret (in `bmc_namespace`) holding `<node>.username`/`<node>.password`, else
    `username`/`password` for every node"""
    bmc_namespace: str = "nodeward"
    bmc_timeout: Duration = timedelta(seconds=10)
    """one BMC command"""
    power_off_timeout: Duration = timedelta(minutes=2)
    """a power off not confirmed by the BMC's chassis status by then: the next rung"""
    fence_wait: Duration = timedelta(minutes=2)
    """after fencing, how long the node's pods have to be gone before it is powered on"""

    @field_validator("ladders")
    @classmethod
    def _unique(cls, value: list[Ladder]) -> list[Ladder]:
        names = [ladder.name for ladder in value]
        if len(set(names)) != len(names):
            raise ValueError(f"ladder names must be unique: {names}")
        return value


def _at(value: Any) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None


def conditions_of(node: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {str(c.get("type")): c for c in (node.get("status") or {}).get("conditions") or [] if c}


def judge(
    node: Mapping[str, Any],
    now: datetime,
    settings: HangSettings,
    *,
    silent_since: datetime | None = None,
) -> list[NodeCause]:
    """Why `node` (its API object) is unresponsive at `now`; empty if it is not.
    `silent_since`: when its agents were last heard, if they have been silent since."""
    causes: list[NodeCause] = []
    conditions = conditions_of(node)
    ready = conditions.get("Ready")
    if ready is not None and ready.get("status") != "True":
        since = _at(ready.get("lastTransitionTime")) or now
        if now - since >= settings.not_ready_after:
            causes.append(_cause(Unresponsiveness.NOT_READY, ready, since))
    for kind, hold in sorted(settings.conditions.items()):
        found = conditions.get(kind)
        if found is None or found.get("status") != "True":
            continue
        since = _at(found.get("lastTransitionTime")) or now
        if now - since >= hold:
            causes.append(_cause(Unresponsiveness.CONDITION, found, since))
    if silent_since is not None and now - silent_since >= settings.silent_after:
        causes.append(NodeCause(kind=Unresponsiveness.AGENTS_SILENT, since=silent_since))
    return causes


def _cause(kind: Unresponsiveness, condition: Mapping[str, Any], since: datetime) -> NodeCause:
    return NodeCause(
        kind=kind,
        condition=str(condition.get("type")),
        status=str(condition.get("status")),
        reason=str(condition.get("reason") or "")[:256] or None,
        message=str(condition.get("message") or "")[:1024] or None,
        since=since,
    )


def summary(node: str, causes: Iterable[NodeCause]) -> str:
    listed = "; ".join(c.line() for c in causes)
    return f"{node} unresponsive: {listed}"[:1024] if listed else f"{node} responsive again"


def silent_nodes(
    heard: Mapping[str, datetime], now: datetime, silent_after: timedelta, quiet_bus: float
) -> tuple[dict[str, datetime], bool]:
    """The nodes heard before and silent for `silent_after` (node -> last heard), and
    whether the bus itself is quiet (more than `quiet_bus` of them silent: nobody judged)."""
    silent = {n: at for n, at in heard.items() if now - at >= silent_after}
    if heard and len(silent) > quiet_bus * len(heard) and len(heard) > 1:
        return {}, True
    return silent, False


def ready(node: Mapping[str, Any]) -> bool:
    found = conditions_of(node).get("Ready")
    return found is not None and found.get("status") == "True"


def floor_refusal(
    ladder: Ladder,
    group: Iterable[Mapping[str, Any]],
    node: str,
    in_recovery: Iterable[str],
    *,
    unhealthy: Callable[[Mapping[str, Any]], bool] = lambda n: False,
) -> str | None:
    """Why remediating `node` would take its group below its floor; None if it would not.
    Healthy: `Ready`, in no recovery, and not `unhealthy` (judged unresponsive, e.g. a listed
    condition); `node` itself is not counted."""
    members = list(group)
    busy = set(in_recovery)

    def name(n: Mapping[str, Any]) -> str:
        return str((n.get("metadata") or {}).get("name"))

    others = [n for n in members if name(n) != node]
    healthy = [n for n in others if ready(n) and name(n) not in busy and not unhealthy(n)]
    floor = ladder.floor(len(members))
    if len(healthy) >= floor:
        return None
    return (
        f"group {ladder.name}: {len(healthy)} of its other {len(others)} node(s) healthy, "
        f"its floor (min_healthy {ladder.min_healthy}) is {floor}"
    )


def utc(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)
