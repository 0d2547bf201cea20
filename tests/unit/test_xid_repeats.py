"""Counting one XID on one GPU within the window (pure)."""

from __future__ import annotations

from services.cordon.xids import counted


def test_counts_within_the_window_once_per_event() -> None:
    r = counted(None, 100.0, "e1", 600)
    r = counted(r, 150.0, "e2", 600)
    r = counted(r, 150.0, "e2", 600)  # a redelivery counts once
    assert r.event_ids == ["e1", "e2"] and r.reported_at is None
    r = counted(r, 720.0, "e3", 600)  # e1 (t=100) has left the window
    assert r.event_ids == ["e2", "e3"]


def test_a_report_is_forgotten_once_its_window_has_passed() -> None:
    r = counted(None, 100.0, "e1", 600).model_copy(update={"reported_at": 100.0})
    assert counted(r, 500.0, "e2", 600).reported_at == 100.0
    assert counted(r, 701.0, "e3", 600).reported_at is None
