"""`nodeward up` survives its nats-server dying: SIGKILL the child, and within 15 s every
daemon is ready again, a new XID 79 is quarantined and the story tells it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from schemas.state.cordon import TAINT_KEY
from tests.e2e.platform import running_up
from tests.e2e.test_cli import run, wait_until

pytestmark = pytest.mark.timeout(180)

NODE = "gpu-h100-02"


def _nats_pid(state: Path) -> int | None:
    """The nats-server child's pid, from the ports file it writes (one per running server)."""
    files = sorted((state / "nats" / "ports").glob("*.ports"))
    return int(files[0].stem.rsplit("_", 1)[1]) if files else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); /proc tells a reaped-or-defunct child apart.
    try:
        return "\nState:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False


def _tainted(state: Path, node: str) -> bool:
    got = subprocess.run(
        ["kubectl", "--kubeconfig", str(state / "kubeconfig"), "get", "node", node, "-o", "json"],
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )
    if got.returncode != 0:
        return False
    taints = json.loads(got.stdout).get("spec", {}).get("taints") or []
    return any(t.get("key") == TAINT_KEY for t in taints)


def test_up_restarts_a_killed_nats_server_and_everything_recovers(tmp_path: Path) -> None:
    with running_up(tmp_path, "--nodes", "3", "--scenario", "none", timeout=60) as up:
        state, output = up.state, up.output
        nats_url = up.endpoints["nats_url"]
        pid = _nats_pid(state)
        assert pid is not None and _alive(pid)

        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        wait_until(lambda: not _alive(pid), timeout=5, what="the nats-server to die")

        def restarted() -> bool:
            new = _nats_pid(state)
            return new is not None and new != pid and _alive(new)

        wait_until(restarted, timeout=15, what="a new nats-server")
        # Same port: the URL every client (and endpoints.json) knows.
        assert json.loads((state / "endpoints.json").read_text())["nats_url"] == nats_url
        wait_until(
            lambda: not up.unready(),
            timeout=max(0.0, 15 - (time.monotonic() - killed)),
            what=f"every /readyz within 15 s: {up.unready()}",
        )
        assert sum("nats_server.restarted" in line for line in output.err) == 1

        told = len(output.out)
        injected = run(
            "sim",
            "inject",
            "--state-dir",
            str(state),
            "--node",
            NODE,
            "--gpu",
            "0",
            "--xid",
            "79",
            env={"NODEWARD_NATS_URL": ""},
        )
        assert injected.returncode == 0, injected.stderr
        wait_until(lambda: _tainted(state, NODE), timeout=30, what=f"{NODE} tainted")

        def story_tells_it() -> bool:
            new = output.out[told:]
            return any(line.startswith("GPU ") and f"{NODE} GPU 0" in line for line in new) and any(
                line.startswith("CORDON ") and NODE in line for line in new
            )

        wait_until(story_tells_it, timeout=30, what=f"the story to tell it: {output.out[told:]}")
