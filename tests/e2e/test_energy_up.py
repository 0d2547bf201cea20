"""`nodeward up` runs a simulated energy agent per sim node: energy.node and energy.pod appear."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import httpx

from tests.conftest import REPO
from tests.e2e.test_cli import NODEWARD, run, wait_until


def test_up_publishes_node_energy_that_follows_the_sim_gpus(tmp_path: Path) -> None:
    state = tmp_path / ".nodeward"
    env = os.environ | {"NODEWARD_AGENTS__ENERGY__INTERVAL": "1s"}
    proc = subprocess.Popen(
        [*NODEWARD, "up", "--state-dir", str(state), "--scenario", "none", "--quiet", "--nodes=2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=env,
    )
    try:
        endpoints_file = state / "endpoints.json"
        wait_until(endpoints_file.exists, timeout=30, what="endpoints.json")
        endpoints = json.loads(endpoints_file.read_text())
        energy_daemons = sorted(n for n in endpoints["metrics"] if n.startswith("agent-energy-"))
        assert len(energy_daemons) == 2, endpoints["metrics"]
        tail = run(
            "tail", "energy.node.>", "--count", "4", "--json", "--timeout", "20s",
            "--nats", endpoints["nats_url"],
            timeout=40,
        )  # fmt: skip
        assert tail.returncode == 0, tail.stderr
        events = [json.loads(line) for line in tail.stdout.splitlines()]
        assert {e["type"] for e in events} == {"energy.node.v1"}
        for event in events:
            data = event["data"]
            gpus = [r for r in data["readings"] if r["component"].startswith("gpu-")]
            system = next(r for r in data["readings"] if r["component"] == "system")
            assert len(gpus) == 8
            # The node's power is its base power plus its GPUs' (250 W each in the sim).
            assert system["avg_power_w"] >= sum(g["avg_power_w"] for g in gpus) > 0
            assert data["co2e_g"] is not None and data["degraded"] == []
        pods = run(
            "tail", "energy.pod.>", "--count", "1", "--json", "--timeout", "20s",
            "--nats", endpoints["nats_url"],
            timeout=40,
        )  # fmt: skip
        assert pods.returncode == 0, pods.stderr
        pod = json.loads(pods.stdout)["data"]
        assert pod["gpu_energy_j"] > 0 and "gpu-" in pod["attribution"]
        daemon = endpoints["metrics"][energy_daemons[0]]
        metrics = httpx.get(daemon + "/metrics", timeout=5).text
        assert "nodeward_node_power_watts" in metrics
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
