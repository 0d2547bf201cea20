"""The cardinality budget: how many series each metric family may take, per node and in all,
and the bound that keeps each of its labels finite (`budget.yaml`, docs/cardinality.md).

`load()` reads the budget; `count(scrapes)` tallies the series of a set of `/metrics`
expositions per family and component; `violations(budget, counts, nodes)` says, one line
each, what exceeds the budget at `nodes` GPU nodes: a family over its limit, a family or a
component the budget does not name, a label it does not allow, a value outside a label's
bound.

A limit is `fixed + per_node * the nodes a daemon covers`. An agent (a component of scope
`node`, one daemon per node) covers its own node: its limit is checked on each of its
daemons, and the fleet's total is that times the nodes. A service (scope `fleet`) covers
every node: its limit, at `nodes`, is checked on all its daemons together.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import Literal

import yaml
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families as text_families
from pydantic import BaseModel, ConfigDict, Field, model_validator

BUDGET_FILE = "budget.yaml"
EVERY = "*"
"""A family's limit for every component it does not name (the runtime's own families)."""
AGENT = re.compile(r"^(agent-[a-z0-9]+)-.+$")
"""A node agent's daemon, `agent-<kind>-<node>`: its component is `agent-<kind>`."""
_CREATED_OF = ("counter", "histogram", "summary", "gaugehistogram")
"""The types whose series prometheus_client pairs with a `_created` one."""
_NOT_LABELS = frozenset({"le", "quantile"})
"""A histogram's bucket and a summary's quantile: part of the family's own shape."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Label(_Model):
    """Why a label takes finitely many values; `values` or `pattern`, where given, checked."""

    bound: str = Field(min_length=1)
    values: tuple[str, ...] | None = None
    """The closed set it takes its values from."""
    pattern: str | None = None
    """A regular expression each value matches whole."""

    def outside(self, value: str) -> bool:
        """Whether `value` breaks the bound's checkable part."""
        if self.values is not None and value not in self.values:
            return True
        return self.pattern is not None and re.fullmatch(self.pattern, value) is None

    def says(self) -> str:
        if self.values is not None:
            return "one of " + ", ".join(repr(v) for v in self.values)
        return f"matching {self.pattern!r}"


class Limit(_Model):
    """Series a component may expose of a family: `fixed + per_node * nodes covered`."""

    fixed: int = Field(default=0, ge=0)
    per_node: int = Field(default=0, ge=0)

    def at(self, nodes: int) -> int:
        return self.fixed + self.per_node * nodes

    def says(self) -> str:
        parts = [f"{self.fixed:,}"] if self.fixed else []
        parts += [f"{self.per_node:,} per node"] if self.per_node else []
        return " + ".join(parts) or "0"


class Component(_Model):
    """A kind of daemon: an agent runs on each node, a service once for the fleet."""

    scope: Literal["node", "fleet"]
    deployed: bool = True
    """False: only `nodeward up` runs it (a simulator, or `up`'s own daemon)."""
    what: str = ""


class Family(_Model):
    """A metric family: what it says, each component's limit, each label's bound."""

    what: str = Field(min_length=1)
    limits: dict[str, Limit] = Field(min_length=1)
    """Component (or `*`: any other) -> its limit."""
    labels: dict[str, Label] = Field(default_factory=dict)

    def limit(self, component: str) -> Limit | None:
        return self.limits.get(component, self.limits.get(EVERY))


class Budget(_Model):
    """The whole budget (`budget.yaml`)."""

    forbidden_labels: tuple[str, ...]
    """Label names no family may have: they take unbounded values (ids, free text)."""
    assumptions: dict[str, str] = Field(default_factory=dict)
    """What the limits assume of a deployment (GPUs per node, pods, tenants, ...)."""
    components: dict[str, Component]
    families: dict[str, Family]

    @model_validator(mode="after")
    def _consistent(self) -> Budget:
        for name, family in self.families.items():
            unknown = set(family.limits) - set(self.components) - {EVERY}
            if unknown:
                raise ValueError(f"{name}: limits for unknown components {sorted(unknown)}")
            banned = set(family.labels) & set(self.forbidden_labels)
            if banned:
                raise ValueError(f"{name}: labels {sorted(banned)} are forbidden (unbounded)")
            for label, bound in family.labels.items():
                if bound.pattern is not None:
                    try:
                        re.compile(bound.pattern)
                    except re.error as exc:
                        raise ValueError(f"{name}: label {label}: bad pattern: {exc}") from exc
        return self

    def limit(self, family: str, component: str, nodes: int) -> int | None:
        """The series `component`'s daemons may expose of `family` at `nodes` GPU nodes, all
        together (None: the budget names neither)."""
        found = self.families.get(family)
        limit = found.limit(component) if found is not None else None
        kind = self.components.get(component)
        if limit is None or kind is None:
            return None
        return limit.at(nodes) if kind.scope == "fleet" else limit.at(1) * nodes


def load(text: str | None = None) -> Budget:
    """The budget: `text` (YAML), or the committed `budget.yaml` beside this module."""
    if text is None:
        committed = resources.files(__package__ or "launch.observability") / BUDGET_FILE
        text = committed.read_text(encoding="utf-8")
    return Budget.model_validate(yaml.safe_load(text))


# -- counting -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Tally:
    """One family as one component's daemons expose it."""

    type: str
    """counter, gauge, histogram, ..."""
    series: int
    """Series of all its daemons together, `_created` ones left out."""
    created: int
    """The `_created` series prometheus_client pairs with them, one per counter series and
    per histogram or summary (by its labels), whether served or not."""
    created_served: int
    """Those of them the expositions hold (0: the runtime serves none, `nodeward.metrics`)."""
    daemons: int
    """Its daemons that expose the family (with no series too: declared, not yet set)."""
    largest: int
    """The most series one daemon exposes."""
    labels: Mapping[str, frozenset[str]]
    """Each label's values seen."""


@dataclass(frozen=True)
class Counts:
    """Series per family and component, from one scrape of each daemon."""

    families: Mapping[str, Mapping[str, Tally]]
    """Family -> component -> its tally."""
    daemons: Mapping[str, int]
    """Component -> its daemons scraped."""

    def series(self, *, created: bool = False) -> int:
        """Every series (with the `_created` ones, if `created`)."""
        return sum(
            t.series + (t.created if created else 0)
            for by in self.families.values()
            for t in by.values()
        )

    def created_served(self) -> int:
        """The `_created` series the expositions hold."""
        return sum(t.created_served for by in self.families.values() for t in by.values())


def component_of(daemon: str) -> str:
    """The component of a daemon named as in `endpoints.json`: agents grouped by kind."""
    match = AGENT.match(daemon)
    return match.group(1) if match else daemon


@dataclass
class _Seen:
    type: str = "unknown"
    series: int = 0
    created_served: int = 0
    children: set[tuple[tuple[str, str], ...]] = field(default_factory=set)
    """Its label sets, a histogram's buckets or a summary's quantiles folded into one."""
    labels: dict[str, set[str]] = field(default_factory=dict)

    @property
    def created(self) -> int:
        return len(self.children) if self.type in _CREATED_OF else 0


def _parse(text: str) -> list[Metric]:
    openmetrics = text.rstrip().endswith("# EOF")
    parsed = openmetrics_families(text) if openmetrics else text_families(text)  # type: ignore[no-untyped-call]
    return list(parsed)


def _family_name(metric: Metric) -> str:
    """As exposed, without `_bucket`, `_sum`, `_count`: a counter's with its `_total`."""
    return f"{metric.name}_total" if metric.type == "counter" else metric.name


def tally(text: str) -> dict[str, _Seen]:
    """One exposition's series per family (text format 0.0.4 or OpenMetrics)."""
    metrics = _parse(text)
    types = {m.name: m.type for m in metrics}
    names = {m.name: _family_name(m) for m in metrics}
    out: dict[str, _Seen] = {}
    for metric in metrics:
        base = metric.name.removesuffix("_created")
        if base != metric.name and types.get(base) in _CREATED_OF:
            # the text format's `_created` samples: a gauge family of their own
            out.setdefault(names[base], _Seen()).created_served += len(metric.samples)
            continue
        seen = out.setdefault(names[metric.name], _Seen())
        seen.type = metric.type
        created = f"{metric.name}_created"
        for sample in metric.samples:
            if sample.name == created:
                seen.created_served += 1
                continue
            seen.series += 1
            labels = {k: v for k, v in sample.labels.items() if k not in _NOT_LABELS}
            seen.children.add(tuple(sorted(labels.items())))
            for label, value in labels.items():
                seen.labels.setdefault(label, set()).add(value)
    return out


def count(scrapes: Mapping[str, str]) -> Counts:
    """Series per family and component, from each daemon's name (as in `endpoints.json`:
    `agent-<kind>-<node>` for a node's agent) to its `/metrics` exposition."""
    daemons: dict[str, int] = {}
    families: dict[str, dict[str, list[_Seen]]] = {}
    for daemon, text in scrapes.items():
        component = component_of(daemon)
        daemons[component] = daemons.get(component, 0) + 1
        for family, seen in tally(text).items():
            families.setdefault(family, {}).setdefault(component, []).append(seen)
    return Counts(
        families={
            family: {c: _merged(seen) for c, seen in sorted(by.items())}
            for family, by in sorted(families.items())
        },
        daemons=dict(sorted(daemons.items())),
    )


def _merged(seen: Iterable[_Seen]) -> Tally:
    seen = list(seen)
    labels: dict[str, set[str]] = {}
    for one in seen:
        for label, values in one.labels.items():
            labels.setdefault(label, set()).update(values)
    return Tally(
        type=next((s.type for s in seen if s.type != "unknown"), "unknown"),
        series=sum(s.series for s in seen),
        created=sum(s.created for s in seen),
        created_served=sum(s.created_served for s in seen),
        daemons=len(seen),
        largest=max((s.series for s in seen), default=0),
        labels={label: frozenset(values) for label, values in sorted(labels.items())},
    )


# -- checking -----------------------------------------------------------------------------


def violations(budget: Budget, counts: Counts, nodes: int) -> list[str]:
    """What `counts` breaks of `budget` at `nodes` GPU nodes, one line each (none: within)."""
    lines = [
        f"{component}: no such component in the budget ({BUDGET_FILE} components); "
        f"{n} daemon(s) scraped"
        for component, n in counts.daemons.items()
        if component not in budget.components
    ]
    for name, by in counts.families.items():
        family = budget.families.get(name)
        if family is None:
            exposed = ", ".join(f"{c} ({t.series:,} series)" for c, t in by.items())
            lines.append(f"{name}: not in the budget ({BUDGET_FILE}); exposed by {exposed}")
            continue
        for component, seen in by.items():
            lines += _family_violations(budget, name, family, component, seen, nodes)
    return lines


def _family_violations(  # noqa: PLR0917 - one family of one component, checked
    budget: Budget, name: str, family: Family, component: str, seen: Tally, nodes: int
) -> list[str]:
    where = f"{name} ({component})"
    limit = family.limit(component)
    kind = budget.components.get(component)
    lines = []
    if limit is None:
        lines.append(f"{where}: the budget gives {component} no limit for this family")
    elif kind is not None and kind.scope == "node" and seen.largest > limit.at(1):
        lines.append(
            f"{where}: {seen.largest:,} series on one node, over its budget of "
            f"{limit.at(1):,} per node"
        )
    elif kind is not None and kind.scope == "fleet" and seen.series > limit.at(nodes):
        lines.append(
            f"{where}: {seen.series:,} series, over its budget of {limit.at(nodes):,} "
            f"at {nodes:,} nodes ({limit.says()})"
        )
    for label, values in seen.labels.items():
        bound = family.labels.get(label)
        if bound is None:
            allowed = ", ".join(family.labels) or "none"
            why = "a forbidden label: unbounded" if label in budget.forbidden_labels else ""
            lines.append(
                f"{where}: label {label!r} is not in the budget (allowed: {allowed})"
                + (f"; {why}" if why else "; give it a bound, or drop it")
            )
            continue
        outside = sorted(v for v in values if bound.outside(v))
        if outside:
            shown = ", ".join(repr(v) for v in outside[:3]) + (" ..." if len(outside) > 3 else "")
            lines.append(
                f"{where}: label {label!r} takes {len(outside)} value(s) outside its bound "
                f"({bound.says()}): {shown}"
            )
    return lines
