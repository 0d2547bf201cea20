"""How loud each decision is: the presets a service builds its severity table from.

The auditor looks a decision's severity up by action, then outcome; what a table leaves
out is `DEFAULT_SEVERITY` (an act pages, a dry run or an undo warns, a skip informs). A
service states its own table, per action, from these presets (`table` layers them, the
later winning; `per_action` gives each group of actions its table)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType

from schemas.notify import Severity
from schemas.remediation import Outcome

Table = Mapping[Outcome, Severity]
"""One action's severity per outcome; an outcome left out takes the default."""

Severities = Mapping[str, Table]
"""A service's table: each action's severities."""


def table(*layers: Table) -> Table:
    """The layers as one read-only table, a later layer winning."""
    merged: dict[Outcome, Severity] = {}
    for layer in layers:
        merged.update(layer)
    return MappingProxyType(merged)


def per_action(*groups: tuple[Table, Iterable[str]]) -> Severities:
    """Each group's table for each of its actions, read-only (a later group wins)."""
    return MappingProxyType({action: t for t, actions in groups for action in actions})


GOOD_NEWS = table({Outcome.APPLIED: Severity.INFO, Outcome.DRY_RUN: Severity.INFO})
"""Good news (a release, a step done): on-call hears of it, nobody is paged for it."""

QUIET = table(
    GOOD_NEWS,
    {
        Outcome.SKIPPED: Severity.INFO,
        Outcome.REFUSED: Severity.WARNING,
        Outcome.FAILED: Severity.CRITICAL,
        Outcome.UNDONE: Severity.INFO,
    },
)
"""On-call hears of every decision; a refusal warns; only a failure pages."""

LOUD = table({Outcome.APPLIED: Severity.WARNING})
"""Done, and worth a look (capacity out of service): a warning, not a page."""

FAILURE_WARNS = table({Outcome.FAILED: Severity.WARNING})
"""A failure that is retried or handed on: a warning, not a page."""

SKIP_WARNS = table({Outcome.SKIPPED: Severity.WARNING})
"""A skip that leaves the work asked for undone: a warning."""
