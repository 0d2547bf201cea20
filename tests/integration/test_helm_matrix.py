"""The render matrix, validated with kubernetes-validate (strict) for every Kubernetes minor
from 1.28 to the newest its bundled schemas know: each NATS mode, TLS on, with and without
the Prometheus operator, every optional service on. The operator's kinds have no schema in
kubernetes-validate: they are checked for their apiVersion and shape only (test_helm_chart.py
runs their rules through promtool)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from kubernetes_validate.utils import all_versions

from tests.integration.helm_chart import (
    MONITORING_API,
    NODE_KEYS,
    SERVICES,
    TLS_VALUES,
    merged,
    minimal,
    new_account_key,
    render,
    representative_values,
    validation_errors,
)

OPERATOR_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
OLDEST = (1, 28)


def _minor(version: str) -> tuple[int, int]:
    major, minor, *_ = version.split(".")
    return int(major), int(minor)


VERSIONS = sorted({v for v in all_versions() if _minor(v) >= OLDEST}, key=_minor)
MATRIX: dict[str, tuple[dict[str, Any], list[str]]] = {
    "passwords": (representative_values(NODE_KEYS, "passwords"), []),
    "nkeys": (representative_values(NODE_KEYS, "nkeys"), []),
    "callout": (representative_values(NODE_KEYS, "callout"), []),
    "callout-tls": (merged(representative_values(NODE_KEYS, "callout"), TLS_VALUES), []),
    "callout-operator-mode": (
        merged(
            representative_values(NODE_KEYS, "callout"),
            {"natsAuth": {"callout": {"operatorMode": True, "account": new_account_key()[1]}}},
        ),
        [],
    ),
    "callout-prometheus-operator": (representative_values(NODE_KEYS, "callout"), [MONITORING_API]),
    "defaults-no-prometheus-operator": (minimal(), []),
}


def test_the_matrix_spans_the_versions_asked_for() -> None:
    assert VERSIONS[0] == "1.28.0"
    assert VERSIONS[-1] == kubernetes_validate.latest_version()
    assert len(VERSIONS) >= 7  # 1.28 to at least 1.34


@functools.cache
def _rendered(scenario: str, tmp: Path) -> list[dict[str, Any]]:
    values, apis = MATRIX[scenario]
    return render(tmp, values, api_versions=apis)


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> Any:
    base = tmp_path_factory.mktemp("matrix")
    return lambda scenario: _rendered(scenario, base / scenario)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("scenario", sorted(MATRIX))
def test_every_manifest_validates(rendered: Any, scenario: str, version: str) -> None:
    docs = rendered(scenario)
    for doc in docs:
        if doc["kind"] in OPERATOR_KINDS:
            assert doc["apiVersion"] == MONITORING_API and doc["spec"]
    errors = validation_errors(docs, version)
    assert not errors, "\n".join(errors)


def test_the_matrix_covers_what_it_says(rendered: Any) -> None:
    """Each cell renders what it is named for (a cell that silently lost its feature would
    validate just as well)."""
    kinds = {s: {d["kind"] for d in rendered(s)} for s in MATRIX}
    assert kinds["callout-prometheus-operator"] >= OPERATOR_KINDS
    assert not OPERATOR_KINDS & kinds["callout"]
    assert not OPERATOR_KINDS & kinds["defaults-no-prometheus-operator"]
    assert "PodDisruptionBudget" in kinds["callout"] and "PodDisruptionBudget" not in kinds["nkeys"]
    names = {d["metadata"]["name"] for d in rendered("passwords") if d["kind"] == "Deployment"}
    assert {f"nw-{s}" for s in SERVICES} <= names
    tls = [d for d in rendered("callout-tls") if d["kind"] == "Deployment"]
    assert all(
        "nats-tls" in {v["name"] for v in d["spec"]["template"]["spec"]["volumes"]} for d in tls
    )
