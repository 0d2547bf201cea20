"""The operator controls against `nodeward up`: each works on what nodeward did (the taint,
cordon or isolation label gone from the API, the audit record with the operator and the
reason) and refuses what it did not (a node cordoned by hand stays cordoned)."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path
from typing import Any

import httpx
import pytest

from nodeward.config import ClusterSettings
from nodeward.kube.client import MERGE_PATCH, KubeClient
from tests.conftest import wait_for
from tests.e2e.platform import running_up
from tests.e2e.test_cli import run
from tests.integration.falco_fixtures import DROP_AND_EXECUTE, samples

pytestmark = pytest.mark.timeout(240)

BOB = "bob-llm-finetune-6d5f9c7b8d-q8wzr"


async def test_controls_undo_what_nodeward_did_and_refuse_the_rest(tmp_path: Path) -> None:
    with running_up(tmp_path, "--scenario", "none", "--quiet", "--nodes", "4") as up:
        state = str(up.state)

        async def nodeward(*args: str) -> subprocess.CompletedProcess[str]:
            return await asyncio.to_thread(run, *args, "--state-dir", state)

        kube = KubeClient.from_settings(ClusterSettings(kubeconfig=up.state / "kubeconfig"))

        async def node(name: str) -> dict[str, Any]:
            found: dict[str, Any] = await kube.request("GET", f"/api/v1/nodes/{name}")
            return found

        try:
            # gpu-h100-02 cordoned by hand; gpu-h100-03 and -04 lose a GPU (the breaker
            # admits one node of four: the second trips it).
            await kube.request(
                "PATCH",
                "/api/v1/nodes/gpu-h100-02",
                body={"spec": {"unschedulable": True}},
                content_type=MERGE_PATCH,
            )
            for name in ("gpu-h100-03", "gpu-h100-04"):
                done = await nodeward("sim", "inject", "--node", name, "--gpu", "0", "--xid", "79")
                assert done.returncode == 0, done.stderr

            async def tripped() -> bool:
                listed = await nodeward("quarantine", "list")
                breaker = await nodeward("breaker", "status")
                return "gpu-h100-03" in listed.stdout and "TRIPPED" in breaker.stdout

            await wait_for(tripped, timeout=30, what="gpu-h100-03 quarantined, breaker tripped")

            refused = await nodeward(
                "quarantine", "release", "gpu-h100-02", "--reason", "r", "--operator", "ann"
            )
            assert refused.returncode == 1
            assert refused.stderr.strip() == (
                "nodeward: cordon: refused: gpu-h100-02 has no quarantine by nodeward and stays "
                "cordoned; nodeward undoes only what it did"
            )
            assert (await node("gpu-h100-02"))["spec"].get("unschedulable") is True

            released = await nodeward(
                "quarantine",
                "release",
                "gpu-h100-03",
                "--reason",
                "reseated",
                "--operator",
                "ann",
            )
            assert released.returncode == 0, released.stderr
            # The quarantine's marks are gone at once; the recovery that XID 79 started
            # (its drain cordons the node too) is taken back by services.recovery on its own.
            after = await node("gpu-h100-03")
            assert not [t for t in after["spec"].get("taints") or [] if "nodeward" in t["key"]]

            async def in_service() -> bool:
                return not (await node("gpu-h100-03"))["spec"].get("unschedulable")

            await wait_for(in_service, timeout=30, what="gpu-h100-03 schedulable again")

            reset = await nodeward(
                "breaker", "reset", "--reason", "storm over", "--operator", "ann"
            )
            assert reset.returncode == 0, reset.stderr
            assert (await nodeward("breaker", "status")).stdout.startswith("circuit breaker closed")

            # Falco: bob's pod isolated by nodeward, then released.
            endpoints = up.endpoints
            token = Path(endpoints["falco_token_file"]).read_text().strip()
            alert = next(a for a in samples() if a["rule"] == DROP_AND_EXECUTE)
            async with httpx.AsyncClient() as client:
                answer = await client.post(
                    endpoints["falco_ingest_url"],
                    json=alert,
                    headers={"Authorization": f"Bearer {token}"},
                    timeout=5,
                )
            assert answer.status_code == 200, answer.text

            async def labels() -> dict[str, str]:
                pod = await kube.request("GET", f"/api/v1/namespaces/user-bob/pods/{BOB}")
                return dict(pod["metadata"].get("labels") or {})

            async def isolated() -> bool:
                return (await labels()).get("nodeward.io/isolated") == "true"

            await wait_for(isolated, timeout=20, what="bob's pod isolated")
            lifted = await nodeward(
                "falco", "release", f"user-bob/{BOB}", "--reason", "benchmark", "--operator", "ann"
            )
            assert lifted.returncode == 0, lifted.stderr
            assert "nodeward.io/isolated" not in await labels()

            # Maintenance: requested for later, cancelled before its cordon.
            started = await nodeward("maintenance", "start", "gpu-h100-01", "--at", "1h")
            assert started.returncode == 0, started.stderr
            cancelled = await nodeward(
                "maintenance",
                "cancel",
                "gpu-h100-01",
                "--reason",
                "postponed",
                "--operator",
                "ann",
            )
            assert cancelled.returncode == 0, cancelled.stderr
            assert "cancelled maintenance" in cancelled.stdout

            # Each is on the audit stream as the operator's, with the reason.
            async def audited() -> dict[str, dict[str, Any]] | None:
                replay = await nodeward("replay", "--since", "10m", "--subject", "remediation.>")
                found = {}
                for line in replay.stdout.splitlines():
                    data = json.loads(line)["data"]
                    if data["outcome"] == "applied" and data["details"].get("operator") == "ann":
                        found[data["action"]] = data
                wanted = {"release", "breaker_reset", "cancel"}
                return found if wanted <= set(found) and len(found) >= 3 else None

            found = await wait_for(audited, timeout=20, what="the operator's audit records")
            assert found["breaker_reset"]["details"]["operator_reason"] == "storm over"
            assert found["cancel"]["details"]["operator_reason"] == "postponed"
        finally:
            await kube.close()
