"""Pure parts of maintenance: GPUs a pod holds, `--at`, and the restore plan."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import typer

from schemas.common import PodRef
from schemas.maintenance import CheckpointRecord
from services.maintenance.cli import parse_at, render_restore
from services.maintenance.plan import gpus_of
from services.maintenance.restore import restorable, restore_plan
from services.maintenance.state import MaintenanceState, PodPlan, PodStatus

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def _pod(resources: dict[str, dict[str, str]]) -> dict[str, object]:
    return {"spec": {"containers": [{"name": "a", "resources": resources}, {"name": "b"}]}}


def test_gpus_count_nvidia_amd_and_mig_slices_not_cpu() -> None:
    assert gpus_of(_pod({"limits": {"nvidia.com/gpu": "2", "cpu": "4"}})) == 2
    assert gpus_of(_pod({"limits": {"nvidia.com/mig-1g.10gb": "1"}})) == 1
    assert gpus_of(_pod({"requests": {"amd.com/gpu": "1"}, "limits": {"amd.com/gpu": "1"}})) == 1
    assert gpus_of(_pod({"limits": {"memory": "1Gi"}})) == 0


def test_at_takes_a_time_or_a_duration_and_refuses_the_rest() -> None:
    assert parse_at(None, NOW) is None and parse_at("now", NOW) is None
    assert parse_at("10m", NOW) == NOW + timedelta(minutes=10)
    assert parse_at("2026-12-01T18:00:00Z", NOW) == datetime(2026, 12, 1, 18, tzinfo=UTC)
    assert parse_at("2026-12-01T18:00:00", NOW) == datetime(2026, 12, 1, 18, tzinfo=UTC)
    with pytest.raises(typer.BadParameter, match="neither a time"):
        parse_at("tomorrow-ish", NOW)


def test_restore_plan_builds_one_image_per_container_and_a_pod_on_a_cuda_node() -> None:
    records = [
        CheckpointRecord(
            pod=PodRef(namespace="ns", name="p-0", container=c),
            path=f"/var/lib/kubelet/checkpoints/checkpoint-p-0_ns-{c}-x.tar",
            node="n1",
            image=f"img/{c}:1",
            at=NOW,
        )
        for c in ("main", "sidecar")
    ]
    plan = PodPlan(
        namespace="ns",
        name="p-0",
        gpus=1,
        opted_in=True,
        status="checkpointed",
        checkpoints=records,
        spec={"nodeName": "n1", "containers": [{"name": "main", "image": "img/main:1"}]},
        labels={"app": "p", "pod-template-hash": "abc"},
    )
    state = MaintenanceState(
        maintenance_id="mnt-1",
        node="n1",
        requested_at=NOW,
        trigger_id="t",
        start_at=NOW,
        deadline_s=60,
        pods={plan.key: plan},
    )
    result = restore_plan(state, plan, "reg/x/")
    assert [b["image"] for b in result["builds"]] == [
        "reg/x/checkpoint-ns-p-0-main:20261129120000",
        "reg/x/checkpoint-ns-p-0-sidecar:20261129120000",
    ]
    assert (
        "--annotation=io.kubernetes.cri-o.annotations.checkpoint.name=sidecar $newcontainer"
        in (result["builds"][1]["commands"][2])
    )
    spec = result["manifest"]["spec"]
    assert "nodeName" not in spec and spec["nodeSelector"] == {
        "nodeward.io/cuda-checkpoint": "true"
    }
    assert spec["containers"][0]["image"] == "reg/x/checkpoint-ns-p-0-main:20261129120000"
    assert "pod-template-hash" not in result["manifest"]["metadata"]["labels"]
    text = render_restore(result)
    assert text.startswith("# Restore plan for ns/p-0") and "kubectl apply -f - <<'EOF'" in text


def test_the_newest_maintenance_that_checkpointed_the_pod_is_restored_else_why_not() -> None:
    def state(mid: str, at: datetime, status: PodStatus, checkpoints: int) -> MaintenanceState:
        record = CheckpointRecord(pod=PodRef(namespace="ns", name="p-0", container="main"))
        plan = PodPlan(
            namespace="ns",
            name="p-0",
            opted_in=True,
            status=status,
            checkpoints=[record] * checkpoints,
        )
        return MaintenanceState(
            maintenance_id=mid,
            node="n1",
            requested_at=at,
            trigger_id=mid,
            start_at=at,
            deadline_s=60,
            pods={plan.key: plan},
        )

    old = state("old", NOW - timedelta(days=1), "checkpointed", 1)
    new = state("new", NOW, "checkpointed", 1)
    failed = state("failed", NOW + timedelta(hours=1), "failed", 0)
    found = restorable([old, failed, new], "ns/p-0")
    assert not isinstance(found, str) and found[0].maintenance_id == "new"
    assert restorable([failed], "ns/p-0") == "pod ns/p-0 has no recorded checkpoint: failed"
    assert restorable([old], "ns/q-1") == "no checkpoint recorded for pod ns/q-1"
