"""`services.falco.isolations.ended`: whether a recorded isolation still holds, pure."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from schemas.falco import ISOLATE_LABEL
from services.falco.isolations import ended
from services.falco.state import ISOLATIONS, IsolationRecord, isolation_key

NOW = datetime(2026, 8, 20, 14, 30, tzinfo=UTC)


def record(**changes: Any) -> IsolationRecord:
    base: dict[str, Any] = {
        "namespace": "ml-vision",
        "pod": "train-0",
        "uid": "uid-1",
        "node": "gpu-node-07",
        "falco_rule": "Drop and execute new binary in container",
        "policy": "critical-contain",
        "event_id": "e-1",
        "event_time": datetime(2026, 8, 20, 14, 11, tzinfo=UTC),
        "at": datetime(2026, 8, 20, 14, 11, 5, tzinfo=UTC),
    }
    return IsolationRecord.model_validate(base | changes)


def pod(uid: str = "uid-1", *, labelled: bool = True, phase: str = "Running", **status: str) -> Any:
    labels = {"app": "train", **({ISOLATE_LABEL: "true"} if labelled else {})}
    return {
        "metadata": {
            "name": "train-0",
            "namespace": "ml-vision",
            "uid": uid,
            "labels": labels,
            "creationTimestamp": "2026-08-20T14:20:00Z",
        },
        "status": {"phase": phase, **status},
    }


def test_the_isolated_pod_still_labelled_holds() -> None:
    assert ended(record(), pod(), NOW) is None
    assert ended(record(), pod(phase="Pending"), NOW) is None


def test_a_pod_gone_from_the_api_ends_it() -> None:
    why = ended(record(), None, NOW)
    assert why is not None and why.guard == "pod_gone" and why.details == {"pod_gone": "deleted"}
    assert why.reason == (
        "ml-vision/train-0: the isolated pod is gone (deleted or evicted: not in the API at "
        "2026-08-20T14:30:00Z); its isolation record ends"
    )


def test_a_pod_of_the_same_name_and_another_uid_is_not_the_isolated_one() -> None:
    why = ended(record(), pod("uid-2"), NOW)
    assert why is not None and why.guard == "pod_gone"
    assert why.details == {"pod_gone": "replaced", "new_pod_uid": "uid-2"}
    assert "the isolated pod (uid uid-1) is gone" in why.reason and "uid uid-2" in why.reason
    # Even when the successor carries the label (a manifest copied whole): another pod.
    assert ended(record(), pod("uid-2", labelled=True), NOW) is not None


@pytest.mark.parametrize("phase", ["Failed", "Succeeded"])
def test_a_pod_that_ended_ends_it(phase: str) -> None:
    why = ended(record(), pod(phase=phase, reason="Evicted"), NOW)
    assert why is not None and why.guard == "pod_gone"
    assert why.details == {"pod_gone": "ended", "phase": phase}
    assert f"(phase {phase}: Evicted)" in why.reason


def test_a_label_removed_by_someone_else_ends_it_but_not_a_dry_runs() -> None:
    why = ended(record(), pod(labelled=False), NOW)
    assert why is not None and why.guard == "label_removed"
    assert f"its {ISOLATE_LABEL}=true label was removed, not by nodeward" in why.reason
    # A dry run never labelled the pod: only the pod's going ends its record.
    assert ended(record(dry_run=True), pod(labelled=False), NOW) is None
    assert ended(record(dry_run=True), None, NOW) is not None


def test_records_live_beside_the_cordon_intents_under_their_own_prefix() -> None:
    key = isolation_key("ml-vision", "web.v2-0")
    assert key == "isolations.ml-vision.web_v2-0" and ISOLATIONS.holds(key)
    assert not ISOLATIONS.holds("marks.gpu-node-07")
    assert ISOLATIONS.load(record().model_dump_json()) == record()
