"""Findings about a node: what a node check saw that slows or wastes its GPUs' work
(`NodeFinding`), and whether the node answers at all (`NodeHealth`)."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import ClassVar

from pydantic import Field

from schemas.base import EventData, Model
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


class Unresponsiveness(StrEnum):
    """Why a node is judged unresponsive."""

    NOT_READY = "not-ready"
    """its `Ready` condition `False` or `Unknown` (the kubelet stopped posting) too long"""
    CONDITION = "condition"
    """a condition another detector sets (node-problem-detector's `KernelDeadlock`, ...)
    `True` too long"""
    AGENTS_SILENT = "agents-silent"
    """none of its node agents heard past their heartbeat timeout"""


class NodeCause(Model):
    """One reason a node is unresponsive."""

    kind: Unresponsiveness
    condition: str | None = Field(default=None, description="the node condition's type")
    status: str | None = Field(default=None, description="the condition's status")
    reason: str | None = Field(default=None, max_length=256)
    message: str | None = Field(default=None, max_length=1024)
    since: datetime = Field(description="since when (the condition's transition, the last heard)")

    def line(self) -> str:
        if self.kind == Unresponsiveness.AGENTS_SILENT:
            return f"agents silent since {self.since:%H:%M:%S}"
        said = f" ({self.reason}: {self.message})" if self.reason or self.message else ""
        return f"{self.condition}={self.status} since {self.since:%H:%M:%S}{said}"


class NodeHealth(EventData):
    """Whether a node answers, as services.recovery's detector judges it.

    Published when a node turns unresponsive (a cause held past its duration) and when it
    answers again."""

    TYPE: ClassVar[str] = "node.health.v1"
    STREAM: ClassVar[str] = "NODES"
    SUBJECT_PATTERN: ClassVar[str] = "node.health.<node>"
    EXAMPLE_SOURCE: ClassVar[str] = "service/recovery"

    node: K8sName
    responsive: bool
    causes: list[NodeCause] = Field(default_factory=list, description="empty when responsive")
    since: datetime = Field(description="when it turned (un)responsive: its earliest cause")
    summary: str = Field(min_length=1, max_length=1024, description="one line for on-call")

    model_config = example(
        {
            "node": "gpu-node-07",
            "responsive": False,
            "causes": [
                {
                    "kind": "not-ready",
                    "condition": "Ready",
                    "status": "Unknown",
                    "reason": "NodeStatusUnknown",
                    "message": "Kubelet stopped posting node status.",
                    "since": "2026-08-20T14:05:00Z",
                }
            ],
            "since": "2026-08-20T14:05:00Z",
            "summary": "gpu-node-07 unresponsive: Ready=Unknown since 14:05:00 "
            "(NodeStatusUnknown: Kubelet stopped posting node status.)",
        }
    )

    def nats_subject(self) -> str:
        return subject("node.health", self.node)

    def concern(self) -> str:
        return "info" if self.responsive else "critical"

    def about(self) -> str:
        return f"node/{self.node}"
