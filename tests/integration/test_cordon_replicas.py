"""Two replicas of the cordon service on a three-server NATS cluster with partitioned
streams: they share the partitions and each node is released by one of them; one SIGKILLed
mid-storm (a process of its own) loses its partitions to the other within the lease TTL,
and every node is quarantined exactly once (one taint in the API, one applied audit),
nothing acknowledged lost."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from nats.errors import Error as NatsError

from nodeward.config import BusSettings
from schemas.gpu import HealthState
from schemas.state.lease import LeaseRecord
from tests.conftest import REPO, wait_for
from tests.helpers.nats_cluster import NatsCluster
from tests.integration.cordon_fixtures import EnvFactory, audits, failed, health
from tests.integration.test_cordon import outcomes, tainted

pytestmark = pytest.mark.timeout(240)

PARTITIONS = 4
TTL = 3.0
R3 = {"stream_replicas": 3, "publish_timeout": "5s", "partitions": PARTITIONS}


@pytest.fixture
def nats_url(nats_cluster: NatsCluster) -> str:
    """This module's NATS is the three-server cluster."""
    return nats_cluster.url


@pytest.fixture
def bus_settings(nats_url: str) -> BusSettings:
    return BusSettings(url=nats_url, **R3)


async def test_a_killed_replicas_partitions_are_taken_over_and_nothing_applied_twice(
    cordon_env: EnvFactory, tmp_path: Path
) -> None:
    env = await cordon_env(
        bus_extra=R3,
        breaker={"max_percent": 100, "max_nodes": 100, "calm_period": None},
        lease_ttl=f"{TTL}s",
        ack_wait="2s",
        healthy_period="0.5s",
    )
    section = env.settings.services["cordon"]
    group, bucket = section["consumer"], section["bucket"]
    config = tmp_path / "replica.json"
    config.write_text(json.dumps(env.settings.model_dump(mode="json")))
    log = (tmp_path / "replica.log").open("w")
    child = subprocess.Popen(
        [sys.executable, "-m", "launch", "service", "cordon", "--config", str(config)],
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    kv: Any = None
    try:

        async def holders() -> dict[int, str]:
            nonlocal kv
            if kv is None:
                try:
                    kv = await env.bus.js.key_value(bucket)
                except NatsError:
                    return {}
            out = {}
            for i in range(PARTITIONS):
                try:
                    entry = await kv.get(f"lease.{group}.p{i}")
                except Exception:  # noqa: BLE001 - not taken yet
                    continue
                record = LeaseRecord.model_validate_json(entry.value or b"{}")
                if record.expires_at > time.time():
                    out[i] = record.holder
            return out

        def mine(holder: str) -> bool:
            return f"-{os.getpid()}-" in holder

        async def child_holds_all() -> bool:
            held = await holders()
            return len(held) == PARTITIONS and not any(mine(h) for h in held.values())

        await wait_for(child_holds_all, timeout=90, interval=0.2, what="the child's partitions")
        daemon = await env.start()

        async def shared() -> bool:
            held = Counter(mine(h) for h in (await holders()).values())
            return held[True] == 2 and held[False] == 2 and (await daemon.readiness()).ready

        await wait_for(shared, timeout=6 * TTL, interval=0.2, what="two partitions each")
        first, rest = env.nodes[:5], env.nodes[5:]
        await env.publish(*(failed(n) for n in first))

        async def quarantined(nodes: list[str]) -> bool:
            return all([tainted(await env.node(n)) for n in nodes])

        await wait_for(lambda: quarantined(first), timeout=30, what="the first five")
        # Both replicas reconcile, each the nodes of its own partitions: one release each.
        await env.publish(*(health(n, HealthState.HEALTHY, seq=2) for n in first))

        async def released() -> bool:
            return not any([tainted(await env.node(n)) for n in first])

        await wait_for(released, timeout=30, what="the first five released")
        for node in first:

            async def undone(n: str = node) -> list[Any]:
                return await audits(env.bus, n, "release")

            assert outcomes(await wait_for(undone, timeout=10)) == [("applied", None)], node
        # Mid-storm the child dies without a word: its leases stay until they expire.
        await env.publish(*(failed(n) for n in rest[:2]))
        child.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        await env.publish(*(failed(n) for n in rest[2:]))

        async def all_mine() -> bool:
            held = await holders()
            return len(held) == PARTITIONS and all(mine(h) for h in held.values())

        # Within the TTL and the survivor's next claim round; the slack is for a loaded CI.
        await wait_for(all_mine, timeout=2 * TTL + 4, interval=0.1, what="the survivor's takeover")
        assert time.monotonic() - killed < 2 * TTL + 4
        await wait_for(lambda: quarantined(rest), timeout=30, what="the rest quarantined")
        for node in env.nodes:

            async def decided(n: str = node) -> list[Any]:
                return await audits(env.bus, n, "quarantine")

            found = await wait_for(decided, timeout=10, what=f"{node}'s audit")
            assert outcomes(found) == [("applied", None)], node  # once, by one replica
            if node in rest:
                taints: list[dict[str, Any]] = (await env.node(node))["spec"].get("taints") or []
                assert len([t for t in taints if t["key"] == "nodeward.io/gpu-unhealthy"]) == 1
    finally:
        with contextlib.suppress(ProcessLookupError):
            child.kill()
        child.wait()
        log.close()
