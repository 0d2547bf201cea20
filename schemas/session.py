"""Session activity samples and idleness of interactive pods (notebooks, SSH sessions)."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import ClassVar

from pydantic import Field

from schemas.base import Model
from schemas.common import PodEventData
from schemas.examples import alice_notebook, example


class SessionKind(StrEnum):
    NOTEBOOK = "notebook"
    SSH = "ssh"
    JOB = "job"
    OTHER = "other"


class ActivityState(StrEnum):
    ACTIVE = "active"
    IDLE = "idle"
    UNKNOWN = "unknown"
    """A signal that could not be read: never taken for idleness."""


class KernelActivity(Model):
    id: str
    name: str | None = None
    execution_state: str = Field(description="idle, busy, starting, dead (Jupyter's states)")
    last_activity: datetime | None = None
    connections: int = Field(default=0, ge=0)


class _SessionEvent(PodEventData):
    """What every event about a session says first: which pod, where, and what kind (the
    idleness agent's, on stream SESSIONS)."""

    STREAM: ClassVar[str] = "SESSIONS"
    EXAMPLE_SOURCE: ClassVar[str] = "agent/idle/gpu-node-07"

    kind: SessionKind
    uid: str | None = Field(default=None, description="the pod's UID")


class SessionActivity(_SessionEvent):
    """One sample of a session's GPU, CPU and kernel activity."""

    TYPE: ClassVar[str] = "session.activity.v1"
    OBSERVED: ClassVar[tuple[str, ...]] = ("sampled_at",)
    SUBJECT_PATTERN: ClassVar[str] = "session.activity.<node>.<ns>.<pod>"

    state: ActivityState = Field(
        default=ActivityState.UNKNOWN,
        description="active if any signal is active; idle only if every signal is measured idle",
    )
    idle_since: datetime | None = Field(default=None, description="set when state is idle")
    unknown: list[str] = Field(
        default_factory=list, description="signals that could not be read, each with why"
    )
    gpu_utilization_pct: float | None = Field(default=None, ge=0, le=100)
    gpu_uuids: list[str] = Field(default_factory=list)
    cpu_cores: float | None = Field(
        default=None, ge=0, description="CPU cores used over the sample"
    )
    kernels: list[KernelActivity] = Field(default_factory=list)
    last_activity: datetime | None = None
    sampled_at: datetime

    model_config = example(
        {
            **alice_notebook(),
            "kind": "notebook",
            "uid": "3f2a1b4c-5d6e-4f70-8a9b-0c1d2e3f4a5b",
            "state": "idle",
            "idle_since": "2026-08-20T11:59:00Z",
            "gpu_utilization_pct": 0.0,
            "gpu_uuids": ["GPU-5d3c1b2a-8f4e-4a7b-9c6d-0e1f2a3b4c5d"],
            "cpu_cores": 0.02,
            "kernels": [
                {
                    "id": "9f8e7d6c-5b4a-3210-fedc-ba9876543210",
                    "name": "python3",
                    "execution_state": "idle",
                    "last_activity": "2026-08-20T11:58:02Z",
                    "connections": 0,
                }
            ],
            "last_activity": "2026-08-20T11:58:02Z",
            "sampled_at": "2026-08-20T14:02:00Z",
        }
    )


class IdleEvidence(Model):
    signal: str = Field(description="gpu, cpu or kernel")
    idle_since: datetime
    detail: str = ""


class SessionIdle(_SessionEvent):
    """A session that has been idle on every signal, with how long and the evidence."""

    TYPE: ClassVar[str] = "session.idle.v1"
    SUBJECT_PATTERN: ClassVar[str] = "session.idle.<node>.<ns>.<pod>"

    idle_since: datetime
    idle_for_s: float = Field(ge=0)
    evidence: list[IdleEvidence]
    gpus_held: int = Field(default=0, ge=0)

    model_config = example(
        {
            **alice_notebook(),
            "kind": "notebook",
            "idle_since": "2026-08-20T11:58:02Z",
            "idle_for_s": 7438.0,
            "evidence": [
                {
                    "signal": "gpu",
                    "idle_since": "2026-08-20T11:58:30Z",
                    "detail": "0% SM for 2h03m",
                },
                {
                    "signal": "cpu",
                    "idle_since": "2026-08-20T11:59:00Z",
                    "detail": "<0.05 cores",
                },
                {
                    "signal": "kernel",
                    "idle_since": "2026-08-20T11:58:02Z",
                    "detail": "1 kernel idle, 0 connections",
                },
            ],
            "gpus_held": 1,
        }
    )
