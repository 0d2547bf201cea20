"""The node's CPU frequency tuning, read from sysfs and judged: a `node.finding.v1`.

A GPU node's CPUs feed its GPUs; a governor that lets them slow down (`powersave`,
`ondemand`, `schedutil`) makes the work's speed wander, as a benchmark whose CPU frequency
fluctuated showed. Each CPU's `cpufreq/scaling_governor` and `scaling_cur_freq` are read
under `root` (`/sys/devices/system/cpu`), `samples` times; the result is a finding when a
CPU uses another governor than `governor`, or when the frequencies read spread more than
`spread_bound_pct` ((max - min) / max). Reading is blocking file I/O: the agent runs it
off the event loop.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from pydantic import Field

from nodeward.config import Section
from nodeward.durations import Duration
from schemas.node import FindingState, NodeFinding

CHECK = "cpufreq"
_CPU_DIR = re.compile(r"^cpu[0-9]+$")


class CpufreqSettings(Section):
    """`agents.energy.cpufreq`: the CPU governor and frequency check."""

    enabled: bool = True
    root: Path = Path("/sys/devices/system/cpu")
    governor: str = "performance"
    """the governor GPU nodes should use"""
    spread_bound_pct: float = Field(
        default=25.0, gt=0, le=100, description="a larger (max - min) / max is a finding"
    )
    every: Duration = timedelta(minutes=5)
    """how often to check"""
    samples: int = Field(default=3, ge=1, le=20, description="frequency reads per check")
    sample_gap: Duration = Field(default=timedelta(milliseconds=200))


@dataclass(frozen=True)
class CpuRead:
    cpu: str
    governor: str | None
    cur_khz: float | None


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def read_cpus(root: Path) -> list[CpuRead]:
    """Every online CPU's governor and current frequency (None where unreadable)."""
    out = []
    try:
        entries = sorted(p for p in root.iterdir() if _CPU_DIR.match(p.name))
    except OSError:
        return []
    for cpu in entries:
        freq = cpu / "cpufreq"
        if not freq.is_dir():
            continue
        cur = _read(freq / "scaling_cur_freq")
        try:
            khz = float(cur) if cur is not None else None
        except ValueError:
            khz = None
        out.append(CpuRead(cpu.name, _read(freq / "scaling_governor"), khz))
    return out


def sample(settings: CpufreqSettings) -> list[list[CpuRead]]:
    """`samples` reads of every CPU, `sample_gap` apart (blocking)."""
    reads = []
    for i in range(settings.samples):
        if i:
            time.sleep(settings.sample_gap.total_seconds())
        reads.append(read_cpus(settings.root))
    return reads


def judge(node: str, reads: list[list[CpuRead]], settings: CpufreqSettings) -> NodeFinding | None:
    """The finding (or the all-clear) of these reads; None when no CPU has cpufreq."""
    last = reads[-1] if reads else []
    if not last:
        return None
    governors = Counter(r.governor or "unknown" for r in last)
    freqs = [r.cur_khz for rs in reads for r in rs if r.cur_khz is not None and r.cur_khz > 0]
    lo, hi = (min(freqs), max(freqs)) if freqs else (None, None)
    spread = round((hi - lo) / hi * 100, 1) if lo is not None and hi else None
    problems = []
    other = sum(n for g, n in governors.items() if g != settings.governor)
    if other:
        names = ", ".join(sorted(g for g in governors if g != settings.governor))
        problems.append(
            f"{other} of {len(last)} CPUs use governor {names}, not {settings.governor}"
        )
    if spread is not None and spread > settings.spread_bound_pct:
        assert lo is not None and hi is not None
        problems.append(
            f"CPU frequencies spread {spread:g}% ({lo / 1000:.0f}-{hi / 1000:.0f} MHz), "
            f"over the {settings.spread_bound_pct:g}% bound"
        )
    state = FindingState.FINDING if problems else FindingState.OK
    summary = (
        f"{node}: " + "; ".join(problems)
        if problems
        else f"{node}: {len(last)} CPUs on governor {settings.governor}, spread "
        f"{spread if spread is not None else '?'}%"
    )
    return NodeFinding(
        node=node,
        check=CHECK,
        state=state,
        summary=summary[:500],
        problems=problems,
        cpus=len(last),
        governors=dict(governors),
        expected_governor=settings.governor,
        freq_min_khz=lo,
        freq_max_khz=hi,
        spread_pct=spread,
        spread_bound_pct=settings.spread_bound_pct,
    )
