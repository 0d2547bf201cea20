"""`services.falco` in the config file."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from pydantic import Field

from nodeward.bus.lanes import lanes
from nodeward.durations import Duration
from nodeward.handlers import Consuming
from schemas.falco import FalcoAlert, FalcoPriority
from schemas.state.dedup import FALCO
from schemas.state.marks import FALCO_MARKS
from services.falco.ingest import IngestSettings
from services.kernel import ActingSettings, BreakerSettings, RateLimitSettings, TallySettings
from services.kernel.control import ControlSettings

NAME = "falco"
ACTOR = "service/falco"
TOPIC = "security"


class FalcoSettings(ActingSettings, Consuming):
    """`services.falco` in the config file."""

    subjects: list[str] = Field(default_factory=lambda: ["falco.>"], min_length=1)
    urgent_from: FalcoPriority = FalcoPriority.WARNING
    """alerts of this priority and above have a consumer of their own (`<consumer>-urgent`): never
    queued behind a flood of lower ones"""
    tally_below: FalcoPriority | None = FalcoPriority.WARNING
    """an alert below this priority whose action only tells (notify) is audited and told in full
    once per Falco rule, node and `tally.window`; the rest are counted and audited as one record
    when the window closes (None: each one in full)"""
    tally: TallySettings = TallySettings()
    bucket: str = FALCO.name
    """KV bucket of the duplicate window"""
    marks_bucket: str = FALCO_MARKS.name
    """what the cordon action put on each node and the prior state (NodeMarks)"""
    breaker: BreakerSettings = Field(
        default_factory=BreakerSettings,
        description="the circuit breaker shared with GPU quarantine: guards the cordon action",
    )
    ack_wait: Duration = timedelta(seconds=90)
    """an alert held by a crashed replica is redelivered after this long"""
    concurrency: int = Field(default=16, ge=1)
    rules_file: Path | None = None
    """None: the shipped default"""
    dedup_window: Duration = timedelta(minutes=10)
    """identical alerts within this window are acted on once"""
    rate_limit_per_pod: RateLimitSettings = RateLimitSettings(per_minute=10, burst=10)
    rate_limit_per_rule: RateLimitSettings = RateLimitSettings(per_minute=60, burst=30)
    skip_namespaces: list[str] = Field(
        default_factory=lambda: ["kube-system", "nodeward"],
        description="pods here are never acted on (alerts about them only notify)",
    )
    checkpoint_timeout: Duration = timedelta(seconds=60)
    isolation_check_interval: Duration = timedelta(seconds=5)
    """how often the recorded isolations are checked against the API (one read per isolated pod): a
    pod gone, replaced or unlabelled is no longer isolated"""
    support_contact: str = "the platform's security team"
    topic: str = Field(default=TOPIC, min_length=1, description="the notices' topic")
    ingest: IngestSettings = IngestSettings()
    controls: ControlSettings = ControlSettings()

    def urgent(self, alert: FalcoAlert) -> bool:
        """Of the urgent lane's priorities: never queued behind, nor refused for, others."""
        return alert.priority.rank <= self.urgent_from.rank

    def tallied(self, alert: FalcoAlert) -> bool:
        """Below `tally_below`: what only tells about it is counted per rule and node."""
        return self.tally_below is not None and alert.priority.rank > self.tally_below.rank

    def lanes(self) -> list[tuple[str, list[str]]]:
        """The consumers, (durable name, subjects): `urgent_from` and above on
        `<consumer>-urgent`, the rest on `<consumer>` (one consumer when the subjects'
        priorities cannot be told apart)."""
        levels = [p.value.lower() for p in FalcoPriority]
        cut = self.urgent_from.rank + 1
        return lanes(
            self.consumer or NAME,
            self.subjects,
            prefix="falco",
            urgent=levels[:cut],
            other=levels[cut:],
        )
