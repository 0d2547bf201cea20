"""The cordon service's policy: which GPU health events lead to which action (YAML)."""

from __future__ import annotations

from enum import StrEnum
from importlib import resources
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from nodeward.yamlfile import load_model
from schemas.gpu import GpuHealth, HealthState, RecommendedAction

DEFAULT_POLICY = "policy.yaml"


class PolicyError(ValueError):
    """A policy file that cannot be read or does not validate. One line."""


class PolicyAction(StrEnum):
    QUARANTINE = "quarantine"
    NONE = "none"


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


class Decision(BaseModel):
    model_config = ConfigDict(frozen=True)

    rule: str
    action: PolicyAction
    no_execute: bool = False
    drain: bool = False
    maintenance: bool = False


class Policy(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    rules: list[Rule] = Field(min_length=1)

    def decide(self, health: GpuHealth) -> Decision:
        for rule in self.rules:
            if rule.when.matches(health):
                return Decision(
                    rule=rule.name,
                    action=rule.action,
                    no_execute=rule.no_execute,
                    drain=rule.drain,
                    maintenance=rule.maintenance,
                )
        return Decision(rule="(no rule matched)", action=PolicyAction.NONE)


def load_policy(path: Path | None = None) -> Policy:
    """The policy at `path`, or the default one shipped with nodeward."""
    shipped = resources.files("services.cordon").joinpath(DEFAULT_POLICY)
    return load_model(Policy, path, shipped=shipped, what="policy", error=PolicyError)
