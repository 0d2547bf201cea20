"""The capacity service on real NATS and the sim cluster: counts checked against the seed
by hand, then after a quarantine, a maintenance drain and a new pod, each within 5 s."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

import yaml

from schemas import make_event
from schemas.capacity import CapacityChanged, GpuCounts
from schemas.gpu import GpuHealth, HealthReason, HealthState
from schemas.maintenance import Maintenance, MaintenancePhase
from tests.conftest import REPO, wait_for
from tests.integration.capacity_fixtures import A100, H100, NS, CapacityEnv, EnvFactory
from tests.integration.cordon_fixtures import read_stream

WITHIN = 5.0


async def _until(env: CapacityEnv, short: str, want: GpuCounts, what: str) -> float:
    """Seconds until node `short`'s whole-GPU counts are `want` (at most WITHIN)."""
    began = time.monotonic()

    async def reached() -> bool:
        return await env.counts(short) == want

    await wait_for(reached, timeout=WITHIN, interval=0.05, what=what)
    seconds = time.monotonic() - began
    print(f"capacity: {what} counted after {seconds:.2f}s")
    return seconds


def _gauges(url: str) -> dict[tuple[str, str, str], float]:
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("nodeward_gpus{"):
            labels, value = line.removeprefix("nodeward_gpus{").split("} ")
            got = dict(kv.split("=", 1) for kv in labels.split(","))
            key = tuple(got[k].strip('"') for k in ("model", "profile", "state"))
            out[key] = float(value)  # type: ignore[index]
    return out


def _cli(env: CapacityEnv, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    config = tmp_path / "capacity.yaml"
    config.write_text(yaml.safe_dump({"services": {"capacity": {"bucket": env.bucket}}}))
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "launch",
            "capacity",
            "--nats",
            env.settings.bus.url,
            "--config",
            str(config),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if not k.startswith("NODEWARD_")}
        | {"PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])},
    )


async def test_counts_follow_the_seed_a_quarantine_a_drain_and_a_new_pod(
    capacity_env: EnvFactory, tmp_path: Path
) -> None:
    env = await capacity_env()
    daemon = await env.start()
    await wait_for(env.snapshot, timeout=15, what="the first snapshot")

    # The seed, by hand (capacity_seed's docstring).
    assert await env.counts("h100-a") == GpuCounts(free=2, used=6)
    assert await env.counts("h100-b") == GpuCounts(free=7, used=1)
    assert await env.counts("a100") == GpuCounts(free=5, used=3)
    assert await env.counts("mig", "1g.10gb") == GpuCounts(free=12, used=2)
    assert await env.counts("mig", "3g.40gb") == GpuCounts(free=1, used=1)
    snap = await env.snapshot()
    assert snap is not None
    assert env.node("cpu") not in {n.node for n in snap.nodes}
    totals = {(t.model, t.profile): t.counts for t in snap.totals()}
    assert totals == {
        (H100, "gpu"): GpuCounts(free=9, used=7),
        (A100, "gpu"): GpuCounts(free=5, used=3),
        (A100, "1g.10gb"): GpuCounts(free=12, used=2),
        (A100, "3g.40gb"): GpuCounts(free=1, used=1),
    }
    gauges = await asyncio.to_thread(_gauges, daemon.url)  # the daemon runs on this loop
    assert gauges[(H100, "gpu", "free")] == 9 and gauges[(A100, "1g.10gb", "used")] == 2

    # A quarantine: GPU 0 of h100-b fails (XID 79), and the node is tainted and cordoned.
    now = datetime.now(UTC)
    failed = GpuHealth(
        node=env.node("h100-b"),
        gpu_index=0,
        gpu_uuid=f"GPU-{env.uid}-0",
        state=HealthState.FAILED,
        previous_state=HealthState.HEALTHY,
        reasons=[HealthReason(code="xid", xid=79, message="GPU has fallen off the bus")],
        observed_at=now,
        sequence=1,
    )
    await env.bus.publish(make_event(failed, source=f"agent/gpu/{env.node('h100-b')}"))
    await env.admin.nodes.add_taint(env.node("h100-b"), "nodeward.io/gpu-unhealthy")
    await env.admin.nodes.set_unschedulable(env.node("h100-b"))
    await _until(env, "h100-b", GpuCounts(used=1, unhealthy=1, quarantined=6), "a quarantine")

    # A maintenance drain of a100: the phase on the bus, the cordon, the eviction.
    drain = Maintenance(
        node=env.node("a100"), phase=MaintenancePhase.DRAINING, maintenance_id=f"m-{env.uid}"
    )
    await env.bus.publish(make_event(drain, source="service/checkpoint"))
    await env.admin.nodes.set_unschedulable(env.node("a100"))
    assert await env.admin.pods.evict(NS, "eval-0")
    await _until(env, "a100", GpuCounts(maintenance=8), "a maintenance drain")

    # A new pod bound to h100-a takes its last 2 GPUs.
    await env.admin.client.request(
        "POST",
        f"/api/v1/namespaces/{NS}/pods",
        body={
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "notebook-new", "namespace": NS},
            "spec": {
                "nodeName": env.node("h100-a"),
                "containers": [
                    {
                        "name": "nb",
                        "image": "jupyter",
                        "resources": {"limits": {"nvidia.com/gpu": "2"}},
                    }
                ],
            },
        },
    )
    await _until(env, "h100-a", GpuCounts(used=8), "a new pod")

    # Each change of the H100 totals was published: the last one says none is free.
    events = await read_stream(env.bus, "CAPACITY", "capacity.NVIDIA-H100-80GB-HBM3.gpu")
    mine = [e.data for e in events if isinstance(e.data, CapacityChanged)]
    final = GpuCounts(used=9, unhealthy=1, quarantined=6)
    assert any(
        d.counts == final
        and d.previous == GpuCounts(free=2, used=7, unhealthy=1, quarantined=6)
        and d.free_by_node == {}
        for d in mine
    ), mine[-3:]

    # Does a 2-GPU H100 pod fit now? No (exit 3); a 1g.10gb slice does, on the MIG node.
    no = _cli(env, tmp_path, "--request", "nvidia.com/gpu=2", "--model", "H100")
    assert no.returncode == 3, no.stderr
    assert no.stdout.startswith("does not fit now"), no.stdout
    yes = _cli(env, tmp_path, "--request", "nvidia.com/mig-1g.10gb=4", "--json")
    assert yes.returncode == 0, yes.stderr
    answer = json.loads(yes.stdout)
    assert answer["fits"] and [n["node"] for n in answer["nodes"]] == [env.node("mig")]
    assert answer["nodes"][0]["left"] == {"1g.10gb": 8}
    table = _cli(env, tmp_path, "--model", "A100", "--json")
    assert table.returncode == 0, table.stderr
    rows = {
        (t["model"], t["profile"]): t["counts"]["free"] for t in json.loads(table.stdout)["totals"]
    }
    assert rows == {(A100, "gpu"): 0, (A100, "1g.10gb"): 12, (A100, "3g.40gb"): 1}

    # Restarted, it still knows GPU 0 of h100-b failed (from its snapshot; the consumer
    # resumes after the event), and writes a fresh snapshot that says so.
    before = await env.snapshot()
    assert before is not None
    await env.stop(daemon)
    await env.start()

    async def rewritten() -> bool:
        now = await env.snapshot()
        return now is not None and now.at > before.at

    await wait_for(rewritten, timeout=10, what="the snapshot after the restart")
    assert await env.counts("h100-b") == GpuCounts(used=1, unhealthy=1, quarantined=6)


async def test_a_request_that_is_no_gpu_resource_is_refused_in_one_line(
    capacity_env: EnvFactory, tmp_path: Path
) -> None:
    env = await capacity_env()
    bad = _cli(env, tmp_path, "--request", "cpu=4")
    assert bad.returncode == 2
    assert len(bad.stderr.strip().splitlines()) == 1 and "nvidia.com/gpu=4" in bad.stderr
