"""In `nodeward up`, a hung node (`sim inject --node gpu-h100-04 --hang`: its machine, which
a simulated BMC runs, SIGSTOPped, its agents silent) ends back in service without a human:
found unresponsive, the ladder's reboot request unanswered, the BMC's soft shutdown ignored,
a hard power off, the out-of-service fence, power on, a new boot, validated and released;
the story tells each step."""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path

import nats
import pytest
from nats.errors import NoRespondersError
from nats.js.errors import KeyNotFoundError

from schemas.recovery import VALIDATE, agent_subject
from services.recovery.hang import OUT_OF_SERVICE
from services.recovery.state import RecoveryRecord, Step, node_key
from tests.e2e.platform import running_up
from tests.e2e.test_cli import NODEWARD, wait_until
from tests.e2e.test_maintenance_up import _kubectl
from tests.ipmi_sim import need_ipmi_sim

pytestmark = [pytest.mark.timeout(300), pytest.mark.peer("ipmi_sim")]

NODE = "gpu-h100-04"  # up's BMC-run node by default


async def _released(nats_url: str, timeout: float) -> RecoveryRecord:
    """The node's recovery record once it is released (an escalation fails the test)."""
    nc = await nats.connect(nats_url)
    try:
        kv = await nc.jetstream().key_value("recovery")
        deadline = time.monotonic() + timeout
        while True:
            try:
                entry = await kv.get(node_key(NODE))
            except KeyNotFoundError:  # not there yet
                record = None
            else:
                record = RecoveryRecord.model_validate_json(entry.value or b"")
            if record is not None:
                assert record.step != Step.ESCALATED, record.history
                if record.step == Step.RELEASED:
                    return record
            assert time.monotonic() < deadline, f"not released: {record and record.history}"
            await asyncio.sleep(0.2)
    finally:
        await nc.close()


async def _validate_unanswered(nats_url: str) -> bool:
    """Nobody answers the node's GPU validation (its agent is silent)."""
    nc = await nats.connect(nats_url)
    try:
        await nc.request(agent_subject(VALIDATE, NODE), b"{}", timeout=2)
    except NoRespondersError:
        return True
    except Exception:  # noqa: BLE001 - answered late, or wrongly: it is not silent
        return False
    finally:
        await nc.close()
    return False


def test_a_hung_node_is_power_cycled_through_its_bmc_fenced_and_released(
    tmp_path: Path,
) -> None:
    need_ipmi_sim()
    with running_up(tmp_path, "--scenario", "none") as up:
        assert up.endpoints["bmcs"].get(NODE), up.endpoints.get("bmcs")
        nats_url = up.endpoints["nats_url"]
        kubeconfig = up.state / "kubeconfig"

        def booted() -> str | None:
            node = _kubectl(kubeconfig, "get", "node", NODE)
            return (node["status"].get("nodeInfo") or {}).get("bootID")

        before = booted()
        no_bmc = subprocess.run(
            [*NODEWARD, "sim", "inject", "--node", "gpu-h100-03", "--hang", "--nats", nats_url],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert no_bmc.returncode == 1
        assert no_bmc.stderr.count("\n") == 1 and "no BMC runs its machine" in no_bmc.stderr

        started = time.monotonic()
        hung = subprocess.run(
            [*NODEWARD, "sim", "inject", "--node", NODE, "--hang", "--nats", nats_url],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert hung.returncode == 0, hung.stderr
        assert "machine hung" in hung.stdout
        assert asyncio.run(_validate_unanswered(nats_url)), "the hung node's GPU agent answered"

        record = asyncio.run(_released(nats_url, timeout=200))
        took = time.monotonic() - started
        print(f"hang -> released in {took:.1f} s")  # the figure, with -s

        node = _kubectl(kubeconfig, "get", "node", NODE)
        assert not record.fenced
        assert not [t for t in node["spec"].get("taints") or [] if t["key"] == OUT_OF_SERVICE]
        assert node["status"]["nodeInfo"]["bootID"] not in (before, None)  # a new boot
        assert not asyncio.run(_validate_unanswered(nats_url))  # its agent is back

        def told(*words: str) -> int | None:
            """The first story line with every word."""
            return next(
                (i for i, line in enumerate(up.output.out) if all(w in line for w in words)),
                None,
            )

        wait_until(lambda: told("RELEASE", f"release node/{NODE}: applied [hang]") is not None,
                   timeout=20, what=f"the story's release line: {up.output.out[-5:]}")  # fmt: skip
        order = [
            told("NODE", f"{NODE} unresponsive: Ready=Unknown"),
            told("RECOVERY", f"recover node/{NODE}: applied [hang]"),
            told("RECOVERY", f"reboot node/{NODE}: applied [hang, step 1]"),
            told("RECOVERY", f"power-off node/{NODE}: applied [hang"),
            told("RECOVERY", f"fence node/{NODE}: applied [hang", "out-of-service taint on"),
            told("RECOVERY", f"power-on node/{NODE}: applied [hang"),
            told("RECOVERY", f"unfence node/{NODE}: applied [hang]"),
            told("RELEASE", f"release node/{NODE}: applied [hang]"),
        ]
        assert None not in order and order == sorted(order), (order, up.output.out[-40:])
