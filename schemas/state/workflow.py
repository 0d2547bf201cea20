"""The durable workflow engine's part of a workflow's record (`services.kernel.workflow`):
shared by every service whose record the engine drives (maintenance, recovery)."""

from __future__ import annotations

from pydantic import Field

from schemas.base import Model


class FlowState(Model):
    """Where the engine stands with the current step. A record written before the engine
    (an older release) has none: it loads as a fresh state, and the workflow resumes at the
    step the record names."""

    entered_at: float | None = Field(default=None, description="when the current step began")
    attempts: int = Field(default=0, description="failed runs of the current step")
    not_before: float | None = Field(default=None, description="the next try after a failure")
    error: str | None = Field(default=None, description="the current step's last failure")
    cursor: dict[str, list[str]] = Field(
        default_factory=dict, description="per step: the items `each` has done"
    )
    cancel_requested: str | None = Field(default=None, description="who cancelled it")
