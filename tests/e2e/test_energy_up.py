"""`nodeward up` runs a simulated energy agent per sim node: energy.node and energy.pod appear."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import httpx

from tests.e2e.test_cli import run, spawn, wait_until


def _tail(nats_url: str, subject: str, count: int) -> list[dict[str, Any]]:
    """The first `count` events on `subject`, by `nodeward tail --json`."""
    tail = run(
        "tail", subject, "--count", str(count), "--json", "--timeout", "20s", "--nats", nats_url,
        timeout=40,
    )  # fmt: skip
    assert tail.returncode == 0, tail.stderr
    return [json.loads(line) for line in tail.stdout.splitlines()]


def test_up_publishes_node_energy_that_follows_the_sim_gpus(tmp_path: Path) -> None:
    state = tmp_path / ".nodeward"
    env = os.environ | {"NODEWARD_AGENTS__ENERGY__INTERVAL": "1s"}
    proc = spawn(
        "up", "--state-dir", str(state), "--scenario", "none", "--quiet", "--nodes=2", env=env
    )
    try:
        endpoints_file = state / "endpoints.json"
        wait_until(endpoints_file.exists, timeout=30, what="endpoints.json")
        endpoints = json.loads(endpoints_file.read_text())
        energy_daemons = sorted(n for n in endpoints["metrics"] if n.startswith("agent-energy-"))
        assert len(energy_daemons) == 2, endpoints["metrics"]
        events = _tail(endpoints["nats_url"], "energy.node.>", 4)
        assert {e["type"] for e in events} == {"energy.node.v1"}
        for event in events:
            data = event["data"]
            gpus = [r for r in data["readings"] if r["component"].startswith("gpu-")]
            system = next(r for r in data["readings"] if r["component"] == "system")
            assert len(gpus) == 8
            # The node's power is its base power plus its GPUs' (250 W each in the sim).
            assert system["avg_power_w"] >= sum(g["avg_power_w"] for g in gpus) > 0
            assert data["co2e_g"] is not None and data["degraded"] == []
        [pod_event] = _tail(endpoints["nats_url"], "energy.pod.>", 1)
        pod = pod_event["data"]
        assert pod["gpu_energy_j"] > 0 and "gpu-" in pod["attribution"]
        daemon = endpoints["metrics"][energy_daemons[0]]
        metrics = httpx.get(daemon + "/metrics", timeout=5).text
        assert "nodeward_node_power_watts" in metrics
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
