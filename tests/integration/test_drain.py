"""The kernel's drain against the sim cluster's graceful deletion: a node is drained only once
its evicted pods are gone, as `kubectl drain` waits for them."""

from __future__ import annotations

from datetime import timedelta

from nodeward.kube import Cluster
from services.kernel.drain import DrainSettings, drain, excused
from services.kernel.exemptions import Exemptions
from sim.cluster.kubelet import EXITS_AFTER

NODE = "gpu-h100-01"


async def _pods(admin: Cluster) -> list[str]:
    return sorted(
        f"{p['metadata']['namespace']}/{p['metadata']['name']}"
        for p in await admin.pods.on_node(NODE)
    )


async def test_a_drain_waits_until_its_evicted_pods_are_gone(admin: Cluster) -> None:
    before = await _pods(admin)
    assert before
    settings = DrainSettings(enabled=True, deadline=timedelta(seconds=20), skip_namespaces=[])
    result = await drain(admin, NODE, settings, Exemptions())
    assert result.complete, result.to_json()
    assert not result.terminating
    left = set(await _pods(admin))
    assert left == set(result.kept), "every evicted pod is gone from the API when it returns"
    assert set(result.evicted) | set(result.kept) | set(result.gone) == set(before)


async def test_a_pod_still_terminating_at_the_deadline_is_reported(admin: Cluster) -> None:
    pods = await admin.pods.on_node(NODE)
    slow = next(p for p in pods if excused(p, []) is None)
    meta = slow["metadata"]
    await admin.pods.set_annotations(meta["namespace"], meta["name"], {EXITS_AFTER: "30"})
    settings = DrainSettings(enabled=True, deadline=timedelta(seconds=1), skip_namespaces=[])
    result = await drain(admin, NODE, settings, Exemptions())
    ref = f"{meta['namespace']}/{meta['name']}"
    assert ref in result.terminating and not result.complete
    assert result.incomplete()[ref] == "evicted, still terminating at the deadline"
    still = await admin.pods.get(meta["namespace"], meta["name"])
    assert still["metadata"]["deletionTimestamp"]
