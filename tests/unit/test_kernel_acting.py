"""What a service acts with, built by the kernel (`acting`), and each service's severity
table, composed from the kernel's presets: pinned to the values each had when it was
written out by hand."""

from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from schemas.common import ObjectRef
from schemas.notify import Severity
from schemas.remediation import Outcome
from services.accounting import service as accounting
from services.cordon import service as cordon
from services.credentials import service as credentials
from services.culler import service as culler
from services.falco import service as falco
from services.kernel import Auditor, Exemptions, KeyedRateLimiter, Proposal, acting
from services.kernel.audit import DEFAULT_SEVERITY
from services.kernel.control import OPERATOR, ControlSettings
from services.kernel.limits import RateLimitSettings
from services.kernel.severities import GOOD_NEWS, LOUD, QUIET, Table, per_action, table
from services.kernel.tally import TallySettings
from services.maintenance import service as maintenance
from services.recovery import service as recovery

N, W, C = Severity.INFO, Severity.WARNING, Severity.CRITICAL  # info, warning, critical
ORDER = (
    Outcome.APPLIED,
    Outcome.DRY_RUN,
    Outcome.REFUSED,
    Outcome.SKIPPED,
    Outcome.FAILED,
    Outcome.UNDONE,
)
"""The order of the outcomes in each row below."""

DEFAULTS = (C, W, C, N, C, W)

# Each service's severities per action, as its hand-written table had them.
PINNED: dict[str, dict[str, tuple[Severity, ...]]] = {
    "cordon": {
        **dict.fromkeys(("device_taint", "gpu_exclude"), (W, W, C, N, C, W)),
        **dict.fromkeys(("device_untaint", "gpu_include", "release"), (N, N, C, N, C, W)),
    },
    "credentials": {"renew": (N, N, W, N, W, N)},
    "culler": dict.fromkeys(("cancel", "ignore", "stop", "warn"), (N, N, W, N, C, N)),
    "maintenance": {
        **dict.fromkeys(
            ("announce", "checkpoint", "push-image", "complete", "fail"), (N, N, W, W, C, N)
        ),
        **dict.fromkeys(
            ("cordon", "drain", "evict-held", "take-over", "stop", "restore", "give-back"),
            (W, N, W, W, C, N),
        ),
    },
    "recovery": {
        **dict.fromkeys(
            ("drain", "reboot", "recover", "release", "reset", "validate", "power-on", "unfence"),
            (N, N, C, N, W, W),
        ),
        **dict.fromkeys(("power-off", "fence"), (W, W, C, N, W, W)),
    },
}
TABLES = {
    "cordon": cordon.SEVERITIES,
    "credentials": credentials.SEVERITIES,
    "culler": culler.SEVERITIES,
    "maintenance": maintenance.SEVERITIES,
    "recovery": recovery.SEVERITIES,
}


class StubBus:
    """What an `Auditor` takes of the bus when it is made."""

    def __init__(self) -> None:
        self.metrics = SimpleNamespace(registry=CollectorRegistry())
        self.closing: list[Any] = []

    def before_close(self, hook: Any) -> None:
        self.closing.append(hook)


def resolved(auditor: Auditor, action: str) -> tuple[Severity, ...]:
    return tuple(auditor.severity(action, outcome) for outcome in ORDER)


@pytest.mark.parametrize("service", sorted(PINNED))
def test_each_service_keeps_its_severities(service: str) -> None:
    auditor = Auditor(StubBus(), actor="a", topic="t", severities=TABLES[service])  # type: ignore[arg-type]
    assert set(TABLES[service]) == set(PINNED[service])
    for action, row in PINNED[service].items():
        assert resolved(auditor, action) == row, action
    # An action a table leaves out is audited at the defaults.
    assert resolved(auditor, "something-else") == DEFAULTS


def test_falco_and_accounting_audit_at_the_defaults() -> None:
    # They give no table: every action of theirs is at the defaults.
    for module in (falco, accounting):
        assert not hasattr(module, "SEVERITIES")
    runner = acting(StubBus(), actor="a", topic="t").runner  # type: ignore[arg-type]
    assert runner.auditor.severities == {}
    assert resolved(runner.auditor, "cordon") == DEFAULTS
    assert tuple(DEFAULT_SEVERITY[o] for o in ORDER) == DEFAULTS


def test_presets_layer_later_wins_and_are_read_only() -> None:
    assert table(QUIET, LOUD)[Outcome.APPLIED] == W
    assert table(LOUD, QUIET)[Outcome.APPLIED] == N
    assert dict(GOOD_NEWS) == {Outcome.APPLIED: N, Outcome.DRY_RUN: N}
    quiet: Any = QUIET
    with pytest.raises(TypeError):
        quiet[Outcome.APPLIED] = C
    tables: Any = per_action((GOOD_NEWS, ("a", "b")), (LOUD, ("b",)))
    assert tables["a"] is GOOD_NEWS and tables["b"] is LOUD
    with pytest.raises(TypeError):
        tables["c"] = QUIET


def proposal(**details: Any) -> Proposal:
    return Proposal(
        action="release",
        target=ObjectRef(kind="Node", name="n1"),
        reason="r",
        details=details,
    )


async def test_acting_builds_the_runner_exemptions_and_control_guards() -> None:
    bus = StubBus()

    async def labels(namespace: str) -> dict[str, str]:
        return {"nodeward.io/exempt": "true"} if namespace == "x" else {}

    severities: dict[str, Table] = {"release": GOOD_NEWS}
    kernel = acting(
        bus,  # type: ignore[arg-type]
        actor="service/x",
        topic="topic-x",
        severities=severities,
        tally=TallySettings(window=timedelta(minutes=3)),
        dry_run=True,
        namespace_labels=labels,
        controls=ControlSettings(rate_limit=RateLimitSettings(per_minute=1, burst=1)),
    )
    auditor = kernel.runner.auditor
    assert kernel.runner.dry_run
    assert (auditor.actor, auditor.topic) == ("service/x", "topic-x")
    assert auditor.severities is severities
    assert auditor.tally.window == timedelta(minutes=3)
    assert bus.closing == [auditor.flush_all]
    # The exemptions read a pod's namespace through the reader given.
    assert isinstance(kernel.exemptions, Exemptions)
    pod = {"kind": "Pod", "metadata": {"name": "p", "namespace": "x"}}
    assert await kernel.exemptions.exempt_reason(pod) == (
        "namespace x is labelled nodeward.io/exempt=true"
    )
    # An operator's control: the exemptions, then a rate limit per operator.
    exemptions, limit = kernel.control_guards
    assert exemptions is kernel.exemptions
    assert isinstance(limit, KeyedRateLimiter) and limit.name == "operator_rate_limit"
    assert await limit.check(proposal(**{OPERATOR: "ann"})) is None
    refused = await limit.check(proposal(**{OPERATOR: "ann"}))
    assert refused is not None and refused.outcome == Outcome.REFUSED
    assert await limit.check(proposal(**{OPERATOR: "bob"})) is None
    assert await limit.check(proposal()) is None  # not an operator's


def test_acting_without_controls_or_reader() -> None:
    kernel = acting(StubBus(), actor="a", topic="t")  # type: ignore[arg-type]
    assert not kernel.runner.dry_run
    assert kernel.control_guards == ()
    assert kernel.exemptions.namespace_labels is None
    assert kernel.runner.auditor.tally.window == timedelta(minutes=10)
    with pytest.raises(AttributeError):
        kernel.runner = kernel.runner  # type: ignore[misc]  # frozen
