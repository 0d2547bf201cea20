"""An older nvidia-ml-py (before 13) lacks the recovery-action constants: the agents add them
(`agents.sources.nvml_compat`); the simulated driver reports nvml.h's values of its own."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import sim.nvml
from agents.sources.nvml_compat import NVML_H_CONSTANTS
from tests.conftest import REPO


def test_agents_import_on_a_pynvml_without_recovery_actions() -> None:
    # A fresh interpreter whose pynvml has none of the constants, as nvidia-ml-py 12 on a
    # GPU host (an H200 box with driver 580 had exactly this). The simulator comes first:
    # it stands without the agents' patch.
    code = textwrap.dedent(
        """
        import pynvml
        gone = [n for n in dir(pynvml) if n.startswith("NVML_GPU_RECOVERY_ACTION_")]
        gone += ["nvmlEventTypeGpuRecoveryAction", "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION"]
        for name in gone:
            delattr(pynvml, name)
        import sim.nvml
        assert not hasattr(pynvml, "NVML_GPU_RECOVERY_ACTION_NONE"), "the sim patched pynvml"
        import agents.gpu.agent, agents.gpu.health
        from agents.sources.nvml_compat import missing_constants, pynvml as patched
        assert patched.NVML_GPU_RECOVERY_ACTION_BUS_RESET == 6
        assert patched.nvmlEventTypeGpuRecoveryAction == 0x8000
        print(len(missing_constants()))
        """
    )
    got = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60
    )
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip() == "10"


def test_the_simulated_driver_reports_nvml_h_values() -> None:
    """The values `sim.nvml` emits are the ones the agents compare with."""
    reported = {
        name: getattr(sim.nvml, name) for name in NVML_H_CONSTANTS if hasattr(sim.nvml, name)
    }
    assert set(reported) == {
        "NVML_GPU_RECOVERY_ACTION_NONE",
        "nvmlEventTypeGpuRecoveryAction",
        "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION",
    }
    assert reported == {name: NVML_H_CONSTANTS[name] for name in reported}
