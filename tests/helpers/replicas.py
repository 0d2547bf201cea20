"""Replicas of a partitioned consumer in processes of their own, and what they handled.

The child (`tests.helpers.partition_replica`) logs one row per handled event before it
acks; `order_broken` checks those rows against `docs/delivery.md`'s promise for a key
across a replica's death.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import REPO


@dataclass(frozen=True)
class Row:
    """One handling: who handled `node`'s event `seq`, from `start` to `end` (wall clock)."""

    who: str
    node: str
    seq: int
    start: float
    end: float


class Replica:
    """A child replica process consuming partitioned group `name` (leases in `bucket`)."""

    def __init__(self, url: str, bucket: str, name: str, partitions: int, out: Path) -> None:
        self.out = out
        self.held_file = Path(f"{out}.held")
        out.touch()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.helpers.partition_replica",
                url,
                bucket,
                name,
                str(partitions),
                str(out),
            ],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
        )

    def held(self) -> str | None:
        """The last `held …` line: the partitions it consumed when they last changed."""
        lines = self.held_file.read_text().splitlines() if self.held_file.exists() else []
        return lines[-1] if lines else None

    def rows(self) -> list[Row]:
        rows = []
        for line in self.out.read_text().splitlines():
            who, node, seq, start, end = line.split()
            rows.append(Row(who, node, int(seq), float(start), float(end)))
        return rows

    def kill(self) -> None:
        """SIGKILL: no nak, no lease given back, acks not yet flushed are lost."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def order_broken(rows: list[Row]) -> dict[str, list[int]]:
    """The nodes whose handling broke the promise, with the sequences in the order handled.

    Per node, each replica handles in stream order; the one taking over may handle again
    what the dead one handled without its ack reaching the server (a replay of a suffix),
    but never an event before an earlier one was first handled. So: each replica's run is
    non-decreasing, and the first handlings of the whole are increasing."""
    per_node: dict[str, list[Row]] = defaultdict(list)
    for row in sorted(rows, key=lambda r: r.start):
        per_node[row.node].append(row)
    broken = {}
    for node, seen in per_node.items():
        runs: dict[str, list[int]] = defaultdict(list)
        first: list[int] = []
        for row in seen:
            runs[row.who].append(row.seq)
            if row.seq not in first:
                first.append(row.seq)
        if first != sorted(first) or any(r != sorted(r) for r in runs.values()):
            broken[node] = [r.seq for r in seen]
    return broken


def overlapping(rows: list[Row]) -> list[str]:
    """Nodes whose events two replicas handled at the same time."""
    per_node: dict[str, list[Row]] = defaultdict(list)
    for row in sorted(rows, key=lambda r: r.start):
        per_node[row.node].append(row)
    return [
        node
        for node, seen in per_node.items()
        for a, b in itertools.pairwise(seen)
        if a.who != b.who and a.end > b.start
    ]
