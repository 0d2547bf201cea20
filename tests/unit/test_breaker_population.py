"""The breaker's population: GPU nodes of either vendor (services.kernel.breaker)."""

from __future__ import annotations

from services.kernel.breaker import BreakerSettings, NodePopulation
from sim.cluster.seed import load_seed, node_manifest
from sim.cluster.selectors import match_labels, parse_label_selector


async def test_default_selectors_count_nvidia_and_amd_gpu_nodes() -> None:
    nodes = [node_manifest(n, i) for i, n in enumerate(load_seed().nodes)]
    asked: list[str | None] = []

    async def count(selector: str | None) -> int:
        asked.append(selector)
        if selector is None:
            return len(nodes) + 3  # and some CPU nodes
        reqs = parse_label_selector(selector)
        return sum(1 for n in nodes if match_labels(reqs, n["metadata"]["labels"]))

    population = NodePopulation(count, BreakerSettings().node_selector)
    assert await population() == 11  # 9 NVIDIA (the DRA node too), 2 MI300X; no CPU node
    assert None not in asked
    assert await NodePopulation(count, "nvidia.com/gpu.present=true")() == 9


async def test_no_match_counts_every_node() -> None:
    async def count(selector: str | None) -> int:
        return 7 if selector is None else 0

    assert await NodePopulation(count, ["a=b", "c=d"])() == 7
    assert await NodePopulation(count, None)() == 7
