"""How long a call takes, for the tests that bound a reader's overhead."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def median_us(call: Callable[[], Any], runs: int) -> float:
    """The median wall time of `runs` calls of `call`, in microseconds."""
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2] * 1e6
