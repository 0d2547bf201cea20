"""What the simulated GPU libraries (`SimNvml`, `SimAmdSmi`) share: one node's GPUs
behind one lock, found by index, and the two faults every call meets (a hung GPU
blocks it, a lost one fails it) until `recover` or `close` releases them."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import ClassVar, Generic, Protocol, TypeVar


class SimDevice(Protocol):
    """The state of one simulated GPU that the shared faults touch."""

    index: int
    lost: bool
    hang: threading.Event | None


G = TypeVar("G", bound=SimDevice)


class SimGpus(Generic[G]):
    """One node's simulated GPUs; a library subclass adds its calls and its faults.

    Thread-safe: every change holds `_lock`. `_initialised` counts the library's inits
    not yet shut down."""

    FAULTS: ClassVar[Mapping[str, str]]
    """Fault names `inject_fault` accepts, with what each does."""

    def __init__(
        self, node: str, gpus: list[G], *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.node = node
        self.gpus = gpus
        self.clock = clock
        self._lock = threading.RLock()
        self._initialised = 0

    def _gpu(self, index: int) -> G:
        if not 0 <= index < len(self.gpus):
            raise ValueError(f"node {self.node} has no GPU {index} (it has {len(self.gpus)})")
        return self.gpus[index]

    def _loaded(self, index: int, utilization_pct: float) -> G:
        """GPU `index`, if `utilization_pct` is a percentage (else ValueError)."""
        if not 0 <= utilization_pct <= 100:
            raise ValueError(f"utilisation must be 0..100 %, got {utilization_pct}")
        return self._gpu(index)

    def _faulty(self, index: int, fault: str) -> G:
        """GPU `index`, if `fault` is one of `FAULTS` (else ValueError)."""
        gpu = self._gpu(index)
        if fault not in self.FAULTS:
            known = ", ".join(sorted(self.FAULTS))
            raise ValueError(f"unknown fault {fault!r}; known: {known}")
        return gpu

    @staticmethod
    def _lose_or_hang(gpu: G, fault: str) -> None:
        """The shared faults: `fallen-off-bus` loses the GPU, `hang` blocks its calls."""
        if fault == "fallen-off-bus":
            gpu.lost = True
        elif fault == "hang" and gpu.hang is None:
            gpu.hang = threading.Event()

    @staticmethod
    def _clear_faults(gpu: G) -> threading.Event | None:
        """Clear `gpu`'s loss and hang (under the lock); the hang, for the caller to set
        once it has released the lock."""
        hang, gpu.hang = gpu.hang, None
        gpu.lost = False
        return hang

    @staticmethod
    def _lost(gpu: G) -> bool:
        """Whether a call on `gpu` fails as on a lost GPU, once any hang is released."""
        hang = gpu.hang
        if hang is not None:
            hang.wait()
        return gpu.lost

    def close(self) -> None:
        """Release every hung call (so threads stuck in this sim end)."""
        with self._lock:
            for gpu in self.gpus:
                hang, gpu.hang = gpu.hang, None
                if hang is not None:
                    hang.set()
