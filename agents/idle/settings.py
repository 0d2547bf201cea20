"""`agents.idle` in the config file: which pods are sessions, and what counts as activity."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Literal

from pydantic import Field

from agents.sources.jupyter import JupyterSettings
from nodeward.config import Section
from nodeward.durations import Duration
from schemas.session import SessionKind


class IdleSettings(Section):
    """The idleness agent. Env overrides: `NODEWARD_AGENTS__IDLE__<KEY>`."""

    node: str | None = None
    """None: $NODE_NAME, else the hostname"""
    interval: Duration = timedelta(seconds=30)
    """how often each session's evidence is judged and session.activity published"""
    gpu_sample_every: Duration = timedelta(seconds=5)
    """GPU utilisation is read this often; the interval's maximum is judged"""
    idle_after: Duration = timedelta(seconds=30)
    """a session idle on every signal this long is reported (session.idle), then again every
    interval while it stays idle; the culler decides what to do"""
    gpu_floor_pct: float = Field(
        default=5.0, ge=0, le=100, description="GPU utilisation above this is activity"
    )
    cpu_floor_cores: float = Field(
        default=0.1, ge=0, description="CPU use above this many cores is activity"
    )
    unmeasurable_gpu: Literal["ignore", "unknown"] = "ignore"
    """a GPU whose utilisation cannot be read (MIG without GPM): `ignore` judges the session on its
    CPU and kernels; `unknown` never reports such a session idle"""
    selectors: dict[SessionKind, str] = Field(
        default_factory=lambda: {
            SessionKind.NOTEBOOK: "notebook-name",
            SessionKind.SSH: "nodeward.io/session=ssh",
        },
        description="label selector of each kind of session pod; notebooks' Jupyter "
        "kernels are read too",
    )
    cgroup_root: Path = Path("/sys/fs/cgroup")
    pod_resources_socket: Path = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
    jupyter: JupyterSettings = Field(
        default_factory=JupyterSettings, description="how notebooks' Jupyter servers are read"
    )
