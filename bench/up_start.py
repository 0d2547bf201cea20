"""How long `nodeward up` takes from its start until every daemon answers `/readyz` 200, for
this tree and a baseline tree in the same run, the CPU one daemon's imports take, and the CPU
of `nodeward --help` (the command line loads every service's plugin).

The baseline is a git ref exported with `git archive` (nothing in the repository changes).
Each round starts `nodeward up --scenario none` from a fresh state directory. Prints each
round, the medians and the ratio this / baseline.

    python bench/up_start.py [--baseline HEAD~1] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from benchlib import exported, launched_up

REPO = Path(__file__).resolve().parent.parent


async def ready_s(tree: Path) -> float:
    began = time.monotonic()
    async with launched_up(tree, "--scenario", "none", "--quiet"):
        return time.monotonic() - began


def import_cpu_s(
    tree: Path, args: tuple[str, ...] = ("-c", "import services.cordon.service")
) -> float:
    """CPU seconds of a fresh interpreter importing the cordon service (what each daemon
    process of `up`, and `nodeward service cordon`, loads before it starts), or running
    `args`."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    before = os.times()
    subprocess.run(
        [sys.executable, *args], env=env, check=True, cwd=tree, stdout=subprocess.DEVNULL
    )
    after = os.times()
    return (after.children_user - before.children_user) + (
        after.children_system - before.children_system
    )


def measure(name: str, tree: Path, rounds: int) -> dict[str, float]:
    ready = [asyncio.run(ready_s(tree)) for _ in range(rounds)]
    cpu = [import_cpu_s(tree) for _ in range(rounds)]
    helps = [import_cpu_s(tree, ("-m", "launch", "--help")) for _ in range(rounds)]
    print(
        f"{name}: ready in "
        + ", ".join(f"{r:.1f}" for r in ready)
        + " s; imports "
        + ", ".join(f"{c:.2f}" for c in cpu)
        + " CPU s; nodeward --help "
        + ", ".join(f"{c:.2f}" for c in helps)
        + " CPU s"
    )
    return {
        "ready_s": statistics.median(ready),
        "import_cpu_s": statistics.median(cpu),
        "help_cpu_s": statistics.median(helps),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--baseline", default=None, help="git ref to compare with")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    results = {"this tree": measure("this tree", REPO, args.rounds)}
    if args.baseline:
        with exported(args.baseline) as tree:
            results[f"baseline {args.baseline}"] = measure(
                f"baseline {args.baseline}", tree, args.rounds
            )
    for name, med in results.items():
        print(
            f"{name:24s} median ready {med['ready_s']:.1f} s, imports "
            f"{med['import_cpu_s']:.2f} CPU s, --help {med['help_cpu_s']:.2f} CPU s"
        )
    if len(results) == 2:
        this, base = results.values()
        print(
            f"ratio this / baseline: ready {this['ready_s'] / base['ready_s']:.2f}, "
            f"imports {this['import_cpu_s'] / base['import_cpu_s']:.2f}, "
            f"--help {this['help_cpu_s'] / base['help_cpu_s']:.2f}"
        )


if __name__ == "__main__":
    main()
