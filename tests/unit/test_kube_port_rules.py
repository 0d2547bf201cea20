"""Rules of the cluster port that need no API server: one importer of the client, typed errors."""

from __future__ import annotations

import ast
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nodeward.kube import errors
from nodeward.kube.client import Backoff
from sim.cluster.patch import merge_patch, strategic_merge_patch

ROOT = Path(__file__).resolve().parents[2]


def test_only_the_client_module_imports_kubernetes() -> None:
    importers = []
    for folder in ("nodeward", "agents", "services"):
        for path in (ROOT / folder).rglob("*.py"):
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                names = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    names = [node.module]
                if any(n == "kubernetes" or n.startswith("kubernetes.") for n in names):
                    importers.append(str(path.relative_to(ROOT)))
    assert sorted(set(importers)) == ["nodeward/kube/client.py"]


def test_status_bodies_become_typed_errors() -> None:
    body = {
        "kind": "Status",
        "status": "Failure",
        "reason": "NotFound",
        "code": 404,
        "message": 'nodes "x" not found',
        "details": {"name": "x", "kind": "nodes"},
    }
    err = errors.from_status(404, body)
    assert (
        isinstance(err, errors.NotFound)
        and str(err) == 'nodes "x" not found'
        and err.details["name"] == "x"
    )
    assert isinstance(
        errors.from_status(409, {"kind": "Status", "reason": "AlreadyExists"}), errors.AlreadyExists
    )
    assert isinstance(
        errors.from_status(409, {"kind": "Status", "reason": "Conflict"}), errors.Conflict
    )
    throttled = errors.from_status(429, "slow down\n", retry_after=2.0)
    assert isinstance(throttled, errors.TooManyRequests) and throttled.retry_after == 2.0
    assert str(throttled) == "slow down"
    assert isinstance(errors.from_status(503, None), errors.ServerError)
    assert str(errors.from_status(500, "line one\nline two")) == "line one line two"
    invalid = errors.from_status(
        422, {"kind": "Status", "message": "bad", "details": {"causes": [{"field": "f"}]}}
    )
    assert isinstance(invalid, errors.Invalid) and invalid.causes == [{"field": "f"}]


def test_backoff_grows_and_is_capped() -> None:
    backoff = Backoff(base=0.1, cap=1.0)
    assert all(0.05 <= backoff.delay(0) <= 0.1 for _ in range(50))
    assert all(0.5 <= backoff.delay(10) <= 1.0 for _ in range(50))


_keys = st.sampled_from(["a", "b", "c", "type", "name"])
_scalars = st.one_of(st.integers(), st.text(max_size=3), st.booleans())
_json = st.recursive(
    _scalars, lambda inner: st.dictionaries(_keys, inner, max_size=3), max_leaves=8
)
_patches = st.recursive(
    st.one_of(_scalars, st.none()),
    lambda inner: st.dictionaries(_keys, inner, max_size=3),
    max_leaves=8,
)


_settings = settings(deadline=None, max_examples=150, suppress_health_check=[HealthCheck.too_slow])


@_settings
@given(st.dictionaries(_keys, _json, max_size=4), st.dictionaries(_keys, _patches, max_size=4))
def test_merge_patch_is_idempotent(target: dict, patch: dict) -> None:  # type: ignore[type-arg]
    once = merge_patch(target, patch)
    assert merge_patch(once, patch) == once


_conditions = st.lists(
    st.fixed_dictionaries(
        {
            "type": st.sampled_from(["Ready", "GPUHealthy", "DiskPressure"]),
            "status": st.sampled_from(["True", "False", "Unknown"]),
        }
    ),
    max_size=3,
    unique_by=lambda c: c["type"],
)


@_settings
@given(_conditions, _conditions)
def test_condition_patches_merge_by_type(existing: list, patch: list) -> None:  # type: ignore[type-arg]
    node = {"status": {"conditions": existing}}
    out = strategic_merge_patch(node, {"status": {"conditions": patch}}, "Node")
    merged = {c["type"]: c["status"] for c in out["status"]["conditions"]}
    assert merged == {
        **{c["type"]: c["status"] for c in existing},
        **{c["type"]: c["status"] for c in patch},
    }
    assert len(out["status"]["conditions"]) == len(merged)
    assert strategic_merge_patch(out, {"status": {"conditions": patch}}, "Node") == out
