"""The cardinality budget (launch/observability/budget.py, budget.yaml): counting series per
family and component from expositions, every way a scrape can break the budget, and the
committed budget against every metric the code declares."""

from __future__ import annotations

import ast
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest
from pydantic import ValidationError

from launch.observability.budget import Budget, component_of, count, load, violations
from nodeward.metrics import Exposed, Metrics
from tests.conftest import REPO

BUDGET = """
forbidden_labels: [uid, event_id, message]
components:
  agent-gpu: {scope: node}
  cordon: {scope: fleet}
  accounting: {scope: fleet}
families:
  nodeward_gpu_power_watts:
    what: GPU power
    limits: {agent-gpu: {per_node: 2}}
    labels: {gpu: {bound: index, pattern: '[0-9]'}}
  nodeward_events_dead_lettered_total:
    what: DLQ
    limits: {"*": {fixed: 2}}
    labels:
      consumer: {bound: durables}
      reason: {bound: closed, values: [invalid, exhausted]}
  nodeward_accounting_uncovered_seconds_total:
    what: gaps
    limits: {accounting: {fixed: 1, per_node: 1}}
    labels: {node: {bound: a node}}
  nodeward_handler_seconds:
    what: latency
    limits: {cordon: {fixed: 8}}
    labels: {consumer: {bound: durables}}
"""


def exposition(
    *,
    gpus: int | None = None,
    dead: tuple[str, ...] | None = None,
    nodes: int | None = None,
    latency: bool = False,
    openmetrics: bool = False,
) -> str:
    """One daemon's /metrics, each family declared only when asked for: `gpus` power
    gauges, a dead letter per reason in `dead`, `nodes` uncovered-seconds counters, the
    handler histogram."""
    r = CollectorRegistry()
    if gpus is not None:
        power = Gauge("nodeward_gpu_power_watts", "power", ["gpu"], registry=r)
        for i in range(gpus):
            power.labels(str(i)).set(100)
    if dead is not None:
        dl = Counter("nodeward_events_dead_lettered", "dlq", ["consumer", "reason"], registry=r)
        for reason in dead:
            dl.labels("cordon", reason).inc()
    if nodes is not None:
        gap = Counter("nodeward_accounting_uncovered_seconds", "gaps", ["node"], registry=r)
        for i in range(nodes):
            gap.labels(f"gpu-{i:02d}").inc()
    if latency:
        h = Histogram("nodeward_handler_seconds", "h", ["consumer"], buckets=(1, 5), registry=r)
        h.labels("cordon").observe(0.5)
    return (openmetrics_latest(r) if openmetrics else generate_latest(r)).decode()


@pytest.fixture
def budget() -> Budget:
    return load(BUDGET)


def test_agents_group_by_kind_and_services_by_name() -> None:
    assert component_of("agent-gpu-gpu-h100-01") == "agent-gpu"
    assert component_of("agent-energy-gpu-a100-mig-01") == "agent-energy"
    assert component_of("oauth2-provider") == "oauth2-provider"
    assert component_of("cordon") == "cordon"


@pytest.mark.parametrize("openmetrics", [False, True])
def test_count_series_per_family_and_component(openmetrics: bool) -> None:
    one = exposition(gpus=2, openmetrics=openmetrics)
    big = exposition(gpus=3, dead=("invalid",), openmetrics=openmetrics)
    cordon = exposition(gpus=0, latency=True, openmetrics=openmetrics)
    counts = count({"agent-gpu-a": one, "agent-gpu-b": big, "cordon": cordon})
    power = counts.families["nodeward_gpu_power_watts"]["agent-gpu"]
    assert (power.series, power.daemons, power.largest) == (5, 2, 3)
    assert power.labels == {"gpu": frozenset({"0", "1", "2"})}
    assert power.created == 0 and power.type == "gauge"
    # A counter's family is its name as exposed (with `_total`); each series has a
    # `_created` beside it, served by the plain registry, none through `Exposed`.
    dead = counts.families["nodeward_events_dead_lettered_total"]["agent-gpu"]
    assert (dead.series, dead.created, dead.created_served) == (1, 1, 1)
    # A histogram: the name without _bucket/_sum/_count; 3 buckets + sum + count, one
    # `_created` for the histogram; `le` is its shape, not a label.
    latency = counts.families["nodeward_handler_seconds"]["cordon"]
    assert (latency.series, latency.created) == (5, 1)
    assert set(latency.labels) == {"consumer"}
    # Declared, never set: present with no series (HELP and TYPE only).
    assert counts.families["nodeward_gpu_power_watts"]["cordon"].series == 0
    assert counts.daemons == {"agent-gpu": 2, "cordon": 1}
    assert counts.series(created=True) == counts.series() + counts.created_served()


def test_a_scrape_within_the_budget_has_no_violation(budget: Budget) -> None:
    scrapes = {
        "agent-gpu-a": exposition(gpus=2),
        "agent-gpu-b": exposition(gpus=2, dead=("invalid", "exhausted")),
        "accounting": exposition(nodes=9, dead=()),
        "cordon": exposition(dead=(), latency=True),
    }
    assert violations(budget, count(scrapes), nodes=8) == []


def test_an_agent_over_its_per_node_budget_fails_with_one_clear_line(budget: Budget) -> None:
    counts = count({"agent-gpu-a": exposition(gpus=2), "agent-gpu-b": exposition(gpus=3)})
    assert violations(budget, counts, nodes=5000) == [
        "nodeward_gpu_power_watts (agent-gpu): 3 series on one node, over its budget of 2 per node"
    ]


def test_a_service_over_its_budget_at_the_node_count_fails(budget: Budget) -> None:
    counts = count({"accounting": exposition(nodes=10)})
    assert violations(budget, counts, nodes=10) == []  # 1 + 1 per node
    assert violations(budget, counts, nodes=8) == [
        "nodeward_accounting_uncovered_seconds_total (accounting): 10 series, over its budget "
        "of 9 at 8 nodes (1 + 1 per node)"
    ]


def test_a_label_the_budget_does_not_allow_fails(budget: Budget) -> None:
    r = CollectorRegistry()
    Gauge("nodeward_gpu_power_watts", "p", ["gpu", "event_id"], registry=r).labels(
        "0", "01920000-0000-7000-8000-000000000001"
    ).set(1)
    Counter("nodeward_events_dead_lettered", "d", ["consumer", "pod"], registry=r).labels(
        "cordon", "train-0"
    ).inc()
    lines = violations(budget, count({"agent-gpu-a": generate_latest(r).decode()}), nodes=1)
    assert lines == [
        "nodeward_events_dead_lettered_total (agent-gpu): label 'pod' is not in the budget "
        "(allowed: consumer, reason); give it a bound, or drop it",
        "nodeward_gpu_power_watts (agent-gpu): label 'event_id' is not in the budget "
        "(allowed: gpu); a forbidden label: unbounded",
    ]


def test_free_text_in_a_closed_or_patterned_label_fails(budget: Budget) -> None:
    r = CollectorRegistry()
    dl = Counter("nodeward_events_dead_lettered", "d", ["consumer", "reason"], registry=r)
    dl.labels("cordon", "handler raised KeyError: 'gpu-07'").inc()
    Gauge("nodeward_gpu_power_watts", "p", ["gpu"], registry=r).labels("GPU-0a1b").set(1)
    lines = violations(budget, count({"cordon": generate_latest(r).decode()}), nodes=1)
    assert len(lines) == 3, lines
    assert lines[0] == (
        "nodeward_events_dead_lettered_total (cordon): label 'reason' takes 1 value(s) outside"
        " its bound (one of 'invalid', 'exhausted'): \"handler raised KeyError: 'gpu-07'\""
    )
    assert (
        lines[1]
        == "nodeward_gpu_power_watts (cordon): the budget gives cordon no limit for this family"
    )
    assert (
        "label 'gpu' takes 1 value(s) outside its bound (matching '[0-9]'): 'GPU-0a1b'" in lines[2]
    )


def test_a_family_or_a_component_the_budget_does_not_name_fails(budget: Budget) -> None:
    r = CollectorRegistry()
    Gauge("nodeward_shiny_new", "new", registry=r).set(1)
    lines = violations(budget, count({"shiny": generate_latest(r).decode()}), nodes=1)
    assert lines == [
        "shiny: no such component in the budget (budget.yaml components); 1 daemon(s) scraped",
        "nodeward_shiny_new: not in the budget (budget.yaml); exposed by shiny (1 series)",
    ]


@pytest.mark.parametrize(
    ("edit", "error"),
    [
        (("labels: {gpu: {bound: index", "labels: {uid: {bound: index"), "forbidden"),
        (("limits: {cordon: {fixed: 8}}", "limits: {sweeper: {fixed: 8}}"), "unknown components"),
        (("pattern: '[0-9]'", "pattern: '[0-9'"), "bad pattern"),
        (("bound: durables}", "bound: durables, color: blue}"), "Extra inputs"),
    ],
)
def test_a_budget_that_allows_the_unbounded_or_names_nothing_does_not_load(
    edit: tuple[str, str], error: str
) -> None:
    with pytest.raises(ValidationError, match=error):
        load(BUDGET.replace(*edit, 1))


def test_the_runtime_serves_no_created_series() -> None:
    metrics = Metrics("cordon")
    metrics.published.labels("gpu.health.v1").inc()
    metrics.handler_seconds.labels("cordon").observe(0.1)
    raw = count({"cordon": generate_latest(metrics.registry).decode()})
    assert raw.created_served() == 3  # by itself: published, the histogram, reconnects
    for text in (
        generate_latest(Exposed(metrics.registry)).decode(),
        openmetrics_latest(Exposed(metrics.registry)).decode(),
    ):
        assert "_created" not in text
        served = count({"cordon": text})
        assert served.created_served() == 0
        assert served.series() == raw.series()  # every other series kept
    assert count({"cordon": generate_latest(metrics.registry).decode()}).created_served() == 3


# -- the committed budget against the code ---------------------------------------------------

_CONSTRUCTORS = {"Counter": "counter", "Gauge": "gauge", "Histogram": "histogram"}
_DECLARE = {"counter": "counter", "gauge": "gauge"}  # nodeward.metrics.Declare
_PACKAGES = ("nodeward", "agents", "services", "launch", "sim")


def _strings(node: ast.expr) -> list[str] | None:
    if isinstance(node, ast.List | ast.Tuple) and all(
        isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts
    ):
        return [e.value for e in node.elts]  # type: ignore[attr-defined]
    return None


def declared() -> Iterator[tuple[str, frozenset[str], str]]:
    """(family as exposed, its label names, where) of every metric the packages declare with
    prometheus_client's constructors or `Declare`, read from their source."""
    for package in _PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            for call in ast.walk(tree):
                if not isinstance(call, ast.Call) or not call.args:
                    continue
                first = call.args[0]
                if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
                    continue
                name = first.value
                if not name.startswith("nodeward_"):
                    continue
                func = call.func
                where = f"{path.relative_to(REPO)}:{call.lineno}"
                if isinstance(func, ast.Name) and func.id in _CONSTRUCTORS:
                    kind = _CONSTRUCTORS[func.id]
                    given = [k.value for k in call.keywords if k.arg == "labelnames"]
                    raw = call.args[2] if len(call.args) > 2 else (given[0] if given else None)
                    labels = _strings(raw) if raw is not None else []
                elif isinstance(func, ast.Attribute) and func.attr in _DECLARE:
                    kind = _DECLARE[func.attr]
                    labels = _strings(ast.Tuple(elts=call.args[2:]))
                else:
                    continue
                assert labels is not None, f"{where}: labels not literal; read them by hand"
                if kind == "counter":
                    name = name.removesuffix("_total") + "_total"
                yield name, frozenset(labels), where


def test_the_committed_budget_covers_every_family_and_label_the_code_declares() -> None:
    budget = load()
    found = list(declared())
    assert len(found) > 60, "the scan finds the code's metrics"
    missing = [f"{name} ({where})" for name, _, where in found if name not in budget.families]
    assert not missing, f"families not in budget.yaml: {missing}"
    unbudgeted = [
        f"{name} {sorted(labels - set(budget.families[name].labels))} ({where})"
        for name, labels, where in found
        if labels - set(budget.families[name].labels)
    ]
    assert not unbudgeted, f"labels with no bound in budget.yaml: {unbudgeted}"
    stale = set(budget.families) - {name for name, _, _ in found}
    assert not stale, f"budget.yaml names families no code declares: {sorted(stale)}"


def test_the_committed_budget_bounds_every_label_and_names_real_components() -> None:
    budget = load()
    assert {"agent-gpu", "agent-energy", "agent-idle"} <= {
        name for name, c in budget.components.items() if c.scope == "node"
    }
    services = {p.name for p in (REPO / "services").iterdir() if (p / "service.py").exists()}
    # the maintenance service's daemon is named checkpoint; the kernel is shared code
    named = {"checkpoint" if s == "maintenance" else s for s in services - {"kernel"}}
    assert named <= set(budget.components), named - set(budget.components)
    for name, family in budget.families.items():
        assert not set(family.labels) & set(budget.forbidden_labels), name
        for label in family.labels.values():
            assert label.bound.strip(), name


def test_the_docs_table_names_every_family() -> None:
    text = (REPO / "docs" / "cardinality.md").read_text()
    absent = [name for name in load().families if f"`{name}`" not in text]
    assert not absent, f"docs/cardinality.md lacks {absent}"
