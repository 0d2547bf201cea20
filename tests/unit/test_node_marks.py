"""NodeMarks' pure planning: prior state, several owners, an operator's act vs our own undo."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from nodeward.failpoints import Failpoints, Term, parse
from schemas.state.marks import MarkSpec
from services.kernel.marks import (
    MARKS_ANNOTATION,
    apply_patch,
    entries,
    operator_act,
    plan,
    release_patch,
    respect_patch,
)

Q = MarkSpec(
    taints=["nodeward.io/gpu-unhealthy:NoSchedule"],
    cordon=True,
    labels={"nodeward.io/gpu-health": "failed"},
    annotations={"nodeward.io/quarantine": "{}"},
)
F = MarkSpec(taints=["nodeward.io/falco:NoSchedule"], cordon=True)


def node(*, unschedulable: bool = False, taints: list[dict[str, Any]] | None = None) -> Any:
    spec: dict[str, Any] = {}
    if unschedulable:
        spec["unschedulable"] = True
    if taints:
        spec["taints"] = taints
    return {
        "metadata": {"name": "n1", "labels": {"zone": "a"}, "annotations": {"keep": "me"}},
        "spec": spec,
    }


def patched(obj: Any, patch: Any) -> Any:
    """The node after a merge patch (None removes), as the API server would store it."""
    out = copy.deepcopy(obj)
    if patch is None:
        return out
    for key, value in (patch.get("spec") or {}).items():
        if value is None:
            out["spec"].pop(key, None)
        else:
            out["spec"][key] = value
    for part in ("labels", "annotations"):
        for key, value in ((patch.get("metadata") or {}).get(part) or {}).items():
            if value is None:
                out["metadata"][part].pop(key, None)
            else:
                out["metadata"][part][key] = value
    return out


def hold(obj: Any, owner: str, spec: MarkSpec) -> tuple[Any, Any]:
    entry = plan(obj, owner, f"inc-{owner}", spec)
    return patched(obj, apply_patch(obj, owner, entry, spec)), entry


def let_go(obj: Any, owner: str, entry: Any, spec: MarkSpec) -> Any:
    patch, _ = release_patch(obj, owner, entry, spec)
    return patched(obj, patch)


def test_apply_then_release_restores_the_node_exactly() -> None:
    before = node()
    after, entry = hold(before, "quarantine", Q)
    assert after["spec"] == {
        "unschedulable": True,
        "taints": [{"key": "nodeward.io/gpu-unhealthy", "effect": "NoSchedule"}],
    }
    assert entry.prior_unschedulable is False and entry.cordon
    assert after["metadata"]["labels"]["nodeward.io/gpu-health"] == "failed"
    assert json.loads(after["metadata"]["annotations"][MARKS_ANNOTATION])["quarantine"]
    assert let_go(after, "quarantine", entry, Q) == before


def test_applying_again_changes_nothing() -> None:
    after, entry = hold(node(), "quarantine", Q)
    assert apply_patch(after, "quarantine", entry, Q) is None


def test_release_removes_taint_and_cordon_in_one_patch() -> None:
    after, entry = hold(node(), "quarantine", Q)
    patch, what = release_patch(after, "quarantine", entry, Q)
    assert patch is not None
    assert patch["spec"] == {"taints": None, "unschedulable": None}
    assert MARKS_ANNOTATION in patch["metadata"]["annotations"]
    assert what["uncordoned"] and what["removed_taints"] == ["nodeward.io/gpu-unhealthy:NoSchedule"]


def test_a_node_cordoned_before_us_stays_cordoned() -> None:
    after, entry = hold(node(unschedulable=True), "quarantine", Q)
    assert entry.prior_unschedulable is True
    released = let_go(after, "quarantine", entry, Q)
    assert released["spec"] == {"unschedulable": True}


def test_a_taint_that_was_there_is_not_ours() -> None:
    theirs = [{"key": "nodeward.io/gpu-unhealthy", "effect": "NoSchedule"}]
    after, entry = hold(node(taints=theirs), "quarantine", Q)
    assert entry.taints == []
    assert let_go(after, "quarantine", entry, Q)["spec"]["taints"] == theirs


def test_uncordon_only_when_no_other_owner_holds_a_cordon() -> None:
    one, q = hold(node(), "quarantine", Q)
    two, f = hold(one, "falco", F)
    assert f.prior_unschedulable is False  # inherited: the cordon is nodeward's, not an operator's
    three = let_go(two, "quarantine", q, Q)
    assert three["spec"] == {
        "unschedulable": True,
        "taints": [{"key": "nodeward.io/falco", "effect": "NoSchedule"}],
    }
    assert set(entries(three)) == {"falco"}
    four = let_go(three, "falco", f, F)
    assert four == node()


def test_an_operator_cordon_is_inherited_by_a_later_owner() -> None:
    one, f = hold(node(unschedulable=True), "falco", F)
    two, q = hold(one, "quarantine", Q)
    assert q.prior_unschedulable is True
    three = let_go(let_go(two, "falco", f, F), "quarantine", q, Q)
    assert three["spec"] == {"unschedulable": True}


def test_a_shared_taint_stays_until_its_last_owner_lets_go() -> None:
    shared = MarkSpec(taints=["nodeward.io/gpu-unhealthy:NoSchedule"])
    one, q = hold(node(), "quarantine", Q)
    two, m = hold(one, "maintenance", shared)
    assert m.taints == ["nodeward.io/gpu-unhealthy:NoSchedule"]
    three = let_go(two, "quarantine", q, Q)
    assert three["spec"]["taints"] == [{"key": "nodeward.io/gpu-unhealthy", "effect": "NoSchedule"}]
    assert "unschedulable" not in three["spec"]
    assert "taints" not in let_go(three, "maintenance", m, shared)["spec"]


def test_operator_acts_are_seen_only_against_marks_still_on_the_node() -> None:
    after, entry = hold(node(), "quarantine", Q)
    assert operator_act(after, "quarantine", entry) is None
    uncordoned = copy.deepcopy(after)
    del uncordoned["spec"]["unschedulable"]
    assert operator_act(uncordoned, "quarantine", entry) == "uncordoned"
    untainted = copy.deepcopy(after)
    del untainted["spec"]["taints"]
    assert "removed taint" in (operator_act(untainted, "quarantine", entry) or "")


def test_our_half_done_release_is_finished_not_read_as_an_operator() -> None:
    """After the release PATCH (entry gone with the marks) a retry has nothing left to do."""
    after, entry = hold(node(), "quarantine", Q)
    released = let_go(after, "quarantine", entry, Q)
    patch, what = release_patch(released, "quarantine", entry, Q)
    assert patch is None and not what["uncordoned"]


def test_respecting_an_operator_keeps_their_cordon_and_drops_our_claim() -> None:
    after, entry = hold(node(), "quarantine", Q)
    untainted = copy.deepcopy(after)
    del untainted["spec"]["unschedulable"]  # the operator uncordoned
    respected = patched(untainted, respect_patch(untainted, "quarantine", entry))
    assert "taints" not in respected["spec"] and "unschedulable" not in respected["spec"]
    held = entries(respected)["quarantine"]
    assert not held.cordon and held.taints == []
    assert "nodeward.io/quarantine" not in respected["metadata"]["annotations"]
    # An operator who cordons again later is not undone by our release.
    respected["spec"]["unschedulable"] = True
    assert let_go(respected, "quarantine", held, Q)["spec"] == {"unschedulable": True}


def test_failpoint_terms() -> None:
    assert parse("marks.apply.patched") == {"marks.apply.patched": Term(1)}
    assert parse("a=nth:3, nth:2") == {"a": Term(3), "*": Term(2)}
    with pytest.raises(ValueError):
        parse("a=panic")
    points = Failpoints({"never": Term(1)})
    points.hit("other")  # not armed for it: nothing happens
    assert points.seen["other"] == 1


def test_a_cordon_claim_an_operator_lifted_does_not_keep_a_later_cordon() -> None:
    """Maintenance cordons and is done; the operator uncordons; a quarantine later cordons:
    its release uncordons, the stale maintenance claim notwithstanding."""
    one, _ = hold(node(), "maintenance", F)
    one["spec"].pop("unschedulable")  # the operator, after the work
    two, q = hold(one, "quarantine", Q)
    assert q.prior_unschedulable is False
    assert entries(two)["maintenance"].cordon is False
    assert "unschedulable" not in let_go(two, "quarantine", q, Q)["spec"]


def test_a_new_incident_keeps_the_prior_state_of_the_one_it_supersedes() -> None:
    from services.kernel.marks import supersede

    one, first = hold(node(), "quarantine", Q)
    again = plan(one, "quarantine", "inc-2", Q)
    assert again.prior_unschedulable is True  # alone it would read our cordon as a prior one
    merged = supersede(first, again, operator_released=False)
    assert merged.prior_unschedulable is False and merged.incident == "inc-2"
    assert merged.taints == first.taints and merged.labels == {"nodeward.io/gpu-health": None}


def test_every_service_that_removes_nodes_shares_one_breaker_window() -> None:
    from launch.access import GRANTS
    from nodeward.bus.provision import SHARED_BUCKETS
    from services.cordon.service import CordonSettings
    from services.falco.settings import FalcoSettings
    from services.maintenance.service import CheckpointSettings

    buckets = {
        CordonSettings().breaker.bucket,
        FalcoSettings().breaker.bucket,
        CheckpointSettings().breaker.bucket,
    }
    assert buckets == {"breaker"} and "breaker" in SHARED_BUCKETS
    for service in ("cordon", "falco", "checkpoint"):
        assert "breaker" in GRANTS[service].buckets
