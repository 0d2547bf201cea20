"""Issue 16's last check, on the whole platform: 200 random garbage messages across every
subject `nodeward up`'s services consume, then a real fault, handled within a second; every
piece of garbage dead-lettered, none redelivered forever, every daemon still ready."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import httpx
import nats
import pytest

from schemas.cloudevents import encode
from tests.conftest import REPO
from tests.e2e.test_cli import NODEWARD, Output, wait_until
from tests.integration.cordon_fixtures import failed

pytestmark = pytest.mark.timeout(240)

# What up's consumers take (gpu.health/gpu.xid: cordon; session.*: culler; falco.*: falco;
# maintenance.requested.*: checkpoint; notify.*: notifier), with the node tokens garbage uses.
SUBJECTS = (
    "gpu.health.{node}.0",
    "gpu.xid.{node}.1",
    "session.idle.{node}.ml-nlp.bob-explore-0",
    "session.activity.{node}.ml-nlp.bob-explore-0",
    "falco.critical.garbage_rule",
    "maintenance.requested.{node}",
    "notify.warning.power-limit",
)


async def _flood_then_fault(url: str, nodes: list[str], target: str) -> tuple[float, int]:
    """Publish the garbage, then the fault; the seconds until the fault's quarantine is
    audited, and how many messages reached the DLQ stream."""
    nc = await nats.connect(url)
    js = nc.jetstream()
    rng = random.Random(16)
    before = (await js.stream_info("DLQ")).state.messages
    template = encode(failed(nodes[0]))
    audited = asyncio.get_running_loop().create_future()

    async def on_audit(msg: nats.aio.msg.Msg) -> None:
        data = json.loads(msg.data)
        applied = data.get("action") == "quarantine" and data.get("outcome") == "applied"
        if applied and not audited.done():
            audited.set_result(time.monotonic())

    sub = await nc.subscribe(f"remediation.quarantine.{target}", cb=on_audit)
    for i in range(200):
        # Never the template's node (0: its events would be real) nor the target (2).
        subject = rng.choice(SUBJECTS).format(node=nodes[1])
        kind = i % 4
        body = rng.randbytes(rng.randrange(0, 4096))
        if kind == 0:
            headers = None
        elif kind == 1:
            headers = {"ce-type": "gpu.health.v1", "ce-id": f"g{i}", "ce-specversion": "9"}
        else:  # a valid envelope: random bytes, or a well-formed event about another node
            headers = dict(template.headers) | {"ce-id": f"g{i}", "Nats-Msg-Id": f"g{i}"}
            body = template.body if kind == 3 else body
        await js.publish(subject, body, headers=headers)
    fault = encode(failed(target, seq=7))
    began = time.monotonic()
    await js.publish(fault.subject, fault.body, headers=fault.headers)
    took = await asyncio.wait_for(audited, 30) - began
    await sub.unsubscribe()

    async def dead() -> int:
        return int((await js.stream_info("DLQ")).state.messages - before)

    deadline = time.monotonic() + 60
    while await dead() < 200 and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    got = await dead()
    await nc.close()
    return took, got


def test_garbage_on_every_consumed_subject_then_a_fault_handled_within_a_second(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    env = {k: v for k, v in os.environ.items() if not k.startswith("NODEWARD_")} | {
        "PYTHONPATH": str(REPO)
    }
    proc = subprocess.Popen(
        [*NODEWARD, "up", "--state-dir", str(state), "--nodes", "3", "--scenario", "none"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    output = Output(proc)
    try:
        wait_until((state / "endpoints.json").exists, timeout=90, what="nodeward up")
        endpoints = json.loads((state / "endpoints.json").read_text())

        def ready() -> bool:
            return all(
                httpx.get(f"{url}/readyz", timeout=2).status_code == 200
                for url in endpoints["metrics"].values()
            )

        wait_until(ready, timeout=60, what="every daemon ready")
        nodes = ["gpu-h100-01", "gpu-h100-02", "gpu-h100-03"]
        took, dead = asyncio.run(_flood_then_fault(endpoints["nats_url"], nodes, nodes[-1]))
        print(f"fault audited {took:.3f}s after publish; {dead} dead-lettered")
        assert took < 1.0, f"the fault was audited {took:.2f}s after it was published"
        assert dead >= 200, f"{dead} of 200 garbage messages dead-lettered"
        wait_until(ready, timeout=30, what="every daemon still ready")
    finally:
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=60)
        output.join(timeout=5)
    assert code == 0, "".join(output.err)[-2000:]
