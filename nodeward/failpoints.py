"""Named failure points, in the style of etcd's gofail: nothing happens unless asked.

`NODEWARD_FAILPOINT` holds comma-separated terms; when a matching point is reached the
process SIGKILLs itself (no shutdown hooks, no flush: a crash), or, with `raise`, the point
raises `FailpointError` (a task that fails):

- `marks.apply.patched`: kill the first time the point `marks.apply.patched` is reached;
- `marks.apply.patched=nth:3`: kill the third time it is reached;
- `*=nth:3` (or `nth:3`): kill the third time any point is reached;
- `cordon.reconcile=raise` (or `raise:nth:N`): raise there instead of killing.

`NODEWARD_FAILPOINT_FILE` names a file holding the same terms, read whenever it changes, so
a test arms a point at the moment it chooses (in a running `nodeward up`, say). Its hits
are counted from when the file was read, and a point armed there fires once: the process
removes the file as it fires.

Tests use these to kill an acting service at each KV and API write boundary, and to make a
daemon's task fail, deterministically.
"""

from __future__ import annotations

import os
import signal
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

ENV = "NODEWARD_FAILPOINT"
FILE_ENV = "NODEWARD_FAILPOINT_FILE"


class FailpointError(RuntimeError):
    """Raised by a point armed with `raise`."""


@dataclass(frozen=True)
class Term:
    """When an armed point fires (the `nth` time it is reached) and how."""

    nth: int = 1
    raises: bool = False


def parse(spec: str) -> dict[str, Term]:
    """`name[=[raise:]nth:N]` or `name=raise` terms -> {name: Term} (`*` for any point)."""
    terms: dict[str, Term] = {}
    for raw in spec.split(","):
        term = raw.strip()
        if not term:
            continue
        if term.startswith("nth:"):
            term = f"*={term}"
        name, _, action = term.partition("=")
        raises = action == "raise" or action.startswith("raise:")
        if raises:
            action = action.removeprefix("raise").removeprefix(":")
        nth = 1
        if action:
            kind, _, count = action.partition(":")
            if kind != "nth" or not count.isdigit() or int(count) < 1:
                raise ValueError(
                    f"{ENV}: unknown action {action!r} (expected nth:N, raise or raise:nth:N)"
                )
            nth = int(count)
        terms[name.strip()] = Term(nth, raises)
    return terms


class Failpoints:
    """The armed points of one process (from the environment); `hit` counts and fires."""

    def __init__(self, terms: Mapping[str, Term] | None = None, *, file: Path | None = None):
        self.terms = dict(terms or {})
        self.seen: Counter[str] = Counter()
        self.file = file
        self._file_terms: dict[str, Term] = {}
        self._file_seen: Counter[str] = Counter()
        self._file_stamp: tuple[int, int] | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Failpoints:
        env = environ if environ is not None else os.environ
        file = env.get(FILE_ENV)
        return cls(parse(env.get(ENV, "")), file=Path(file) if file else None)

    def hit(self, name: str) -> None:
        """Reach the point `name`: SIGKILL this process, or raise, if armed for this time."""
        if self.terms:
            self.seen[name] += 1
            self.seen["*"] += 1
            for key in (name, "*"):
                term = self.terms.get(key)
                if term is not None and self.seen[key] == term.nth:
                    _fire(name, term)
        if self.file is not None and self._read_file():
            self._file_seen[name] += 1
            self._file_seen["*"] += 1
            for key in (name, "*"):
                term = self._file_terms.get(key)
                if term is not None and self._file_seen[key] == term.nth:
                    self._file_terms.clear()
                    self.file.unlink(missing_ok=True)  # fired: it fires once
                    _fire(name, term)

    def _read_file(self) -> bool:
        """Load the file's terms if it changed; True while some are armed."""
        assert self.file is not None
        try:
            st = self.file.stat()
        except FileNotFoundError:
            self._file_terms.clear()
            self._file_stamp = None
            return False
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp != self._file_stamp:
            self._file_stamp = stamp
            self._file_terms = parse(self.file.read_text())
            self._file_seen.clear()
        return bool(self._file_terms)


def _fire(name: str, term: Term) -> None:
    if term.raises:
        raise FailpointError(f"failpoint {name}")
    os.kill(os.getpid(), signal.SIGKILL)
