"""`nodeward up --nodes 256 --scenario none` on the fleet simulator: every daemon ready, the
cordon service's consumers through the fleet's start (every GPU's state at once) and still
through everything the 256 nodes published while watched, and an XID 79 injected on a fleet
node quarantined (issue 19's first done-when check).

No timing is asserted: how far behind the consumers run and how long an XID takes to become a
taint are `bench/fleet.py`'s figures, measured against a baseline in the same run."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import nats
import pytest

from nodeward.config import ClusterSettings
from nodeward.kube import Cluster
from nodeward.kube.client import KubeClient
from nodeward.kube.nodes import taints_of
from schemas.state.cordon import TAINT_KEY
from tests.conftest import wait_for
from tests.e2e.platform import running_up

# Two `up`s of this size side by side would starve each other on a 2-core runner: this and
# test_observability_up.py (Prometheus scraping every daemon each second) share a worker.
pytestmark = [pytest.mark.timeout(180), pytest.mark.xdist_group("heavy-up")]

CONSUMERS = (("GPU", "cordon"), ("HEARTBEATS", "cordon-heartbeats"))


async def _oldest_unacked(js: Any, stream: str, consumer: str) -> datetime | None:
    """When the oldest message the consumer has not acknowledged was stored, at the latest
    (the message after its ack floor; on a filtered consumer that one may not be its own, and
    is older); None when it has nothing pending."""
    info = await js.consumer_info(stream, consumer)
    if not (info.num_pending or info.num_ack_pending):
        return None
    msg = await js.get_msg(stream, (info.ack_floor.stream_seq or 0) + 1)
    return datetime.fromisoformat(str(msg.time)[:26].rstrip("Z") + "+00:00")


async def _check(state: Path, endpoints: dict[str, Any]) -> list[float]:
    nc = await nats.connect(endpoints["nats_url"])
    js = nc.jetstream()
    kube = Cluster(KubeClient.from_settings(ClusterSettings(kubeconfig=state / "kubeconfig")))
    try:

        async def through(since: datetime) -> bool:
            for stream, consumer in CONSUMERS:
                oldest = await _oldest_unacked(js, stream, consumer)
                if oldest is not None and oldest <= since:
                    return False
            return True

        # Through the start (every GPU's state at once), then through everything stored
        # while the fleet went on publishing: keeping up, not catching up once.
        for what in ("the fleet's start", "what the fleet published since"):
            await wait_for(partial(through, datetime.now(UTC)), timeout=60, what=what)
        listed = await kube.nodes.list(label_selector="nvidia.com/gpu.present=true")
        # Device-plugin nodes: on a DRA node (cloned from gpu-h100-dra-01) one failed GPU
        # taints that device alone, not the node.
        plugin = [n for n in listed if "nvidia.com/gpu" in n["status"]["allocatable"]]
        latencies = []
        for node in [n["metadata"]["name"] for n in plugin][-3:]:
            began = time.monotonic()
            reply = await nc.request(f"sim.inject.{node}", b'{"gpu": 0, "xid": 79}', timeout=5)
            assert json.loads(reply.data)["ok"], reply.data

            async def tainted(node: str = node) -> bool:
                return any(t.get("key") == TAINT_KEY for t in taints_of(await kube.nodes.get(node)))

            await wait_for(tainted, timeout=60, interval=0.05, what=f"{node} quarantined")
            latencies.append(time.monotonic() - began)
        return latencies
    finally:
        await nc.close()
        await kube.close()


def test_256_nodes_the_cordon_keeps_up_and_an_xid_79_is_quarantined(
    tmp_path: Path,
) -> None:
    with running_up(tmp_path, "--nodes", "256", "--scenario", "none", "--quiet", timeout=60) as up:
        daemons = up.daemons
        assert "fleet" in daemons and not any(n.startswith("agent-") for n in daemons)
        latencies = asyncio.run(_check(up.state, up.endpoints))
        assert len(latencies) == 3
        print("XID 79 to taint at 256 nodes: " + ", ".join(f"{t:.2f}s" for t in latencies))
