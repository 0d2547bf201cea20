"""The pure parts of moving a pod through its owner: the set as it is created again, whether
its controller has let an ordinal go, the controller reference handed over."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from services.maintenance.owners import (
    MOVING_ANNOTATION,
    _wants,
    controller_ref,
    ordinal,
    recorded,
    reference,
    stop_of,
)
from services.maintenance.plan import move_failed
from services.maintenance.state import MaintenanceState, PodPlan


def _sts(replicas: int, generation: int = 2, observed: int = 2) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {
            "name": "db",
            "namespace": "ml",
            "uid": "s-1",
            "resourceVersion": "42",
            "generation": generation,
            "creationTimestamp": "2026-12-05T10:00:00Z",
            "managedFields": [{"manager": "kubectl"}],
            "labels": {"app": "db"},
            "annotations": {"team": "ml"},
        },
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "db"}}},
        "status": {"observedGeneration": observed, "replicas": replicas},
    }


def test_the_set_is_recorded_without_what_the_server_sets() -> None:
    kept = recorded(_sts(1))
    assert kept == {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {
            "name": "db",
            "namespace": "ml",
            "labels": {"app": "db"},
            "annotations": {"team": "ml"},
        },
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "db"}}},
    }


def test_an_ordinal_is_let_go_only_once_the_controller_saw_the_replicas() -> None:
    assert _wants(_sts(0, generation=3, observed=2), 0) is None  # not observed yet
    assert _wants(_sts(0), 0) is False
    assert _wants(_sts(1), 0) is True
    assert _wants(_sts(2), 1) is True and _wants(_sts(1), 1) is False
    assert ordinal("db-0") == 0 and ordinal("my-set-12") == 12


def test_the_reference_handed_over_is_a_controller_without_block_owner_deletion() -> None:
    ref = reference(_sts(1))
    assert ref == {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "name": "db",
        "uid": "s-1",
        "controller": True,
    }
    pod = {"metadata": {"ownerReferences": [{"uid": "x"}, ref]}}
    assert controller_ref(pod) == ref and controller_ref({"metadata": {}}) is None


def test_only_the_stop_this_maintenance_set_is_its_own() -> None:
    mark = {MOVING_ANNOTATION: "mnt-1/2026-12-05T10:00:00Z"}
    assert stop_of(mark, "mnt-1") == "2026-12-05T10:00:00Z"
    assert stop_of(mark, "mnt-2") is None
    assert stop_of({MOVING_ANNOTATION: "mnt-1"}, "mnt-1") is None  # no value recorded
    assert stop_of({}, "mnt-1") is None


def test_what_the_owner_is_told_when_a_move_through_its_owner_fails() -> None:
    at = datetime(2026, 12, 5, 10, 0, tzinfo=UTC)
    state = MaintenanceState(
        maintenance_id="mnt-1",
        node="gpu-1",
        trigger_id="t-1",
        requested_at=at,
        start_at=at,
        deadline_s=60,
    )
    plan = PodPlan(namespace="ml", name="lab-0")
    fresh = move_failed(state, plan, "RunContainerError", stopped=True, restarted_by="Notebook lab")
    assert "starts it again from its template" in fresh.body and "memory is lost" in fresh.body
    assert not any("maintenance restore" in step for step in fresh.steps)
    stays = move_failed(state, plan, "RunContainerError", stopped=True, left_stopped="lab")
    assert "stays stopped" in stays.body
    assert stays.steps == ["Start Notebook lab again when you need it."]
