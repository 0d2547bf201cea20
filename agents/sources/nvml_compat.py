"""`pynvml` (nvidia-ml-py), with the NVML constants the agents use even where it is older.

GPU hosts carry the nvidia-ml-py their image or distribution has; versions before 13 lack
the GPU recovery action constants (and their event type and field id), which are part of
NVML's C header (nvml.h) and the same for every driver that reports them. Importing
`pynvml` from here adds those that are missing, with nvml.h's values, so an older library
runs the agents (on a driver without the feature the calls answer NOT_SUPPORTED as usual).

Why here: filling in the bindings is the node agents' concern (every agent that calls NVML,
and `agents/sources/`' NVML sources, import `pynvml` from here), so it lives with the
sources they share, not in the runtime, which knows no GPU. The simulated driver
(`sim/nvml.py`) may not import agents, and needs none of this: it stands for the driver,
not for the bindings, so it does not patch `pynvml`; it reports the three recovery-action
values it emits (`NVML_GPU_RECOVERY_ACTION_NONE`, `nvmlEventTypeGpuRecoveryAction`,
`NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`) as nvml.h defines them, as a driver has them compiled
in, and `tests/unit/test_nvml_compat.py` holds those to `NVML_H_CONSTANTS`. A shared place
for this table would be the runtime or the event contract, and it is neither's.
"""

from __future__ import annotations

import pynvml

# nvml.h: nvmlGpuRecoveryAction_t, nvmlEventTypeGpuRecoveryAction, NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
NVML_H_CONSTANTS = {
    "NVML_GPU_RECOVERY_ACTION_NONE": 0,
    "NVML_GPU_RECOVERY_ACTION_GPU_RESET": 1,
    "NVML_GPU_RECOVERY_ACTION_NODE_REBOOT": 2,
    "NVML_GPU_RECOVERY_ACTION_DRAIN_P2P": 3,
    "NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET": 4,
    "NVML_GPU_RECOVERY_ACTION_RECOVER_IMEX_DOMAIN": 5,
    "NVML_GPU_RECOVERY_ACTION_BUS_RESET": 6,
    "NVML_GPU_RECOVERY_ACTION_SYSTEM_REBOOT": 7,
    "nvmlEventTypeGpuRecoveryAction": 0x8000,
    "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION": 230,
}


def missing_constants() -> list[str]:
    """The constants this pynvml lacked (filled in from nvml.h at import)."""
    return [name for name in NVML_H_CONSTANTS if name in _ADDED]


_ADDED = frozenset(name for name in NVML_H_CONSTANTS if not hasattr(pynvml, name))
for _name in _ADDED:
    setattr(pynvml, _name, NVML_H_CONSTANTS[_name])

__all__ = ["NVML_H_CONSTANTS", "missing_constants", "pynvml"]
