"""`nodeward up --nodes N`: the seed's fleet cut or grown to N GPU nodes.

Fewer: the first N GPU nodes and only the pods on them. More: extra nodes cloned from the
seed's GPU node shapes in turn (same GPUs, MIG layout, size and zone), each with a node
agent pod like the one its shape has, named after the shape (`gpu-h100-05`, ...).
"""

from __future__ import annotations

import hashlib
import re

from sim.cluster.seed import NodeSeed, PodSeed, Seed, SeedError

_NUMBERED = re.compile(r"^(?P<prefix>.*?)-?(?P<number>\d+)$")


def _prefix(name: str) -> str:
    match = _NUMBERED.match(name)
    return match.group("prefix") if match else name


def _unique(base: str, key: str, namespace: str, taken: set[tuple[str, str]]) -> str:
    """`<base>-<5 hex>` from `key`'s hash, unused in `namespace` (noted in `taken`): five
    hex digits collide within a few thousand nodes, so a taken one is hashed again."""
    for attempt in range(1000):
        suffix = hashlib.sha256(f"{key}/{attempt}".encode() if attempt else key.encode())
        name = f"{base}-{suffix.hexdigest()[:5]}"
        if (namespace, name) not in taken:
            taken.add((namespace, name))
            return name
    raise SeedError(f"no free pod name for {key}")


def resize_seed(seed: Seed, nodes: int) -> Seed:
    """A copy of `seed` with exactly `nodes` GPU nodes; nodes without GPUs are kept."""
    if nodes < 1:
        raise SeedError(f"--nodes must be at least 1, not {nodes}")
    shapes = [n for n in seed.nodes if n.gpu is not None and n.gpu.count > 0]
    if not shapes:
        raise SeedError("the seed has no GPU node to size the fleet from")
    others = [n for n in seed.nodes if n not in shapes]
    kept = shapes[:nodes]
    names = {n.name for n in seed.nodes}
    pod_names = {(p.namespace, p.name) for p in seed.pods}
    extra: list[NodeSeed] = []
    daemon_pods: list[PodSeed] = []
    for i in range(nodes - len(kept)):
        shape = shapes[i % len(shapes)]
        prefix = _prefix(shape.name)
        number = 1
        while f"{prefix}-{number:02d}" in names:
            number += 1
        name = f"{prefix}-{number:02d}"
        names.add(name)
        extra.append(shape.model_copy(deep=True, update={"name": name}))
        for pod in seed.pods:
            if pod.node == shape.name and pod.role == "daemon":
                base = pod.name.rsplit("-", 1)[0]
                clone = _unique(base, f"{pod.name}/{name}", pod.namespace, pod_names)
                daemon_pods.append(pod.model_copy(deep=True, update={"name": clone, "node": name}))
    fleet = [*kept, *extra]
    on_fleet = {n.name for n in [*fleet, *others]}
    pods = [p for p in seed.pods if p.node in on_fleet] + daemon_pods
    return seed.model_copy(deep=True, update={"nodes": [*fleet, *others], "pods": pods})
