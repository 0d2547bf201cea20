"""Who may speak to users: the notifier's rule for subjects node credentials may publish,
and the binding of a notice's severity and topic to its subject."""

from __future__ import annotations

from typing import Any

from agents.energy.caps import CapWatch, cap_notice
from agents.energy.settings import PowerCap
from launch.access import AGENT_GRANTS
from nodeward.bus import ConsumerSpec
from nodeward.bus.identity import mismatches
from nodeward.nats_auth import node_agent
from schemas import Event, make_event
from schemas.notify import Notification, Severity
from services.notifier.routing import Audience
from services.notifier.speakers import NODE_SUBJECTS, node_subject, refusal

USER = Audience.parse("user:ml-nlp/bob-explore-0")
ONCALL = Audience.parse("oncall")


def test_the_node_subjects_are_the_notify_subjects_node_agents_declare() -> None:
    """The notifier's list (the contract's `NODE_TOPICS`) is exactly what node users may
    publish of `notify.>`: a topic granted to nodes later, and not listed, fails here."""
    assert NODE_SUBJECTS == ("notify.*.power-limit",)
    granted = node_agent("gpu-h100-01", "", AGENT_GRANTS).publish
    assert set(NODE_SUBJECTS) == {s for s in granted if s.startswith("notify.")}


def test_a_node_subject_may_address_only_oncall() -> None:
    for severity in ("info", "warning", "critical"):
        subject = f"notify.{severity}.power-limit"
        assert node_subject(subject) == "notify.*.power-limit"
        assert refusal(subject, ONCALL) is None
        reason = refusal(subject, USER)
        assert reason is not None
        assert "user:ml-nlp/bob-explore-0" in reason and "only on-call" in reason


def test_other_subjects_may_address_users() -> None:
    for subject in ("notify.warning.idle-session", "notify.critical.security"):
        assert node_subject(subject) is None
        assert refusal(subject, USER) is None


def _event(**fields: object) -> Event[Any]:
    base: dict[str, object] = {
        "severity": Severity.WARNING,
        "topic": "power-limit",
        "title": "t",
        "audience": "oncall",
    }
    return make_event(Notification.model_validate(base | fields), source="test")


def test_severity_and_topic_are_bound_to_the_subject() -> None:
    binding = ConsumerSpec.bind(Notification, "severity", "topic")
    genuine = _event()
    assert mismatches(binding, "notify.warning.power-limit", genuine) == []
    forged = _event(topic="security")
    [wrong] = mismatches(binding, "notify.warning.power-limit", forged)
    assert (wrong.field, wrong.claimed, wrong.token) == ("topic", "security", "power-limit")
    louder = _event(severity=Severity.CRITICAL)
    [wrong] = mismatches(binding, "notify.info.power-limit", louder)
    assert (wrong.field, wrong.claimed, wrong.token) == ("severity", "critical", "info")


def test_the_energy_agents_cap_notices_pass_the_rule() -> None:
    """What a node legitimately says on these subjects is for on-call, so nothing is lost."""
    watch = CapWatch("rack", "r1", PowerCap(watts=6500))
    for change in ("crossed", "cleared"):
        note = cap_notice(watch, change, "gpu-h100-01", 7000.0)
        subject = note.nats_subject()
        assert node_subject(subject) is not None
        assert refusal(subject, Audience.parse(note.audience)) is None
        assert (
            mismatches(
                ConsumerSpec.bind(Notification, "severity", "topic"),
                subject,
                make_event(note, source="agent/energy/gpu-h100-01"),
            )
            == []
        )
