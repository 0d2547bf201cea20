"""What `nodeward status` loads to read a real fleet: nats and the schemas, no daemon, kube
client or simulator, and no aiohttp (nats-py's websocket transport, unused on nats://). Of
the services, only the command modules the command line mounts (typer alone)."""

from __future__ import annotations

import asyncio
import json
import sys
from datetime import UTC, datetime
from pathlib import Path

from nodeward.bus import Bus
from nodeward.cli.plugins import registered
from nodeward.plugin import services
from schemas import make_event
from schemas.gpu import GpuHeartbeat, GpuState, HealthState
from tests.conftest import REPO

NOT_FOR_STATUS = (
    "aiohttp.client",
    "aiohttp.web",
    "kubernetes",
    "agents",
    "services",
    "nodeward.kube",
    "nodeward.daemon",
    "nodeward.platform",
    "launch.up",
    "launch.demo",
    "sim.cluster",
    "sim.nvml",
)

MOUNTED = {"services", *(ref.split(":")[0] for _, ref in registered())} | {
    p.package for p in services()
}
"""The services' command modules (their plugins' `commands`) and packages (their plugins)."""
VIEWS = {p.ref(p.view).split(":")[0] for p in services() if p.view is not None}
"""The services' views, which `nodeward status` reads with (`nodeward.views`), each with the
records of its own package it reads (`state`); never a daemon (`service`)."""
VIEW_RECORDS = {f"{p.package}.state" for p in services() if p.view is not None}

RUN = """
import json, sys
from launch.cli import main
code = main(sys.argv[1:])
sys.stderr.write("\\nMODULES " + json.dumps(sorted(sys.modules)) + "\\n")
sys.exit(code)
"""


async def test_status_reads_the_fleet_without_daemons_or_aiohttp(
    bus: Bus, nats_url: str, node: str, tmp_path: Path
) -> None:
    beat = GpuHeartbeat(
        node=node,
        gpus=[
            GpuState(
                gpu_index=0,
                gpu_uuid=f"GPU-{node}-0",
                state=HealthState.FAILED,
                sequence=1,
                changed_at=datetime.now(UTC),
            )
        ],
        interval_s=30,
        observed_at=datetime.now(UTC),
        agent_boot_id="boot-1",
    )
    await bus.publish(make_event(beat, source="test/status"))
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        RUN,
        "status",
        "--json",
        "--nats",
        nats_url,
        "--state-dir",
        str(tmp_path),
        cwd=REPO,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode == 0, err.decode()[-2000:]
    fleet = json.loads(out)
    mine = [n for n in fleet["nodes"] if n["name"] == node]
    assert mine and mine[0]["health"] == "failed"
    line = next(x for x in err.decode().splitlines() if x.startswith("MODULES "))
    loaded = json.loads(line.removeprefix("MODULES "))
    assert "nats.js" in loaded and "nodeward.fleet_status" in loaded  # what it read with
    held = [
        m
        for m in loaded
        if any(m == n or m.startswith(f"{n}.") for n in NOT_FOR_STATUS)
        and m not in MOUNTED | VIEWS | VIEW_RECORDS
    ]
    assert held == []
    assert VIEWS and set(loaded) >= VIEWS
