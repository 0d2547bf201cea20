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


def test_the_event_that_reaches_the_count_reports_and_so_does_its_redelivery() -> None:
    from services.cordon.xids import decide

    r, told = decide(None, 100.0, "e1", window=600, count=3, now=100.0)
    r, told2 = decide(r, 110.0, "e2", window=600, count=3, now=110.0)
    assert (told, told2) == (False, False)
    r, third = decide(r, 120.0, "e3", window=600, count=3, now=120.0)
    assert third and r.reported_by == "e3"
    # Its report failed and e3 comes again: it reports again (same ids: stored once).
    r, again = decide(r, 120.0, "e3", window=600, count=3, now=125.0)
    assert again and r.event_ids == ["e1", "e2", "e3"]
    # A fourth within the window reports nothing new.
    r, fourth = decide(r, 130.0, "e4", window=600, count=3, now=130.0)
    assert not fourth
