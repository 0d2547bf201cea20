"""The demo as a newcomer sees it: `nodeward up` tells the story, `status` and `replay` agree."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO
from tests.e2e.test_cli import Output, run, spawn, wait_until

STEPS = ("GPU", "DECISION", "CORDON", "RELEASE")

pytestmark = pytest.mark.timeout(180)


def _status(state: Path) -> dict[str, Any] | None:
    got = run("status", "--json", "--state-dir", str(state), env={"NODEWARD_NATS_URL": ""})
    return json.loads(got.stdout) if got.returncode == 0 else None


def test_up_tells_the_story_and_status_and_replay_show_it(tmp_path: Path) -> None:
    state = tmp_path / "state"
    scenario = tmp_path / "short.yaml"
    scenario.write_text(
        "- {after: 1s, node: gpu-h100-02, gpu: 1, xid: 79}\n"
        "- {after: 4s, node: gpu-h100-02, gpu: 1, recover: true}\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("NODEWARD_")} | {
        "PYTHONPATH": str(REPO),
        # The environment wins over the demo profile: release within seconds.
        "NODEWARD_SERVICES__CORDON__HEALTHY_PERIOD": "2s",
        "NODEWARD_SERVICES__CORDON__COOLDOWN": "1s",
        "NODEWARD_SERVICES__CORDON__RECONCILE_INTERVAL": "1s",
    }
    proc = spawn(
        "up",
        "--state-dir",
        str(state),
        "--nats-port",
        "0",
        "--nodes",
        "3",
        "--scenario",
        str(scenario),
        cwd=tmp_path,
        env=env,
    )
    output = Output(proc)
    out, err = output.out, output.err
    try:
        wait_until((state / "endpoints.json").exists, timeout=60, what="nodeward up")
        found: dict[str, Any] = {}

        def quarantined() -> bool:
            status = _status(state)
            if status is None:
                return False
            # Until the marks are applied the record says quarantined but not yet cordoned.
            hit = [n for n in status["nodes"] if n["quarantine"] and n["quarantine"]["cordoned"]]
            if hit:
                found.update(status=status, node=hit[0])
            return bool(hit)

        wait_until(quarantined, timeout=60, what="status to list the quarantined node")
        node = found["node"]
        assert node["name"] == "gpu-h100-02"
        assert "XID 79" in node["quarantine"]["reason"]
        assert node["quarantine"]["cordoned"] is True
        assert [n["name"] for n in found["status"]["nodes"]] == [
            "gpu-h100-01",
            "gpu-h100-02",
            "gpu-h100-03",
        ]
        assert all(n["agent_live"] for n in found["status"]["nodes"])

        def told() -> bool:
            return all(any(line.startswith(step + " ") for line in out) for step in STEPS)

        wait_until(told, timeout=60, what=f"every step of the story in {out}")
        story = [line for line in out if line.split(" ", 1)[0] in STEPS]
        first = {
            step: next(i for i, line in enumerate(story) if line.startswith(step + " "))
            for step in STEPS
        }
        assert first["GPU"] < first["DECISION"] < first["CORDON"] < first["RELEASE"]
        assert "gpu-h100-02 GPU 1 healthy -> failed" in story[first["GPU"]]
        # The decision's line tells its notice; no NOTIFY line says it again.
        assert "quarantine node/gpu-h100-02: applied" in story[first["DECISION"]]
        assert "; notice to oncall (critical)" in story[first["DECISION"]]
        assert not [line for line in out if line.startswith("NOTIFY ") and "quarantine" in line]
        assert "nodeward.io/gpu-unhealthy:NoSchedule, cordoned" in story[first["CORDON"]]
        banner = "".join(err)
        assert "outbox" in banner and "endpoints.json" in banner and "NATS nats://" in banner

        exported = tmp_path / "gpu.jsonl"
        replay = run(
            "replay",
            "--subject",
            "gpu.health.>",
            "--since",
            "5m",
            "--to",
            str(exported),
            "--state-dir",
            str(state),
            env={"NODEWARD_NATS_URL": ""},
        )
        assert replay.returncode == 0, replay.stderr
        events = [json.loads(line) for line in exported.read_text().splitlines()]
        assert f"{len(events)} event(s) written" in replay.stderr
        assert {e["type"] for e in events} == {"gpu.health.v1"}
        failed = [
            e
            for e in events
            if e["data"]["node"] == "gpu-h100-02" and e["data"]["state"] == "failed"
        ]
        assert failed and failed[0]["data"]["gpu_index"] == 1
        one_gpu = [
            e["data"]["sequence"]
            for e in events
            if e["data"]["node"] == "gpu-h100-02" and e["data"]["gpu_index"] == 1
        ]
        assert (
            one_gpu == sorted(one_gpu) and len(one_gpu) >= 3
        )  # stream order: start, fail, recover
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=60)
        output.join(timeout=5)
    assert code == 0, "".join(err)[-2000:]


def test_status_without_a_running_platform_is_one_clear_line(tmp_path: Path) -> None:
    env = {"NODEWARD_NATS_URL": ""}
    got = run("status", "--state-dir", str(tmp_path), env=env)
    assert got.returncode == 1
    assert got.stderr.strip().splitlines() == [got.stderr.strip()]
    assert got.stderr.startswith("nodeward: error: nothing running: no `nodeward up` in")


def test_replay_refuses_a_bad_since_in_one_line() -> None:
    got = run("replay", "--since", "last tuesday", "--nats", "nats://127.0.0.1:1")
    assert got.returncode == 2
    assert got.stderr.strip().splitlines() == [
        "nodeward replay: error: Invalid value for --since: 'last tuesday' is neither a "
        "duration (90s, 15m, 1h30m) nor an RFC 3339 time (2026-11-29T20:00:00Z)"
    ]
