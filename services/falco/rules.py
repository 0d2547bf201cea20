"""The Falco response policy: which alerts get which actions (`services/falco/rules.yaml`).

Rules are tried top to bottom. A rule matches an alert when every field of its `match`
holds (an empty `match` matches every alert):

- `rules`: Falco rule names, exactly; any one of them.
- `priority`: `Critical` (exactly), or a comparison `>=Warning`, `>Notice`, `<=Error`,
  `<Critical`, `=Notice`. Higher means more severe (Emergency is the highest, Debug the lowest).
- `tags`: a list of tag sets; the alert must carry every tag of at least one set. A set is
  a list or a comma-separated string: `[[container, shell], "network, process"]`.
- `source`: Falco sources (`syscall`, `k8s_audit`, ...); any one of them.
- `output_fields`: a list of conditions like `k8s.ns.name=user-alice, proc.name!=bash`;
  every condition of one entry must hold, any one entry will do. Values compare as strings;
  a null field equals the empty string.
- `pod`: `true` only alerts about a pod (`k8s.pod.name` set), `false` only node-level ones.

**`continue`, plainly.** The first rule that matches decides, and no later rule is looked
at, unless that rule says `continue: true`: then the next matching rule's actions run too.
Within a rule, actions run in the order written. An action's own `continue` (default
`true`) says whether the rule's remaining actions still run when this one did not succeed
(it failed, or a guard refused or skipped it): `false` stops them, and each is audited as
skipped. Put `checkpoint` with `continue: false` before `terminate` to keep the evidence
when the checkpoint fails. A rule that terminates must checkpoint first.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from importlib.resources import files
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from nodeward.yamlfile import load_model
from schemas.falco import FalcoAlert, FalcoPriority


class RulesError(ValueError):
    """The rules file cannot be used; one line naming the file and the problem."""


class ActionKind(StrEnum):
    NOTIFY = "notify"
    LABEL = "label"
    ANNOTATE = "annotate"
    ISOLATE = "isolate"
    CHECKPOINT = "checkpoint"
    TERMINATE = "terminate"
    CORDON = "cordon"


POD_ACTIONS = frozenset(
    {
        ActionKind.LABEL,
        ActionKind.ANNOTATE,
        ActionKind.ISOLATE,
        ActionKind.CHECKPOINT,
        ActionKind.TERMINATE,
    }
)
"""Actions on the alert's pod: skipped for an alert without one."""

_COMPARISON = re.compile(r"^\s*(>=|<=|>|<|=)?\s*([A-Za-z]+)\s*$")
_LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass(frozen=True)
class PriorityTest:
    """`op` and the priority it compares with; more severe is greater."""

    op: str
    priority: FalcoPriority

    @classmethod
    def parse(cls, text: str) -> PriorityTest:
        found = _COMPARISON.match(text)
        if found is None:
            raise ValueError(f"priority {text!r} is not like 'Critical' or '>=Warning'")
        op, name = found.group(1) or "=", found.group(2)
        try:
            priority = FalcoPriority.parse(name)
        except ValueError:
            known = ", ".join(p.value for p in FalcoPriority)
            raise ValueError(f"unknown Falco priority {name!r} (known: {known})") from None
        return cls(op, priority)

    def holds(self, priority: FalcoPriority) -> bool:
        # rank: 0 is Emergency; a smaller rank is more severe.
        a, b = -priority.rank, -self.priority.rank
        return {
            "=": a == b,
            ">": a > b,
            ">=": a >= b,
            "<": a < b,
            "<=": a <= b,
        }[self.op]


@dataclass(frozen=True)
class FieldTest:
    key: str
    value: str
    equal: bool

    def holds(self, fields: dict[str, Any]) -> bool:
        raw = fields.get(self.key)
        text = "" if raw is None else str(raw)
        return (text == self.value) == self.equal


def _field_tests(entry: str) -> tuple[FieldTest, ...]:
    tests = []
    for raw in entry.split(","):
        part = raw.strip()
        if not part:
            continue
        if "!=" in part:
            key, _, value = part.partition("!=")
            equal = False
        elif "=" in part:
            key, _, value = part.partition("=")
            equal = True
        else:
            raise ValueError(f"output_fields condition {part!r} is not 'key=value' or 'key!=value'")
        if not key.strip():
            raise ValueError(f"output_fields condition {part!r} has no field name")
        tests.append(FieldTest(key.strip(), value.strip(), equal))
    if not tests:
        raise ValueError("an output_fields entry is empty")
    return tuple(tests)


class Match(_Strict):
    rules: list[str] = Field(default_factory=list)
    priority: str | None = None
    tags: list[list[str] | str] = Field(default_factory=list)
    source: list[str] | str = Field(default_factory=list)
    output_fields: list[str] = Field(default_factory=list)
    pod: bool | None = None

    @field_validator("priority")
    @classmethod
    def _priority(cls, value: str | None) -> str | None:
        if value is not None:
            PriorityTest.parse(value)
        return value

    @field_validator("output_fields")
    @classmethod
    def _fields(cls, value: list[str]) -> list[str]:
        for entry in value:
            _field_tests(entry)
        return value

    def compiled(self) -> CompiledMatch:
        tag_sets = tuple(
            frozenset(t.strip() for t in (s.split(",") if isinstance(s, str) else s) if t.strip())
            for s in self.tags
        )
        sources = (
            frozenset([self.source]) if isinstance(self.source, str) else frozenset(self.source)
        )
        return CompiledMatch(
            rules=frozenset(self.rules),
            priority=PriorityTest.parse(self.priority) if self.priority else None,
            tag_sets=tag_sets,
            sources=sources,
            fields=tuple(_field_tests(e) for e in self.output_fields),
            pod=self.pod,
        )


@dataclass(frozen=True)
class CompiledMatch:
    rules: frozenset[str]
    priority: PriorityTest | None
    tag_sets: tuple[frozenset[str], ...]
    sources: frozenset[str]
    fields: tuple[tuple[FieldTest, ...], ...]
    pod: bool | None

    def holds(self, alert: FalcoAlert) -> bool:
        if self.rules and alert.rule not in self.rules:
            return False
        if self.priority is not None and not self.priority.holds(alert.priority):
            return False
        if self.sources and alert.source not in self.sources:
            return False
        if self.pod is not None and (alert.output_fields.get("k8s.pod.name") is not None) != (
            self.pod
        ):
            return False
        if self.tag_sets:
            tags = set(alert.tags)
            if not any(s <= tags for s in self.tag_sets):
                return False
        return not self.fields or any(
            all(t.holds(alert.output_fields) for t in entry) for entry in self.fields
        )


class ActionSpec(_Strict):
    """One action of a rule. `with` holds the action's parameters."""

    action: ActionKind
    continue_: bool = Field(default=True, alias="continue")
    params: dict[str, Any] = Field(default_factory=dict, alias="with")

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @model_validator(mode="after")
    def _check_params(self) -> ActionSpec:
        allowed = {
            ActionKind.NOTIFY: {"owner", "oncall"},
            ActionKind.LABEL: {"labels"},
            ActionKind.ANNOTATE: {"annotations"},
            ActionKind.ISOLATE: set(),
            ActionKind.CHECKPOINT: {"timeout"},
            ActionKind.TERMINATE: {"grace_period_seconds"},
            ActionKind.CORDON: {"taint", "effect", "cordon"},
        }[self.action]
        unknown = sorted(set(self.params) - allowed)
        if unknown:
            known = ", ".join(sorted(allowed)) or "none"
            raise ValueError(
                f"{self.action.value} takes no parameter(s) {', '.join(unknown)} (known: {known})"
            )
        if self.action == ActionKind.LABEL:
            labels = self.params.get("labels")
            if not isinstance(labels, dict) or not labels:
                raise ValueError("label needs `with: {labels: {key: value}}`")
            for key in labels:
                if not _LABEL_KEY.match(str(key)):
                    raise ValueError(f"label key {key!r} is not a valid Kubernetes label key")
        if self.action == ActionKind.ANNOTATE:
            notes = self.params.get("annotations")
            if not isinstance(notes, dict) or not notes:
                raise ValueError("annotate needs `with: {annotations: {key: value}}`")
        if self.action == ActionKind.TERMINATE:
            grace = self.params.get("grace_period_seconds", 30)
            if not isinstance(grace, int) or grace < 0:
                raise ValueError("terminate: grace_period_seconds must be a whole number >= 0")
        if self.action == ActionKind.CORDON:
            effect = self.params.get("effect", "NoSchedule")
            if effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute"):
                raise ValueError(f"cordon: effect {effect!r} is not a taint effect")
        return self


class Rule(_Strict):
    name: str = Field(min_length=1)
    match: Match = Field(default_factory=Match)
    actions: list[ActionSpec] = Field(min_length=1)
    continue_: bool = Field(default=False, alias="continue")
    dry_run: bool = Field(default=False, description="audit what would be done, do nothing")

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @model_validator(mode="after")
    def _checkpoint_first(self) -> Rule:
        kinds = [a.action for a in self.actions]
        if ActionKind.TERMINATE in kinds:
            first_terminate = kinds.index(ActionKind.TERMINATE)
            if ActionKind.CHECKPOINT not in kinds[:first_terminate]:
                raise ValueError(
                    f"rule {self.name}: terminate must come after a checkpoint (the evidence "
                    f"goes with the pod)"
                )
        return self


class RuleSet(_Strict):
    rules: list[Rule] = Field(default_factory=list)

    @model_validator(mode="after")
    def _unique(self) -> RuleSet:
        names = [r.name for r in self.rules]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"rule names must be unique: {', '.join(dupes)}")
        return self


@dataclass(frozen=True)
class Policy:
    """The compiled rules, in order."""

    rules: tuple[tuple[Rule, CompiledMatch], ...]

    @classmethod
    def of(cls, rules: Sequence[Rule]) -> Policy:
        return cls(tuple((r, r.match.compiled()) for r in rules))

    def select(self, alert: FalcoAlert) -> list[Rule]:
        """The rules whose actions run for `alert`, in order (empty: nothing to do)."""
        chosen: list[Rule] = []
        for rule, match in self.rules:
            if match.holds(alert):
                chosen.append(rule)
                if not rule.continue_:
                    break
        return chosen


def load_policy(path: Path | None = None) -> Policy:
    """The rules at `path`, or the shipped default (`services/falco/rules.yaml`)."""
    ruleset = load_model(
        RuleSet,
        path,
        shipped=files("services.falco").joinpath("rules.yaml"),
        what="falco rules",
        error=RulesError,
    )
    return Policy.of(ruleset.rules)
