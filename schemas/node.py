"""Findings about a node's tuning: what a node check saw that slows or wastes its GPUs' work."""

from __future__ import annotations

from enum import StrEnum
from typing import ClassVar

from pydantic import Field

from schemas.base import EventData
from schemas.common import K8sName, NonNegFloat
from schemas.examples import example
from schemas.tokens import subject


class FindingState(StrEnum):
    OK = "ok"
    """The check passes (published at start and when a finding clears)."""
    FINDING = "finding"


class NodeFinding(EventData):
    """A node check's result: a finding about the node's tuning, or that it is clear."""

    TYPE: ClassVar[str] = "node.finding.v1"
    STREAM: ClassVar[str] = "NODES"
    # The node token lets a node's NATS user publish only its own node's findings.
    SUBJECT_PATTERN: ClassVar[str] = "node.finding.<node>.<check>"
    EXAMPLE_SOURCE: ClassVar[str] = "agent/energy/gpu-node-07"

    node: K8sName
    check: str = Field(
        min_length=1, max_length=63, pattern=r"^[a-z0-9-]+$", description="e.g. cpufreq"
    )
    state: FindingState
    summary: str = Field(min_length=1, max_length=500, description="one line for on-call")
    problems: list[str] = Field(
        default_factory=list, description="each finding, one line; empty when ok"
    )
    cpus: int = Field(default=0, ge=0, description="CPUs read")
    governors: dict[str, int] = Field(
        default_factory=dict, description="cpufreq governor -> how many CPUs use it"
    )
    expected_governor: str | None = None
    freq_min_khz: NonNegFloat | None = None
    freq_max_khz: NonNegFloat | None = None
    spread_pct: NonNegFloat | None = Field(
        default=None,
        description="(max - min) / max of the CPUs' current frequencies over the check's samples",
    )
    spread_bound_pct: NonNegFloat | None = None

    model_config = example(
        {
            "node": "gpu-node-07",
            "check": "cpufreq",
            "state": "finding",
            "summary": "gpu-node-07: 64 of 64 CPUs use governor powersave, not performance",
            "problems": ["64 of 64 CPUs use governor powersave, not performance"],
            "cpus": 64,
            "governors": {"powersave": 64},
            "expected_governor": "performance",
            "freq_min_khz": 1200000.0,
            "freq_max_khz": 3400000.0,
            "spread_pct": 64.7,
            "spread_bound_pct": 25.0,
        }
    )

    def change_key(self) -> str:
        """What makes a result new: its state, the governors, whether the spread is over
        the bound; not the figures, which move with every check."""
        over = (
            self.spread_pct is not None
            and self.spread_bound_pct is not None
            and self.spread_pct > self.spread_bound_pct
        )
        governors = ",".join(sorted(self.governors))
        return f"{self.state.value}|{governors}|{self.expected_governor}|{over}"

    def nats_subject(self) -> str:
        return subject("node.finding", self.node, self.check)

    def about(self) -> str:
        return f"node/{self.node}"
