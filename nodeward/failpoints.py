"""Named crash points, in the style of etcd's gofail: nothing happens unless asked.

`NODEWARD_FAILPOINT` holds comma-separated terms; the process SIGKILLs itself (no
shutdown hooks, no flush: a crash) when a matching point is reached:

- `marks.apply.patched`: the first time the point `marks.apply.patched` is reached;
- `marks.apply.patched=nth:3`: the third time it is reached;
- `*=nth:3` (or `nth:3`): the third time any point is reached.

Tests use it to kill an acting service at each KV and API write boundary, deterministically.
"""

from __future__ import annotations

import os
import signal
from collections import Counter
from collections.abc import Mapping

ENV = "NODEWARD_FAILPOINT"


def parse(spec: str) -> dict[str, int]:
    """`name[=nth:N]` terms -> {name: N} (`*` for any point)."""
    terms: dict[str, int] = {}
    for raw in spec.split(","):
        term = raw.strip()
        if not term:
            continue
        if term.startswith("nth:"):
            term = f"*={term}"
        name, _, action = term.partition("=")
        nth = 1
        if action:
            kind, _, count = action.partition(":")
            if kind != "nth" or not count.isdigit() or int(count) < 1:
                raise ValueError(f"{ENV}: unknown action {action!r} (expected nth:N)")
            nth = int(count)
        terms[name.strip()] = nth
    return terms


class Failpoints:
    """The armed points of one process (from the environment); `hit` counts and kills."""

    def __init__(self, terms: Mapping[str, int] | None = None) -> None:
        self.terms = dict(terms or {})
        self.seen: Counter[str] = Counter()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Failpoints:
        return cls(parse((environ if environ is not None else os.environ).get(ENV, "")))

    def hit(self, name: str) -> None:
        """Reach the point `name`: SIGKILL this process if it is armed for this time."""
        if not self.terms:
            return
        self.seen[name] += 1
        self.seen["*"] += 1
        for key in (name, "*"):
            nth = self.terms.get(key)
            if nth is not None and self.seen[key] == nth:
                os.kill(os.getpid(), signal.SIGKILL)
