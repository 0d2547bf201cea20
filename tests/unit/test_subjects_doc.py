"""docs/subjects.md lists every registered subject pattern with its type and stream."""

from __future__ import annotations

import re

from schemas import REGISTRY
from schemas.streams import STREAMS
from tests.conftest import REPO

ROW = re.compile(r"^\| `(?P<subject>[^`]+)` \| `(?P<type>[^`]+)` \| (?P<stream>[A-Z]+) \|", re.M)


def test_every_registered_subject_is_documented_with_its_stream() -> None:
    text = (REPO / "docs" / "subjects.md").read_text()
    rows = {m["subject"]: (m["type"], m["stream"]) for m in ROW.finditer(text)}
    expected = {et.subject_pattern: (et.name, et.stream.name) for et in REGISTRY.values()}
    assert rows == expected
    assert {spec.name for spec in STREAMS} == {stream for _, stream in rows.values()}


def test_the_readme_links_it() -> None:
    assert "docs/subjects.md" in (REPO / "README.md").read_text()


def test_every_operator_control_subject_is_documented() -> None:
    from launch.access import GRANTS
    from schemas.control import control_subject

    text = (REPO / "docs" / "subjects.md").read_text()
    declared = {control_subject(s, verb) for s, g in GRANTS.items() for verb in g.controls}
    assert declared
    documented = set(re.findall(r"`(control\.[a-z-]+\.[a-z-]+)`", text))
    assert documented == declared
