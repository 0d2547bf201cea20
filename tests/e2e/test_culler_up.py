"""`nodeward up --config FILE` culls a simulated idle notebook: a warning in the outbox, then
the Notebook's `kubeflow-resource-stopped` as kubectl shows it; busy notebooks stay."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO
from tests.e2e.test_cli import NODEWARD, Output, wait_until

pytestmark = pytest.mark.timeout(180)

# The acceptance runs warn_after 20s / cull_after 40s; the same path, faster here.
CONFIG = """
services:
  culler: {warn_after: 4s, cull_after: 8s}
agents:
  idle: {interval: 1s, gpu_sample_every: 500ms, idle_after: 1s}
"""


def _notebooks(kubeconfig: Path) -> dict[str, dict[str, Any]]:
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl is installed by `make test` (scripts/system-deps.sh)"
    got = subprocess.run(
        [kubectl, "--kubeconfig", str(kubeconfig), "get", "notebooks", "-A", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert got.returncode == 0, got.stderr
    return {i["metadata"]["name"]: i for i in json.loads(got.stdout)["items"]}


def _stopped(notebook: dict[str, Any]) -> str | None:
    return (notebook["metadata"].get("annotations") or {}).get("kubeflow-resource-stopped")


def test_up_warns_then_stops_the_idle_notebook_and_kubectl_shows_it(tmp_path: Path) -> None:
    state = tmp_path / "state"
    config = tmp_path / "culler.yaml"
    config.write_text(CONFIG)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NODEWARD_")} | {
        "PYTHONPATH": str(REPO)
    }
    proc = subprocess.Popen(
        [*NODEWARD, "up", "--state-dir", str(state), "--nodes", "5", "--scenario", "none",
         "--config", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env=env,
    )  # fmt: skip
    output = Output(proc)
    out = output.out
    try:
        wait_until((state / "endpoints.json").exists, timeout=60, what="nodeward up")
        kubeconfig = state / "kubeconfig"
        outbox = state / "outbox"

        def warned() -> list[Path]:
            return [
                f
                for f in outbox.rglob("*")
                if f.is_file() and "carol-jupyter-0 will be stopped" in f.read_text()
            ]

        def stopped() -> bool:
            return _stopped(_notebooks(kubeconfig)["carol-jupyter"]) is not None

        wait_until(stopped, timeout=60, what="kubeflow-resource-stopped on carol-jupyter")
        # The notifier groups notices for group_wait (10s by default) before it writes them.
        wait_until(warned, timeout=60, what=f"the warning in the outbox; story: {out[-20:]}")
        notice = warned()[0].read_text()
        assert "nodeward.io/keep-until" in notice and "Kubeflow Notebooks" in notice
        decisions = [
            line for line in out if line.startswith("DECISION ") and "carol-jupyter" in line
        ]
        assert [line.split()[3] for line in decisions][:2] == ["warn", "stop"], decisions
        books = _notebooks(kubeconfig)
        # The busy notebooks on the same fleet are left alone.
        for name in ("alice-jupyter", "bob-jupyter"):
            assert _stopped(books[name]) is None, name
        assert any(line.startswith("IDLE ") and "carol-jupyter-0" in line for line in out)
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
