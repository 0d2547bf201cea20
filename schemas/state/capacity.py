"""The capacity service's snapshot: every node's GPUs by profile and state, in one KV key.

Bucket `capacity`, key `snapshot` (`SNAPSHOT`). `nodeward capacity` and any other reader
take the table and the totals from it, and ask it whether a pod's GPU request fits now.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from schemas.capacity import STATES, WHOLE_GPU, GpuCounts, profile_for
from schemas.state import Bucket

BUCKET = "capacity"
SNAPSHOT_KEY = "snapshot"

Blocked = str
"""Why nothing new lands on a node: `quarantined`, `maintenance`, `cordoned`, `not-ready`."""


class NodeCapacity(BaseModel):
    """One node's GPUs by profile, and what holds the node back, if anything."""

    node: str
    model: str = Field(description="node label nvidia.com/gpu.product, `unknown` without it")
    profiles: dict[str, GpuCounts] = Field(default_factory=dict)
    blocked: Blocked | None = None
    failed_gpus: dict[str, str | None] = Field(
        default_factory=dict,
        description="GPUs (or MIG instances) whose last health was failed: key -> MIG profile",
    )
    dra: bool = Field(
        default=False,
        description="its GPUs are DRA devices (ResourceSlices): claimed through ResourceClaims,"
        " never an extended-resource request",
    )
    maintenance_phase: str | None = Field(
        default=None, description="the last maintenance phase on the bus"
    )


class Fit(BaseModel):
    """A node where a request fits now, and what would be left free there."""

    node: str
    model: str
    left: dict[str, int]


class ProfileTotal(BaseModel):
    model: str
    profile: str
    counts: GpuCounts


class CapacitySnapshot(BaseModel):
    """Every node with GPUs, as the capacity service counted them at `at`."""

    at: datetime
    nodes: list[NodeCapacity] = Field(default_factory=list)

    def totals(self) -> list[ProfileTotal]:
        """Per model and profile, the sum over nodes, sorted."""
        sums: dict[tuple[str, str], GpuCounts] = {}
        for n in self.nodes:
            for profile, counts in n.profiles.items():
                key = (n.model, profile)
                sums[key] = sums.get(key, GpuCounts()) + counts
        return [ProfileTotal(model=m, profile=p, counts=c) for (m, p), c in sorted(sums.items())]

    def fits(self, request: dict[str, int], model: str | None = None) -> list[Fit]:
        """The nodes where a pod asking `request` (resource -> count, e.g.
        `nvidia.com/gpu: 4`) fits now: not held back, enough free of each, the model
        matching (`model` as a case-insensitive part of the product), most left first."""
        wanted = {profile_for(r) or r: n for r, n in request.items()}
        out = []
        for n in self.nodes:
            if n.blocked is not None or n.dra or not matches_model(n.model, model):
                continue  # a DRA node's GPUs take no `nvidia.com/gpu` request
            free = {p: n.profiles[p].free if p in n.profiles else 0 for p in wanted}
            if all(free[p] >= k for p, k in wanted.items()):
                out.append(
                    Fit(
                        node=n.node, model=n.model, left={p: free[p] - k for p, k in wanted.items()}
                    )
                )
        return sorted(out, key=lambda f: (-sum(f.left.values()), f.node))


def matches_model(product: str, wanted: str | None) -> bool:
    """`H100` matches `NVIDIA-H100-80GB-HBM3`; None matches every model."""
    return wanted is None or wanted.lower() in product.lower()


SNAPSHOT: Bucket[CapacitySnapshot] = Bucket.one(
    BUCKET, CapacitySnapshot, SNAPSHOT_KEY, "every node's GPUs by profile and state"
)

__all__ = [
    "SNAPSHOT",
    "STATES",
    "WHOLE_GPU",
    "CapacitySnapshot",
    "Fit",
    "NodeCapacity",
    "ProfileTotal",
]
