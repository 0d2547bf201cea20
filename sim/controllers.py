"""What the simulated controllers of a cluster share: a pass every `interval`, for ever.

A real controller watches; these stand-ins poll the sim cluster once a second, which is
what `nodeward up` needs of them (Kured's reboots, Kubeflow's stopped notebooks).
"""

from __future__ import annotations

import asyncio
from typing import Any


class SimController:
    """Subclasses define `pass_once()`; `run()` calls it every `interval` seconds and logs,
    never raises, what goes wrong in a pass (a sim helper must not stop `up`)."""

    interval: float
    log: Any

    async def pass_once(self) -> list[str]:
        raise NotImplementedError

    async def run(self) -> None:
        while True:
            try:
                await self.pass_once()
            except Exception:
                self.log.exception("sim_controller.pass_failed")
            await asyncio.sleep(self.interval)
