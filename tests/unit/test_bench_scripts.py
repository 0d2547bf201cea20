"""Bench scripts are not run by the suite; at least they must compile without warnings
(a compile-time SyntaxWarning such as "'str' object is not callable" is a certain crash)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from tests.conftest import REPO

BENCHES = sorted((REPO / "bench").glob("*.py"))


@pytest.mark.parametrize("path", BENCHES, ids=lambda p: p.name)
def test_bench_compiles_cleanly(path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compile(path.read_text(), str(path), "exec")


def test_there_are_benches() -> None:
    assert len(BENCHES) >= 5
