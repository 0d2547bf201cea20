"""What a recovery drains (`services.recovery.scope`): a reset only the failed GPUs'
holders, where the quarantine names them all; a reboot, or holders not known, the node.
Also where the holders come from (the agent's pod-resources answer, cordon's audit), the
maintenance's scope, and the docs' table, held to the catalog."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime
from typing import Any

import pytest

from agents.sources.podresources import dynamic_claims, parse_list_response
from nodeward.protowire import field_bytes
from schemas.common import PodRef
from schemas.gpu import GpuHealth, HealthState, MigInstance
from schemas.maintenance import Maintenance, MaintenancePhase
from schemas.xid import load_catalog
from services.cordon.service import holder_details
from services.kernel import in_scope
from services.maintenance.state import MaintenanceState
from services.recovery.scope import RESET_DRAINS_LABEL, drain_scope, drain_table, reset_drains
from services.recovery.state import Plan, RecoveryRecord
from tests.conftest import REPO

HOLDERS = {"3": ["ml/a", "ml/b"], "5": ["ml/c"], "6": []}


@pytest.mark.parametrize(
    ("plan", "gpus", "holders", "drains", "pods", "why"),
    [
        (Plan.RESET, [3], HOLDERS, "gpu", ["ml/a", "ml/b"], "only its 2 pod(s)"),
        (Plan.RESET, [3, 5], HOLDERS, "gpu", ["ml/a", "ml/b", "ml/c"], "GPU 3, 5 reset"),
        (Plan.RESET, [6], HOLDERS, "gpu", [], "only its 0 pod(s)"),  # held by none: known
        (Plan.REBOOT, [3], HOLDERS, "gpu", None, "a reboot drains the whole node"),
        (Plan.RESET, [3], HOLDERS, "node", None, "drains the whole node here"),
        (Plan.RESET, [3], None, "gpu", None, "not known"),  # an older cordon: none named
        (Plan.RESET, [3, 4], HOLDERS, "gpu", None, "not known"),  # GPU 4's not named
        (Plan.RESET, [3], {"3": "ml/a"}, "gpu", None, "not known"),  # not a list
        (Plan.RESET, [3], {"3": ["a"]}, "gpu", None, "not known"),  # not namespace/name
        (Plan.RESET, [], HOLDERS, "gpu", None, "not named"),
    ],
)
def test_a_reset_drains_the_failed_gpus_holders_and_nothing_else_is_ever_partial(
    plan: Plan, gpus: list[int], holders: Any, drains: Any, pods: list[str] | None, why: str
) -> None:
    scope = drain_scope(plan, gpus, holders, drains, "said")
    assert scope.pods == pods
    assert why in scope.why
    if pods is None:
        assert "whole node" in scope.why


@pytest.mark.parametrize(
    ("label", "default", "drains"),
    [
        (None, "gpu", "gpu"),
        (None, "node", "node"),
        ("node", "gpu", "node"),
        ("gpu", "node", "gpu"),
        ("all", "gpu", "node"),  # neither word: the node, never a guess
    ],
)
def test_a_nodes_label_overrides_the_setting(label: str | None, default: Any, drains: str) -> None:
    labels = {RESET_DRAINS_LABEL: label} if label else {}
    got, said = reset_drains({"metadata": {"labels": labels}}, default)
    assert got == drains
    assert (RESET_DRAINS_LABEL in said) == (label is not None)


def test_the_record_scopes_a_reset_only() -> None:
    now = time.time()
    record = RecoveryRecord(
        node="n", incident="i", plan=Plan.RESET, remediator="gpu-reset",
        started_at=now, updated_at=now, drain_pods=["ml/a"],
    )  # fmt: skip
    assert record.scope() == ["ml/a"]
    # A reset that grew into a reboot: the whole node's rule, whatever was asked.
    assert record.model_copy(update={"plan": Plan.REBOOT}).scope() is None
    assert record.model_copy(update={"drain_pods": None}).scope() is None
    # A record stored before the field: the whole node.
    old = record.model_dump(mode="json")
    old.pop("drain_pods")
    assert RecoveryRecord.model_validate(old).scope() is None


def test_the_kernels_scope_counts_the_pods_named_only() -> None:
    pod = {"metadata": {"namespace": "ml", "name": "a"}}
    assert in_scope(pod, None)
    assert in_scope(pod, {"ml/a"})
    assert not in_scope(pod, {"ml/b"})
    assert not in_scope(pod, [])


def _health(holders: list[PodRef] | None, *, mig: MigInstance | None = None) -> GpuHealth:
    return GpuHealth(
        node="n1", gpu_index=3, gpu_uuid="GPU-3", mig=mig, state=HealthState.FAILED,
        holders=holders, observed_at=datetime.now(UTC),
    )  # fmt: skip


def test_cordons_audit_names_the_physical_gpus_holders_or_nothing() -> None:
    held = [PodRef(namespace="ml", name="a"), PodRef(namespace="ml", name="b")]
    assert holder_details(_health(held)) == {"holders": {"3": ["ml/a", "ml/b"]}}
    mig = MigInstance(gpu_instance_id=1, compute_instance_id=0)
    assert holder_details(_health(held, mig=mig)) == {"holders": {"3": ["ml/a", "ml/b"]}}
    assert holder_details(_health([])) == {"holders": {"3": []}}  # known: none
    assert holder_details(_health(None)) == {}  # not known: the recovery drains the node


def test_an_event_from_an_older_agent_has_no_holders() -> None:
    raw = _health(None).model_dump(mode="json")
    raw.pop("holders")
    assert GpuHealth.model_validate(raw).holders is None


def _container(name: str, *fields: bytes) -> bytes:
    return field_bytes(1, name) + b"".join(fields)


def test_a_pod_resources_answer_with_a_dra_claim_is_not_a_full_one() -> None:
    devices = field_bytes(2, field_bytes(1, "nvidia.com/gpu") + field_bytes(2, "GPU-aaa::1"))
    plain = field_bytes(3, _container("c", devices))
    claim = field_bytes(3, _container("d", field_bytes(5, field_bytes(2, "gpu-claim"))))
    pod = field_bytes(1, "p") + field_bytes(2, "ml")
    body = field_bytes(1, pod + plain)
    assert dynamic_claims(body) == 0
    assert parse_list_response(body) == {
        "GPU-aaa": [PodRef(namespace="ml", name="p", container="c")]
    }
    assert dynamic_claims(field_bytes(1, pod + plain + claim)) == 1


def test_a_maintenance_request_without_a_scope_is_the_whole_node() -> None:
    request = Maintenance(
        node="n1", phase=MaintenancePhase.REQUESTED, maintenance_id="m1"
    ).model_dump(mode="json")
    assert request["pods"] is None and request["drained"] is None
    request.pop("pods")
    request.pop("drained")
    assert Maintenance.model_validate(request).pods is None  # an older requester's
    now = datetime.now(UTC)
    state = MaintenanceState(
        maintenance_id="m1", node="n1", requested_at=now, trigger_id="t", start_at=now,
        deadline_s=60,
    )  # fmt: skip
    assert state.scope_keys() is None
    scoped = state.model_copy(update={"scope": [PodRef(namespace="ml", name="a")]})
    assert scoped.scope_keys() == {"ml/a"}


def test_the_docs_table_of_what_each_xid_drains_is_the_catalogs() -> None:
    doc = (REPO / "docs/services/recovery.md").read_text()
    found = re.search(r"<!-- drain-table -->\n(.*?)\n<!-- /drain-table -->", doc, re.S)
    assert found, "docs/services/recovery.md: no drain table between its markers"
    table = drain_table(load_catalog())
    assert found.group(1) == table, f"the table should read:\n{table}"
    assert "| `reset_gpu` | GPU reset | the failed GPU's pods only (partial) |" in table
    assert re.search(r"`reboot_node` \| reboot \| the whole node \| .*\b79\b", table)
