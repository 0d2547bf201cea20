"""Free GPUs: how many of one model and profile are free, used or held back, fleet-wide.

`capacity.v1` is published by `services.capacity` when the counts of a model and profile
change (debounced); the whole table, per node, is its KV snapshot (`schemas.state.capacity`).
A profile is `gpu` (whole GPUs, `nvidia.com/gpu`) or a MIG profile such as `1g.10gb`
(`nvidia.com/mig-1g.10gb`).
"""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from schemas.base import EventData, Model
from schemas.examples import example
from schemas.tokens import subject

WHOLE_GPU = "gpu"
"""The profile of whole GPUs (resource `nvidia.com/gpu`)."""
MIG_PREFIX = "nvidia.com/mig-"

STATES = ("free", "used", "quarantined", "cordoned", "maintenance", "unhealthy")
"""Every GPU (or MIG slice) a node can allocate is in exactly one of these."""


def resource_for(profile: str) -> str:
    """The extended resource a pod requests for `profile` (`gpu` -> `nvidia.com/gpu`)."""
    return "nvidia.com/gpu" if profile == WHOLE_GPU else f"{MIG_PREFIX}{profile}"


AMD_PRODUCT_LABEL = "amd.com/gpu.product-name"
"""A node's GPU model as the AMD GPU operator's node labeller sets it."""
WHOLE_GPU_RESOURCES = frozenset({"nvidia.com/gpu", "amd.com/gpu"})
"""The device plugins' whole-GPU resources: NVIDIA's and AMD's (ROCm/k8s-device-plugin)."""


def profile_for(resource: str) -> str | None:
    """The profile of an extended resource, or None if it is no GPU resource."""
    if resource in WHOLE_GPU_RESOURCES:
        return WHOLE_GPU
    if resource.startswith(MIG_PREFIX) and len(resource) > len(MIG_PREFIX):
        return resource.removeprefix(MIG_PREFIX)
    return None


class GpuCounts(Model):
    """How many GPUs (or MIG slices) are in each state; they sum to the allocatable."""

    free: int = Field(default=0, ge=0, description="allocatable, not requested, schedulable")
    used: int = Field(default=0, ge=0, description="requested by running or bound pending pods")
    quarantined: int = Field(default=0, ge=0, description="on a node nodeward quarantined")
    cordoned: int = Field(default=0, ge=0, description="on a cordoned or tainted node")
    maintenance: int = Field(default=0, ge=0, description="on a node in maintenance")
    unhealthy: int = Field(default=0, ge=0, description="reported failed, or node not Ready")

    @property
    def allocatable(self) -> int:
        return sum(self.of(s) for s in STATES)

    def of(self, state: str) -> int:
        return int(getattr(self, state))

    def __add__(self, other: GpuCounts) -> GpuCounts:
        return GpuCounts(**{s: self.of(s) + other.of(s) for s in STATES})


class CapacityChanged(EventData):
    """The counts of one GPU model and profile changed."""

    TYPE: ClassVar[str] = "capacity.v1"
    STREAM: ClassVar[str] = "CAPACITY"
    SUBJECT_PATTERN: ClassVar[str] = "capacity.<model>.<profile>"
    EXAMPLE_SOURCE: ClassVar[str] = "service/capacity"

    model: str = Field(min_length=1, description="node label nvidia.com/gpu.product")
    profile: str = Field(min_length=1, description="`gpu` or a MIG profile, e.g. 1g.10gb")
    counts: GpuCounts
    previous: GpuCounts | None = Field(default=None, description="the counts published before")
    free_by_node: dict[str, int] = Field(
        default_factory=dict, description="nodes with free ones, and how many"
    )

    model_config = example(
        {
            "model": "NVIDIA-H100-80GB-HBM3",
            "profile": "gpu",
            "counts": {"free": 3, "used": 26, "quarantined": 2, "unhealthy": 1},
            "previous": {"free": 6, "used": 26},
            "free_by_node": {"gpu-node-07": 1, "gpu-node-09": 2},
        }
    )

    def nats_subject(self) -> str:
        return subject("capacity", self.model, self.profile)

    def about(self) -> str:
        return f"gpus/{self.model}/{self.profile}"
