"""Scenario files: injections into simulated GPUs on a schedule.

A YAML list of steps, each `after` (time since the scenario started), a `node`, and one
injection as `nodeward sim inject` takes it:

    - {after: 5s, node: gpu-h100-01, gpu: 3, xid: 79}
    - {after: 20s, node: gpu-a100-02, gpu: 0, fault: thermal}
    - {after: 60s, node: gpu-h100-01, gpu: 3, recover: true}
    - {after: 5s, node: gpu-a100-01, gpu: 0, load: 95}   # utilisation %; power follows
    - {after: 90s, node: gpu-h100-02, gpu: 1, xid: 48, via: kmsg}  # the kernel log only
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from nodeward.durations import Duration
from nodeward.yamlfile import first_error, read_yaml
from sim.inject import InjectReply, InjectRequest, request_injection


class ScenarioError(ValueError):
    """A scenario file that cannot be read or does not validate. `str()` is one line."""


class Step(BaseModel):
    model_config = ConfigDict(extra="forbid")

    after: Duration = timedelta(0)
    node: str
    gpu: int
    xid: int | None = None
    fault: str | None = None
    recover: bool = False
    recovery_action: int | None = None
    load: float | None = None
    via: Literal["nvml", "kmsg", "both"] = "nvml"
    driver: str = "r550"

    def request(self) -> InjectRequest:
        """The step's injection (its fields but when and where), validated as one."""
        return InjectRequest.model_validate(self.model_dump(exclude={"after", "node"}))


def load_scenario(path: Path) -> list[Step]:
    """The steps of a scenario file, in time order; each injection is validated here."""
    raw = read_yaml(path, what="scenario", error=ScenarioError, empty=[])
    try:
        steps = TypeAdapter(list[Step]).validate_python(raw)
    except ValidationError as exc:
        raise ScenarioError(f"scenario {path}: {first_error(exc)}") from None
    for i, step in enumerate(steps):
        try:
            step.request()
        except ValidationError as exc:
            raise ScenarioError(f"scenario {path}: {i}: {first_error(exc)}") from None
    return sorted(steps, key=lambda s: s.after)


async def play(
    nc: Any,
    steps: list[Step],
    *,
    on_reply: Callable[[Step, InjectReply | None, str | None], None] = lambda *_: None,
    timeout: float = 2.0,
) -> None:
    """Send each step at its time; `on_reply(step, reply, error)` after each."""
    loop = asyncio.get_running_loop()
    began = loop.time()
    for step in steps:
        delay = began + step.after.total_seconds() - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)  # the schedule itself, not a synchronisation
        try:
            reply = await request_injection(nc, step.node, step.request(), timeout=timeout)
        except Exception as exc:  # noqa: BLE001 - reported per step; the scenario goes on
            on_reply(step, None, f"{type(exc).__name__}: {exc}")
        else:
            on_reply(step, reply, None)
