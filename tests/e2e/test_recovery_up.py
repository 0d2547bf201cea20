"""In `nodeward up`, an XID 79 (a GPU fallen off the bus) ends with the node drained,
rebooted (by the simulated reboot operator), validated and released without a human, every
step in the audit and on the story."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.platform import running_up
from tests.e2e.test_cli import NODEWARD, wait_until
from tests.e2e.test_maintenance_up import _kubectl

pytestmark = pytest.mark.timeout(300)

NODE = "gpu-h100-04"  # no budget, exempt or isolated pod on it: the drain empties it
RECOVERY_ENV = {
    "NODEWARD_SERVICES__RECOVERY__DRAIN_DEADLINE": "10s",
    "NODEWARD_SERVICES__RECOVERY__INTERVAL": "1s",
}


def _audit(nats: str) -> list[dict[str, Any]]:
    got = subprocess.run(
        [*NODEWARD, "tail", "remediation.>", "--since", "10m", "--json", "--timeout", "2s",
         "--count", "500", "--nats", nats],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    events = [json.loads(line) for line in got.stdout.splitlines() if line.strip()]
    return [e["data"] for e in events if e.get("data", {}).get("target", {}).get("name") == NODE]


def test_xid_79_ends_drained_rebooted_validated_and_released(tmp_path: Path) -> None:
    with running_up(tmp_path, "--scenario", "none", env=RECOVERY_ENV) as up:
        nats = up.endpoints["nats_url"]
        kubeconfig = up.state / "kubeconfig"
        before = _kubectl(kubeconfig, "get", "node", NODE)["status"]["nodeInfo"]["bootID"]
        injected = subprocess.run(
            [*NODEWARD, "sim", "inject", "--node", NODE, "--gpu", "3", "--fault",
             "fallen-off-bus", "--nats", nats],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert injected.returncode == 0, injected.stderr

        def released() -> bool:
            return any(
                a["actor"] == "service/recovery"
                and a["action"] == "release"
                and a["outcome"] == "applied"
                for a in _audit(nats)
            )

        wait_until(released, timeout=200, what=f"recovery released {NODE}: {up.output.err[-5:]}")
        steps = [
            (a["actor"], a["action"], a["outcome"])
            for a in _audit(nats)
            if a["outcome"] in ("applied", "failed")
        ]
        expected = [
            ("service/cordon", "quarantine", "applied"),
            ("service/recovery", "recover", "applied"),
            ("service/recovery", "drain", "applied"),  # maintenance requested
            ("service/checkpoint", "drain", "applied"),
            ("service/recovery", "reboot", "applied"),  # the reboot asked
            ("service/recovery", "validate", "applied"),
            ("service/checkpoint", "finish", "applied"),
            ("service/cordon", "release", "applied"),
            ("service/recovery", "release", "applied"),
        ]
        at = 0
        for step in steps:  # in this order (other records may come between)
            if at < len(expected) and step == expected[at]:
                at += 1
        assert at == len(expected), f"missing {expected[at:]} in {steps}"
        assert not [s for s in steps if s[2] == "failed"], steps

        node = _kubectl(kubeconfig, "get", "node", NODE)
        assert node["status"]["nodeInfo"]["bootID"] != before  # rebooted
        assert not node["spec"].get("unschedulable")  # released
        taints = [t["key"] for t in node["spec"].get("taints") or []]
        assert "nodeward.io/gpu-unhealthy" not in taints

        # The story on up's terminal tells each step of the recovery.
        def told(*words: str) -> bool:
            return any(all(w in line for w in words) for line in up.output.out)

        wait_until(lambda: told("RELEASE", "release", NODE, "back in service"), timeout=20,
                   what=f"the story's release line: {up.output.out[-5:]}")  # fmt: skip
        for action in ("recover", "drain", "reboot", "validate"):
            assert told("RECOVERY", f"{action} node/{NODE}: applied"), action
        labels = node["metadata"].get("labels") or {}
        assert "nodeward.io/reboot-required" not in labels  # the request taken back
        assert "nodeward.io/reboot-request" not in (node["metadata"].get("annotations") or {})
