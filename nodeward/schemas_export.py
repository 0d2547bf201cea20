"""Write the JSON Schema of every event type, and `index.json`, into a directory.

`python -m nodeward.schemas_export DIR` (what `make schemas` runs) does the same as
`nodeward schemas export DIR`. The committed copy lives in `schemas/json/`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from schemas.jsonschema import INDEX_FILE, all_documents


def render(document: dict[str, Any]) -> str:
    """The stable text of a document: sorted keys, two-space indent, final newline."""
    return json.dumps(document, indent=2, sort_keys=True) + "\n"


def rendered() -> dict[str, str]:
    """File name → text of every document an export writes."""
    return {name: render(doc) for name, doc in all_documents().items()}


def _previously_exported(dir: Path) -> set[str]:
    """Files named by an earlier export's index in `dir` (only those may be removed)."""
    try:
        index = json.loads((dir / INDEX_FILE).read_text(encoding="utf-8"))
        return {str(entry["file"]) for entry in index["types"].values()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return set()


def export(dir: Path) -> list[Path]:
    """Write `<type>.json` per event type and `index.json`; return the paths, sorted.

    Schema files of types an earlier export listed but that no longer exist are removed;
    nothing else in `dir` is touched. Unchanged files are not rewritten.
    """
    dir.mkdir(parents=True, exist_ok=True)
    texts = rendered()
    for stale in sorted(_previously_exported(dir) - set(texts)):
        (dir / Path(stale).name).unlink(missing_ok=True)
    paths = []
    for name, text in sorted(texts.items()):
        path = dir / name
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m nodeward.schemas_export DIR", file=sys.stderr)
        return 2
    try:
        paths = export(Path(args[0]))
    except OSError as exc:
        print(f"cannot export schemas to {args[0]}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    print(f"wrote {len(paths)} files to {args[0]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
