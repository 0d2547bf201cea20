"""The cordon service's policy: which GPU health events lead to which action (YAML)."""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum
from importlib import resources
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from nodeward.yamlfile import load_model
from schemas.gpu import GpuHealth, HealthState, RecommendedAction
from schemas.state.cordon import GpuRecord, first_of_gpu

DEFAULT_POLICY = "policy.yaml"


class PolicyError(ValueError):
    """A policy file that cannot be read or does not validate. One line."""


class PolicyAction(StrEnum):
    QUARANTINE = "quarantine"
    NONE = "none"


class Scope(StrEnum):
    """What a quarantine takes out of service."""

    NODE = "node"
    """The whole node: taint, cordon (today's quarantine)."""
    DEVICE = "device"
    """One DRA device: a DeviceTaintRule; the node and its other GPUs keep serving."""
    GPU = "gpu"
    """One device-plugin GPU below its model's threshold: recorded as excluded, node kept."""


class Match(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    states: list[HealthState] | None = None
    recommended_actions: list[RecommendedAction] | None = None
    reason_codes: list[str] | None = None
    xids: list[int] | None = None

    def matches(self, health: GpuHealth) -> bool:
        if self.states is not None and health.state not in self.states:
            return False
        if self.recommended_actions is not None:
            actions = {health.recommended_action, *(r.action for r in health.reasons)}
            if not actions & set(self.recommended_actions):
                return False
        if self.reason_codes is not None and not any(
            r.code in self.reason_codes for r in health.reasons
        ):
            return False
        return self.xids is None or any(r.xid in self.xids for r in health.reasons)


class Rule(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    when: Match = Match()
    action: PolicyAction
    no_execute: bool = False
    drain: bool = False
    maintenance: bool = Field(
        default=False,
        description="after quarantining, request the node's maintenance (services.checkpoint)",
    )
    whole_node: bool = Field(
        default=False,
        description="always quarantine the node, even where one device could be excluded",
    )


class Decision(BaseModel):
    model_config = ConfigDict(frozen=True)

    rule: str
    action: PolicyAction
    no_execute: bool = False
    drain: bool = False
    maintenance: bool = False
    whole_node: bool = False


class Exclusion(BaseModel):
    """Node or device: how much one failed GPU takes out of service."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    device_taints: bool = Field(
        default=True,
        description="where DRA serves the GPU (a ResourceSlice of one of `drivers` lists it), "
        "taint that device (DeviceTaintRule) instead of the node",
    )
    node_threshold: int = Field(
        default=1,
        ge=1,
        description="device plugin: failed GPUs on a node that quarantine it (1: the first)",
    )
    thresholds: dict[str, int] = Field(
        default_factory=dict,
        description="per GPU model (NVML's name, e.g. 'NVIDIA H100 80GB HBM3'): node_threshold",
    )

    def threshold(self, model: str | None) -> int:
        """The failed GPUs that quarantine a device-plugin node of `model`."""
        return max(self.thresholds.get(model or "", self.node_threshold), 1)

    def scope(self, decision: Decision, *, model: str | None, failed: int, dra: bool) -> Scope:
        """What a quarantine `decision` takes out of service: the DRA device, the node once
        `failed` GPUs (this one included) reach the model's threshold, else the GPU alone."""
        if decision.whole_node:
            return Scope.NODE
        if dra and self.device_taints:
            return Scope.DEVICE
        return Scope.NODE if failed >= self.threshold(model) else Scope.GPU


class Policy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    rules: list[Rule] = Field(min_length=1)
    exclusion: Exclusion = Exclusion()

    def decide(self, health: GpuHealth) -> Decision:
        for rule in self.rules:
            if rule.when.matches(health):
                return Decision(
                    rule=rule.name,
                    action=rule.action,
                    no_execute=rule.no_execute,
                    drain=rule.drain,
                    maintenance=rule.maintenance,
                    whole_node=rule.whole_node,
                )
        return Decision(rule="(no rule matched)", action=PolicyAction.NONE)


def load_policy(path: Path | None = None) -> Policy:
    """The policy at `path`, or the default one shipped with nodeward."""
    shipped = resources.files("services.cordon").joinpath(DEFAULT_POLICY)
    return load_model(Policy, path, shipped=shipped, what="policy", error=PolicyError)


# -- what a GPU's new health means against what was accepted ----------------------


def restates(prior: GpuRecord | None, health: GpuHealth) -> bool:
    """True if `health` is the state already accepted, said again: the same agent boot and
    sequence (a change that a heartbeat past its grace restated first, arriving late)."""
    return (
        prior is not None
        and health.agent_boot_id is not None
        and health.agent_boot_id == prior.boot_id
        and health.sequence == prior.sequence
    )


def is_stale(
    prior: GpuRecord | None, health: GpuHealth, event_id: str, *, skew_s: float = 0.0
) -> bool:
    """True if `health` is older than the event already accepted for this GPU.

    Within one agent boot the sequence decides; across boots (or without sequences) the
    observation time does, within `skew_s` (the bus's `max_clock_skew`): two clocks can
    disagree by that much, so an event of another boot is stale only if it was observed
    more than `skew_s` before the accepted one (within it, the bus's order decides). The
    very event already accepted (a redelivery) and the same state said again (`restates`)
    are not stale.
    """
    if prior is None or prior.event_id == event_id or restates(prior, health):
        return False
    if (
        health.agent_boot_id is not None
        and health.agent_boot_id == prior.boot_id
        and health.sequence != prior.sequence
    ):
        return health.sequence < prior.sequence
    return (prior.observed_at - health.observed_at).total_seconds() > skew_s


def speaks_for(key: str, keys: Iterable[str]) -> bool:
    """True if `key` is the first of `keys` on its physical GPU: the key whose decisions
    are audited; the GPU's other keys join its incident quietly."""
    return first_of_gpu(key, keys) in (key, None)
