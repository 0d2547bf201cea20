"""The culler's policy: defaults, kinds, namespace annotations, keep-until."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from services.culler.policy import CullPolicy, keep_until


def ns(**annotations: str) -> dict[str, object]:
    return {"metadata": {"name": "user-a", "annotations": annotations}}


def test_defaults_and_kind_override() -> None:
    policy = CullPolicy(warn_after="1h", cull_after="2h", kinds={"ssh": {"cull_after": "3h"}})
    nb = policy.limits("notebook")
    assert (nb.warn_after, nb.cull_after, nb.source) == (
        timedelta(hours=1),
        timedelta(hours=2),
        "defaults",
    )
    ssh = policy.limits("ssh")
    assert ssh.cull_after == timedelta(hours=3) and ssh.lead == timedelta(hours=2)


def test_namespace_annotations_override_and_can_turn_culling_off() -> None:
    policy = CullPolicy(warn_after="1h", cull_after="2h")
    limits = policy.limits(
        "notebook",
        ns(**{"nodeward.io/idle-warn-after": "30m", "nodeward.io/idle-cull-after": "45m"}),
    )
    assert limits.warn_after == timedelta(minutes=30) and limits.cull_after == timedelta(minutes=45)
    assert limits.source == "namespace user-a"
    off = policy.limits("notebook", ns(**{"nodeward.io/idle-cull-after": "off"}))
    assert not off.enabled


def test_bad_namespace_annotations_are_reported_and_defaults_apply() -> None:
    policy = CullPolicy(warn_after="1h", cull_after="2h")
    limits = policy.limits("notebook", ns(**{"nodeward.io/idle-warn-after": "soon"}))
    assert limits.warn_after == timedelta(hours=1)
    assert "soon" in limits.problems[0]
    swapped = policy.limits("notebook", ns(**{"nodeward.io/idle-warn-after": "5h"}))
    assert (swapped.warn_after, swapped.cull_after) == (timedelta(hours=1), timedelta(hours=2))
    assert "not longer" in swapped.problems[0]


def test_cull_must_come_after_warn() -> None:
    with pytest.raises(ValidationError, match="must be longer"):
        CullPolicy(warn_after="2h", cull_after="1h")


def test_keep_until_takes_the_latest_and_reports_garbage() -> None:
    pod = {
        "metadata": {"name": "p", "annotations": {"nodeward.io/keep-until": "2026-12-01T18:00:00Z"}}
    }
    nb = {
        "metadata": {"name": "n", "annotations": {"nodeward.io/keep-until": "2026-12-02T08:00:00"}}
    }
    latest, problem = keep_until(pod, nb)
    assert latest == datetime(2026, 12, 2, 8, tzinfo=UTC) and problem is None
    bad = {"metadata": {"name": "p", "annotations": {"nodeward.io/keep-until": "tomorrow"}}}
    latest, problem = keep_until(bad, None)
    assert latest is None and problem is not None and "tomorrow" in problem
