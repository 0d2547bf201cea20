"""`python -m launch.observability.generate DIR [--check]`: the dashboards' JSON, written into
DIR (the chart's files/dashboards), or with --check compared with what is there (exit 1 on a
difference). `make dashboards` writes them; the tests check them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from grafana_foundation_sdk.cog.encoder import JSONEncoder

from launch.observability.dashboards import DASHBOARDS, build


def rendered() -> dict[str, str]:
    """Each dashboard's file name and its JSON text, as committed."""
    return {
        f"{spec.name}.json": json.dumps(build(spec), cls=JSONEncoder, indent=2, sort_keys=True)
        + "\n"
        for spec in DASHBOARDS
    }


def stale(folder: Path) -> list[str]:
    """The files in `folder` that differ from the generated ones (or are missing, or extra)."""
    wanted = rendered()
    there = {p.name for p in folder.glob("*.json")}
    differ = [
        n
        for n, text in wanted.items()
        if not (folder / n).is_file() or (folder / n).read_text() != text
    ]
    return sorted(differ + sorted(there - set(wanted)))


def main(argv: list[str]) -> int:
    check = "--check" in argv
    args = [a for a in argv if a != "--check"]
    if len(args) != 1:
        print("usage: python -m launch.observability.generate DIR [--check]", file=sys.stderr)
        return 2
    folder = Path(args[0])
    if check:
        differ = stale(folder)
        if differ:
            print(f"dashboards out of date in {folder}: {', '.join(differ)}; run `make dashboards`")
            return 1
        return 0
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in rendered().items():
        (folder / name).write_text(text)
    for extra in {p.name for p in folder.glob("*.json")} - set(rendered()):
        (folder / extra).unlink()
    print(f"wrote {len(DASHBOARDS)} dashboards into {folder}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
