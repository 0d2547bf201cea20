"""Failpoints that raise, and failpoints armed through a file at a moment a test chooses."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodeward.failpoints import FILE_ENV, FailpointError, Failpoints, Term, parse


def test_raise_terms() -> None:
    assert parse("cordon.reconcile=raise") == {"cordon.reconcile": Term(1, raises=True)}
    assert parse("x=raise:nth:2") == {"x": Term(2, raises=True)}
    with pytest.raises(ValueError, match="expected nth:N, raise or raise:nth:N"):
        parse("x=raise:twice")


def test_a_raising_point_raises_on_its_nth_hit_only() -> None:
    points = Failpoints(parse("x=raise:nth:2"))
    points.hit("x")
    with pytest.raises(FailpointError, match="failpoint x"):
        points.hit("x")
    points.hit("x")  # the third time: not armed for it


def test_a_point_armed_through_the_file_fires_once_from_when_it_is_written(
    tmp_path: Path,
) -> None:
    armed = tmp_path / "failpoints"
    points = Failpoints.from_env({FILE_ENV: str(armed)})
    points.hit("x")  # no file: nothing armed
    points.hit("x")
    armed.write_text("x=raise\n")
    points.hit("y")  # another point
    with pytest.raises(FailpointError, match="failpoint x"):
        points.hit("x")  # its first hit since the file was written
    assert not armed.exists()  # fired, so disarmed
    points.hit("x")
