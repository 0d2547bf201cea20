"""What `nodeward tail` shows: filters by node, namespace and severity; heartbeats hidden."""

from __future__ import annotations

from nodeward.cli.events import TailFilter, severity_of
from schemas import example_event, make_event
from schemas.gpu import GpuHealth, HealthState


def health(node: str, state: HealthState, heartbeat: bool = False):  # type: ignore[no-untyped-def]
    data = GpuHealth.example().model_copy(
        update={"node": node, "state": state, "heartbeat": heartbeat}
    )
    return make_event(data, source=f"agent/gpu/{node}")


def test_severity_of_each_kind() -> None:
    assert severity_of(health("n1", HealthState.FAILED)) == "critical"
    assert severity_of(health("n1", HealthState.DEGRADED)) == "warning"
    assert severity_of(health("n1", HealthState.HEALTHY)) == "info"
    assert severity_of(example_event("notify.v1")) == "critical"  # the example is critical
    assert severity_of(example_event("falco.alert.v1")) == "info"  # Notice
    assert severity_of(example_event("dlq.v1")) == "warning"
    assert severity_of(example_event("remediation.v1")) == "warning"  # applied


def test_node_filter() -> None:
    where = TailFilter(node="n1")
    assert where.accepts(health("n1", HealthState.FAILED))
    assert not where.accepts(health("n2", HealthState.FAILED))
    assert where.accepts(example_event("remediation.v1")) is False  # about gpu-node-07
    assert TailFilter(node="gpu-node-07").accepts(example_event("remediation.v1"))


def test_namespace_filter() -> None:
    where = TailFilter(namespace="user-alice")
    assert where.accepts(example_event("session.idle.v1"))
    assert where.accepts(example_event("falco.alert.v1"))  # pod/user-alice/jupyter-alice-0
    assert not TailFilter(namespace="user-bob").accepts(example_event("session.idle.v1"))
    assert not where.accepts(health("n1", HealthState.FAILED))


def test_severity_floor_and_heartbeats() -> None:
    assert not TailFilter(min_severity="warning").accepts(health("n1", HealthState.HEALTHY))
    assert TailFilter(min_severity="warning").accepts(health("n1", HealthState.DEGRADED))
    assert not TailFilter(min_severity="critical").accepts(health("n1", HealthState.DEGRADED))
    assert not TailFilter().accepts(health("n1", HealthState.HEALTHY, heartbeat=True))
    assert TailFilter(heartbeats=True).accepts(health("n1", HealthState.HEALTHY, heartbeat=True))
