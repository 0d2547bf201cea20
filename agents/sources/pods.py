"""Which pods hold which GPU, keyed by GPU or MIG UUID.

The real source is the kubelet pod-resources API (`v1.PodResourcesLister/List` on
`/var/lib/kubelet/pod-resources/kubelet.sock`); it is not written yet. `StaticPods` serves
a fixed map, which the simulated nodes fill from the sim cluster's seed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from schemas.common import PodRef


class PodSource(Protocol):
    async def pods_by_device(self) -> Mapping[str, list[PodRef]]:
        """GPU/MIG UUID -> pods holding it now."""
        ...

    @property
    def answered(self) -> bool:
        """The last `pods_by_device` named every pod holding a GPU device (False: it could
        not ask, or some pod holds devices it cannot tie to one GPU, e.g. a DRA claim)."""
        ...


class StaticPods:
    """A fixed device -> pods map."""

    answered: bool = True

    def __init__(self, by_device: Mapping[str, list[PodRef]] | None = None) -> None:
        self._by_device = {k: list(v) for k, v in (by_device or {}).items()}

    async def pods_by_device(self) -> Mapping[str, list[PodRef]]:
        return self._by_device
