"""`nodeward up` as the e2e tests run it: in a temp dir, waited on until every daemon is
ready, stopped with SIGINT at the end (which must exit 0)."""

from __future__ import annotations

import json
import os
import signal
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.conftest import REPO
from tests.e2e.test_cli import Output, spawn, wait_until


def ready(url: str) -> bool:
    """A daemon's `/readyz` answers 200."""
    try:
        with urllib.request.urlopen(f"{url}/readyz", timeout=2) as reply:
            return bool(reply.status == 200)
    except (urllib.error.URLError, OSError):
        return False


@dataclass
class Up:
    state: Path
    endpoints: dict[str, Any]
    output: Output

    @property
    def daemons(self) -> dict[str, str]:
        """Each daemon's name and URL (its /healthz /readyz /metrics)."""
        return dict(self.endpoints["metrics"])

    def unready(self) -> list[str]:
        return [name for name, url in self.daemons.items() if not ready(url)]

    def reread(self) -> dict[str, Any]:
        """endpoints.json as `up` last wrote it (it rewrites it when it restarts a daemon)."""
        self.endpoints = json.loads((self.state / "endpoints.json").read_text())
        return self.endpoints


@contextmanager
def running_up(
    tmp_path: Path, *args: str, timeout: float = 90, env: Mapping[str, str] | None = None
) -> Iterator[Up]:
    """`nodeward up --state-dir <tmp>/state ARGS...`, yielded once every daemon is ready.

    The environment's `NODEWARD_*` variables are left out, the repository goes first on
    `PYTHONPATH`; `env` adds variables."""
    state = tmp_path / "state"
    # The repository first; then the caller's path (where entry-point metadata may live).
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env = (
        {k: v for k, v in os.environ.items() if not k.startswith("NODEWARD_")}
        | {"PYTHONPATH": path}
        | dict(env or {})
    )
    proc = spawn("up", "--state-dir", str(state), *args, cwd=tmp_path, env=env)
    output = Output(proc)
    try:
        wait_until((state / "endpoints.json").exists, timeout=timeout, what="nodeward up")
        up = Up(state, json.loads((state / "endpoints.json").read_text()), output)
        wait_until(lambda: not up.unready(), timeout=timeout, what="every daemon ready")
        yield up
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=60)
        output.join(timeout=5)
    assert code == 0, f"exit {code}: " + "".join(output.err)[-2000:]
