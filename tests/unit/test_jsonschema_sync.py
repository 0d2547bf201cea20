"""`schemas/json/` is exactly what a fresh export writes; the export is stable and tidy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nodeward.schemas_export import export, main, render, rendered
from schemas import REGISTRY
from schemas.jsonschema import INDEX_FILE, all_documents

COMMITTED = Path(__file__).resolve().parents[2] / "schemas" / "json"


def test_committed_schemas_match_a_fresh_export() -> None:
    expected = rendered()
    on_disk = {p.name: p.read_text(encoding="utf-8") for p in COMMITTED.glob("*.json")}
    missing = sorted(set(expected) - set(on_disk))
    extra = sorted(set(on_disk) - set(expected))
    differ = sorted(n for n in set(expected) & set(on_disk) if expected[n] != on_disk[n])
    problems = [
        f"{label}: {', '.join(names)}"
        for label, names in (("missing", missing), ("stale", extra), ("different", differ))
        if names
    ]
    assert not problems, (
        f"schemas/json/ is out of date with schemas/ ({'; '.join(problems)}): run `make schemas`"
        " and commit the result"
    )


def test_export_writes_every_type_and_the_index(tmp_path: Path) -> None:
    out = tmp_path / "nested" / "dir"
    paths = export(out)
    assert paths == sorted(paths)
    assert {p.name for p in paths} == {f"{n}.json" for n in REGISTRY} | {INDEX_FILE}
    for path in paths:
        text = path.read_text(encoding="utf-8")
        assert (
            text.endswith("}\n")
            and text == json.dumps(json.loads(text), indent=2, sort_keys=True) + "\n"
        )
    index = json.loads((out / INDEX_FILE).read_text())
    assert {t: e["file"] for t, e in index["types"].items()} == {n: f"{n}.json" for n in REGISTRY}
    before = {p: p.read_bytes() for p in paths}
    mtimes = {p: p.stat().st_mtime_ns for p in paths}
    assert export(out) == paths
    assert {p: p.read_bytes() for p in paths} == before
    assert {p: p.stat().st_mtime_ns for p in paths} == mtimes  # unchanged files are not rewritten


def test_export_removes_only_files_an_earlier_export_wrote(tmp_path: Path) -> None:
    old_index = {"types": {"gone.v1": {"file": "gone.v1.json"}}}
    (tmp_path / INDEX_FILE).write_text(json.dumps(old_index))
    (tmp_path / "gone.v1.json").write_text("{}")
    (tmp_path / "mine.json").write_text("{}")
    export(tmp_path)
    assert not (tmp_path / "gone.v1.json").exists()
    assert (tmp_path / "mine.json").exists()


def test_export_ignores_a_foreign_index(tmp_path: Path) -> None:
    (tmp_path / INDEX_FILE).write_text("[1, 2")
    assert len(export(tmp_path)) == len(REGISTRY) + 1


def test_documents_are_reproducible() -> None:
    assert {n: render(d) for n, d in all_documents().items()} == rendered()


def test_main(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "out")]) == 0
    assert "wrote" in capsys.readouterr().out
    assert main([]) == 2
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main([str(blocker / "sub")]) == 1
    assert "cannot export schemas" in capsys.readouterr().err
