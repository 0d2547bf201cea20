"""With `nodeward up` running, `nodeward maintenance start gpu-a100-03 --move --deadline 30s`
ends in `done` within two minutes: every opted-in pod's checkpoint on the stream, the
JupyterHub notebook and the Kubeflow Notebook that asked to move running on gpu-a100-01
restored from their checkpoint images in up's registry (the Notebook's pod its StatefulSet's
again, the Notebook running), the node drained as kubectl shows it, and the restore plan
printed."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO
from tests.e2e.test_cli import NODEWARD, spawn, wait_until

pytestmark = pytest.mark.timeout(240)

NODE = "gpu-a100-03"
OPTED_IN = {"sim-rl-worker-0", "sim-rl-worker-1", "jupyter-erin", "dave-jupyter-0"}  # the seed
MOVED, TARGET = "jupyter-erin", "gpu-a100-01"  # nodeward.io/move=true; CUDA checkpoint there
NOTEBOOK = "dave-jupyter"  # a Kubeflow Notebook in ml-robotics whose pod asked to move too


def _kubectl(kubeconfig: Path, *args: str) -> dict[str, Any]:
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl is installed by `make test` (scripts/system-deps.sh)"
    got = subprocess.run(
        [kubectl, "--kubeconfig", str(kubeconfig), *args, "-o", "json"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert got.returncode == 0, got.stderr
    result: dict[str, Any] = json.loads(got.stdout)
    return result


def _cli(state: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    nats = json.loads((state / "endpoints.json").read_text())["nats_url"]
    return subprocess.run(
        [*NODEWARD, *args, "--nats", nats],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def test_up_maintenance_start_ends_done_with_checkpoints_and_the_node_drained(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    env = {k: v for k, v in os.environ.items() if not k.startswith("NODEWARD_")} | {
        "PYTHONPATH": str(REPO)
    }
    proc = spawn("up", "--state-dir", str(state), "--scenario", "none", cwd=tmp_path, env=env)
    err: list[str] = []
    readers = [
        threading.Thread(target=lambda: list(proc.stdout or []), daemon=True),
        threading.Thread(target=lambda: err.extend(proc.stderr or []), daemon=True),
    ]
    for r in readers:
        r.start()
    try:
        wait_until((state / "endpoints.json").exists, timeout=60, what="nodeward up")
        kubeconfig = state / "kubeconfig"
        began = time.monotonic()
        started = _cli(state, env, "maintenance", "start", NODE, "--move", "--deadline", "30s",
                       "--reason", "firmware update", "--wait", "30",
                       "--kubeconfig", str(kubeconfig))  # fmt: skip
        assert started.returncode == 0, started.stderr
        assert f"of {NODE} accepted" in started.stdout

        def done() -> dict[str, Any] | None:
            got = _cli(state, env, "maintenance", "status", NODE, "--json")
            if got.returncode != 0:
                return None
            status: dict[str, Any] = json.loads(got.stdout)
            return status if status["phase"] in ("done", "failed") else None

        wait_until(done, timeout=120, what=f"maintenance done; up said: {err[-10:]}")
        status = done()
        assert status is not None and status["phase"] == "done", status
        assert time.monotonic() - began < 120
        assert status["failures"] == []

        # Every opted-in pod's checkpoint is on the stream.
        tail = _cli(state, env, "tail", "maintenance.>", "--since", "10m", "--json",
                    "--timeout", "3s", "--count", "50")  # fmt: skip
        events = [json.loads(line) for line in tail.stdout.splitlines() if line.strip()]
        mine = [e["data"] for e in events if e.get("data", {}).get("node") == NODE]
        phases = [d["phase"] for d in mine]
        assert phases[0] == "requested" and phases[-1] == "done", phases
        recorded = {
            c["pod"]["name"]
            for d in mine
            if d["phase"] == "checkpointed"
            for c in d["checkpoints"]
            if c.get("path")
        }
        assert recorded == OPTED_IN

        # The node is drained and cordoned, as kubectl shows it.
        pods = _kubectl(kubeconfig, "get", "pods", "-A", "--field-selector",
                        f"spec.nodeName={NODE}")  # fmt: skip
        left = {p["metadata"]["name"] for p in pods["items"]}
        assert left == {"nodeward-agent-e2077"}, left
        node = _kubectl(kubeconfig, "get", "node", NODE)
        assert node["spec"].get("unschedulable") is True
        assert node["metadata"]["annotations"]["nodeward.io/maintenance"] == "done"

        # The notebook runs on gpu-a100-01 under its name, restored from its image.
        moved = _kubectl(kubeconfig, "get", "pod", MOVED, "-n", "ml-robotics")
        assert moved["spec"]["nodeName"] == TARGET and moved["status"]["phase"] == "Running"
        image = moved["spec"]["containers"][0]["image"]
        registry = json.loads((state / "endpoints.json").read_text())["registry"]
        assert image.startswith(f"{registry}/nodeward-checkpoints/ml-robotics/{MOVED}-notebook@")
        restored = json.loads(moved["metadata"]["annotations"]["sim.nodeward.io/restored"])
        assert image.endswith(restored[0]["digest"])
        origin = json.loads(moved["metadata"]["annotations"]["nodeward.io/restored-from"])
        assert origin["node"] == NODE
        shown = _cli(state, env, "maintenance", "status", NODE)
        assert f"moved to {TARGET}" in shown.stdout, shown.stdout

        # The Notebook's pod moved through its owner: restored there, its StatefulSet's
        # again, and the Notebook running (no stop left on it).
        pod = _kubectl(kubeconfig, "get", "pod", f"{NOTEBOOK}-0", "-n", "ml-robotics")
        assert pod["spec"]["nodeName"] == TARGET and pod["status"]["phase"] == "Running"
        assert "sim.nodeward.io/restored" in pod["metadata"]["annotations"]
        owner = [r for r in pod["metadata"]["ownerReferences"] if r.get("controller")]
        assert [(r["kind"], r["name"]) for r in owner] == [("StatefulSet", NOTEBOOK)]
        notebook = _kubectl(kubeconfig, "get", "notebook", NOTEBOOK, "-n", "ml-robotics")
        assert "kubeflow-resource-stopped" not in notebook["metadata"].get("annotations", {})

        plan = _cli(state, env, "maintenance", "restore", "ml-robotics/sim-rl-worker-0",
                    "--plan")  # fmt: skip
        assert plan.returncode == 0, plan.stderr
        assert "io.kubernetes.cri-o.annotations.checkpoint.name=pytorch" in plan.stdout
        assert "nodeward.io/cuda-checkpoint: 'true'" in plan.stdout  # a GPU pod needs one
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
