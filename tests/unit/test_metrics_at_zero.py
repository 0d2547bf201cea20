"""Failure counters start at 0 (`nodeward.metrics.at_zero`): every label combination known
in advance has its series before the first failure, so `increase()` sees that failure and
a dashboard shows 0, not "No data"; and what is known fits the series budget."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest

from agents.energy.access import GRANTS as ENERGY
from agents.gpu.access import GRANTS as GPU
from agents.idle.access import GRANTS as IDLE
from launch.access import GRANTS
from launch.observability.budget import load
from nodeward.bus.consumer import DEAD_LETTER_REASONS
from nodeward.metrics import Declare, at_zero
from nodeward.nats_auth import AgentGrants, service_publish, service_user
from schemas.dlq import DeadLetterReason
from schemas.registry import REGISTRY, types_on
from schemas.tokens import token


def samples(registry: CollectorRegistry, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {
        tuple(sorted(s.labels.items())): s.value
        for family in registry.collect()
        for s in family.samples
        if s.name == name
    }


def test_at_zero_gives_every_combination_a_series_at_0_and_counts_on_from_it() -> None:
    r = CollectorRegistry()
    c = Counter("nodeward_things", "t", ["kind", "outcome"], registry=r)
    assert at_zero(c, outcome=("ok", "failed"), kind=["a", "b"]) is c
    seen = samples(r, "nodeward_things_total")
    assert seen == {
        (("kind", k), ("outcome", o)): 0.0 for k in ("a", "b") for o in ("ok", "failed")
    }
    c.labels("a", "failed").inc()
    at_zero(c, kind=["a"], outcome=["failed"])  # again: nothing reset
    assert samples(r, "nodeward_things_total")[(("kind", "a"), ("outcome", "failed"))] == 1.0
    text = generate_latest(r).decode()
    assert 'nodeward_things_total{kind="b",outcome="ok"} 0.0' in text


def test_at_zero_refuses_a_label_the_counter_lacks_and_adds_nothing_for_no_values() -> None:
    r = CollectorRegistry()
    c = Counter("nodeward_things", "t", ["kind"], registry=r)
    with pytest.raises(ValueError):
        at_zero(c, channel=["mail"])
    at_zero(c, kind=[])
    assert samples(r, "nodeward_things_total") == {}


def test_declare_counter_known_starts_those_series_at_0() -> None:
    r = CollectorRegistry()
    Declare(r).counter("nodeward_reads_failed", "f", "source", known={"source": ["ipmi", "rapl"]})
    Declare(r).counter("nodeward_other", "o", "source")
    assert samples(r, "nodeward_reads_failed_total") == {
        (("source", "ipmi"),): 0.0,
        (("source", "rapl"),): 0.0,
    }
    assert samples(r, "nodeward_other_total") == {}


def test_the_dead_letter_reasons_are_the_dlq_reasons_and_terminated_as_budgeted() -> None:
    assert set(DEAD_LETTER_REASONS) == {r.value for r in DeadLetterReason} | {"terminated"}
    family = load().families["nodeward_events_dead_lettered_total"]
    assert family.labels["reason"].values == DEAD_LETTER_REASONS


def test_the_types_on_subjects_are_those_any_subject_can_carry() -> None:
    assert types_on(["gpu.health.n1.>", "$KV.x.>", "dlq.GPU.cordon"]) == (
        "dlq.v1",
        "gpu.health.v1",
    )
    assert types_on(["notify.*.power-cap"]) == ("notify.v1",)
    assert types_on([]) == ()
    assert set(types_on([">"])) == set(REGISTRY)


def test_a_service_publishes_what_its_nats_user_may() -> None:
    for name, grants in GRANTS.items():
        assert service_publish(grants) == service_user(name, grants, "pw").publish, name


@pytest.mark.parametrize("component", sorted(GRANTS))
def test_each_services_publish_failures_at_0_fit_its_budget(component: str) -> None:
    types = types_on(service_publish(GRANTS[component]))
    limit = load().limit("nodeward_publish_failures_total", component, nodes=1)
    assert limit is not None and len(types) <= limit, types
    if GRANTS[component].consumers:  # its consumers dead-letter and refuse
        assert {"dlq.v1", "remediation.v1", "notify.v1"} <= set(types)


@pytest.mark.parametrize(
    ("component", "grants", "expected"),
    [
        ("agent-gpu", GPU, {"gpu.health.v1", "gpu.xid.v1", "gpu.heartbeat.v1", "gpu.telemetry.v1"}),
        (
            "agent-energy",
            ENERGY,
            {"energy.node.v1", "energy.pod.v1", "node.finding.v1", "notify.v1"},
        ),
        ("agent-idle", IDLE, {"session.activity.v1", "session.idle.v1"}),
    ],
)
def test_each_agents_publish_failures_at_0_fit_its_budget(
    component: str, grants: AgentGrants, expected: set[str]
) -> None:
    types = types_on(grants.publish_for(token("gpu-node-1")))
    assert set(types) == expected
    limit = load().limit("nodeward_publish_failures_total", component, nodes=1)
    assert limit is not None and len(types) <= limit
