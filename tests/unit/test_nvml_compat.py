"""An older nvidia-ml-py (before 13) lacks the recovery-action constants: nodeward adds them."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.conftest import REPO


def test_agents_import_on_a_pynvml_without_recovery_actions() -> None:
    # A fresh interpreter whose pynvml has none of the constants, as nvidia-ml-py 12 on a
    # GPU host (an H200 box with driver 580 had exactly this).
    code = textwrap.dedent(
        """
        import pynvml
        gone = [n for n in dir(pynvml) if n.startswith("NVML_GPU_RECOVERY_ACTION_")]
        gone += ["nvmlEventTypeGpuRecoveryAction", "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION"]
        for name in gone:
            delattr(pynvml, name)
        import agents.gpu.agent, agents.gpu.health, sim.nvml
        from nodeward.nvml_compat import missing_constants, pynvml as patched
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
