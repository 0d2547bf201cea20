"""Power caps with hysteresis: a notice for operators when power crosses a cap, one when it clears.

A cap is crossed when the interval's mean power goes above `watts`, and cleared only once
it falls below `watts x (1 - hysteresis)`: power hovering around the cap sends one notice,
not one per interval. A rack's cap is the limit each node of that rack is held to (the
agent sees only its own node; a rack-total cap would need the sum of every node's power).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from agents.energy.settings import PowerCap, PowerCapSettings
from schemas.common import ObjectRef
from schemas.notify import Notification, Severity

TOPIC = "power-limit"
Change = Literal["crossed", "cleared"]


@dataclass
class CapWatch:
    """One cap and whether power is over it now."""

    scope: Literal["node", "rack"]
    name: str  # the node or the rack
    cap: PowerCap
    over: bool = False

    @property
    def clear_below(self) -> float:
        return self.cap.watts * (1 - self.cap.hysteresis)

    def check(self, power_w: float) -> Change | None:
        """The change this power makes, if any."""
        if not self.over and power_w > self.cap.watts:
            self.over = True
            return "crossed"
        if self.over and power_w < self.clear_below:
            self.over = False
            return "cleared"
        return None


def cap_watches(settings: PowerCapSettings, node: str, rack: str | None) -> list[CapWatch]:
    """The caps that apply to `node` (in `rack`, if known)."""
    watches = []
    if settings.node is not None:
        watches.append(CapWatch("node", node, settings.node))
    if rack is not None and rack in settings.racks:
        watches.append(CapWatch("rack", rack, settings.racks[rack]))
    return watches


def cap_notice(watch: CapWatch, change: Change, node: str, power_w: float) -> Notification:
    """The `notify.v1` for on-call about one cap crossed or cleared."""
    cap = watch.cap.watts
    where = f"{node}" if watch.scope == "node" else f"{node} (rack {watch.name})"
    targets = [ObjectRef(kind="Node", name=node)]
    key = f"{TOPIC}/{watch.scope}/{watch.name}/{node}"
    if change == "crossed":
        return Notification(
            severity=Severity.WARNING,
            topic=TOPIC,
            title=f"{where}: power {power_w:.0f} W is over the {watch.scope} cap of {cap:.0f} W",
            body=(
                f"Mean power over the last interval was {power_w:.1f} W; the {watch.scope} cap "
                f"is {cap:.0f} W. A notice follows when it is back under {watch.clear_below:.0f} W."
            ),
            audience="oncall",
            targets=targets,
            dedup_key=key,
            why=f"the {watch.scope} power cap was crossed",
            what_you_can_do=[
                "check the node's workloads (nodeward tail 'energy.pod.>')",
                "lower GPU power limits or move work to another rack",
            ],
        )
    return Notification(
        severity=Severity.INFO,
        topic=TOPIC,
        title=f"{where}: power {power_w:.0f} W is back under the {watch.scope} cap of {cap:.0f} W",
        body=f"Mean power fell below {watch.clear_below:.0f} W (cap {cap:.0f} W less hysteresis).",
        audience="oncall",
        targets=targets,
        dedup_key=key,
        why=f"the {watch.scope} power cap cleared",
    )
