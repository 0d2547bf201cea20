"""What a service acts with, built in one call: its runner (and the runner's auditor), its
exemptions and the guards of its operator controls."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nodeward.bus import Bus
from nodeward.config import Section
from services.kernel.audit import Auditor
from services.kernel.control import ControlSettings, operator_limit
from services.kernel.exemptions import Exemptions, NamespaceLabels
from services.kernel.proposal import Guard
from services.kernel.runner import ActionRunner
from services.kernel.severities import Severities
from services.kernel.tally import Tally, TallySettings

if TYPE_CHECKING:
    from nodeward.handlers import Runtime


class ActingSettings(Section):
    """The base of an acting service's settings section."""

    dry_run: bool = False
    """decide, audit and tell as if acting; change nothing"""


@dataclass(frozen=True)
class Acting:
    """A service's runner, its exemptions guard, and its operator controls' guards."""

    runner: ActionRunner
    exemptions: Exemptions
    control_guards: tuple[Guard, ...]
    """The exemptions and a rate limit per operator; none without control settings."""


def acting(
    bus: Bus,
    *,
    actor: str,
    topic: str,
    severities: Severities | None = None,
    tally: TallySettings | None = None,
    dry_run: bool = False,
    namespace_labels: NamespaceLabels | None = None,
    controls: ControlSettings | None = None,
) -> Acting:
    """The runner over an `Auditor(bus, actor=, topic=, severities=, tally=)`, dry-running
    or not; `Exemptions(namespace_labels)` (a pod's namespace is read only with a reader);
    with `controls`, the operator controls' guards: the exemptions and
    `operator_limit(controls.rate_limit)` (an operator's act never passes the breaker; the
    runner's dry-run applies as to every action)."""
    auditor = Auditor(
        bus,
        actor=actor,
        topic=topic,
        severities=severities,
        tally=Tally.of(tally) if tally is not None else None,
    )
    exemptions = Exemptions(namespace_labels)
    control_guards: tuple[Guard, ...] = (
        (exemptions, operator_limit(controls.rate_limit)) if controls is not None else ()
    )
    return Acting(ActionRunner(auditor, dry_run=dry_run), exemptions, control_guards)


def acting_for(
    rt: Runtime[Any],
    *,
    topic: str,
    severities: Severities | None = None,
    tally: TallySettings | None = None,
    namespace_labels: NamespaceLabels | None = None,
    controls: ControlSettings | None = None,
) -> Acting:
    """`acting` for a service declared with `nodeward.handlers`: it acts on its bus as its
    source (`service/<name>`), dry-running as its section says (`ActingSettings.dry_run`)."""
    return acting(
        rt.bus,
        actor=rt.source,
        topic=topic,
        severities=severities,
        tally=tally,
        dry_run=bool(getattr(rt.config, "dry_run", False)),
        namespace_labels=namespace_labels,
        controls=controls,
    )


def acting_controlled(
    rt: Runtime[Any],
    *,
    topic: str,
    severities: Severities | None = None,
    tally: TallySettings | None = None,
) -> Acting:
    """`acting_for` a service with operator controls on its cluster: its exemptions read
    the cluster's namespace labels, and its controls' guards take the rate limit of its
    section's `controls` (`ControlSettings`)."""
    return acting_for(
        rt,
        topic=topic,
        severities=severities,
        tally=tally,
        namespace_labels=rt.acting.namespaces.labels,
        controls=rt.config.controls,
    )
