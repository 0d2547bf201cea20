"""The layers of docs/architecture.md hold: import-linter's contracts, and no simulator in a daemon."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

DAEMON_MODULES = [
    "agents.gpu.wiring",
    "agents.energy.wiring",
    "agents.idle.wiring",
    "services.capacity.service",
    "services.console.service",
    "services.cordon.service",
    "services.culler.service",
    "services.credentials.service",
    "services.falco.service",
    "services.maintenance.service",
    "services.notifier.service",
]


def test_import_contracts_hold() -> None:
    """`lint-imports` (what `make lint` runs) keeps every contract in pyproject.toml."""
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert exe is not None, "import-linter is a test dependency"
    run = subprocess.run([exe, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "0 broken" in run.stdout


@pytest.mark.parametrize("module", DAEMON_MODULES)
def test_a_daemon_loads_no_simulator(module: str) -> None:
    """What a Pod imports to run an agent or service holds nothing of `sim` or `launch`."""
    code = (
        "import importlib, json, sys;"
        f"importlib.import_module({module!r});"
        "print(json.dumps(sorted(m for m in sys.modules"
        " if m.split('.')[0] in ('sim', 'launch'))))"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == []


def test_a_simulated_agent_is_the_composition_roots() -> None:
    """The witness: launch's simulated GPU agent does load the simulator."""
    code = (
        "import json, sys, launch.sim_agents.gpu;"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('sim.'))))"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    assert "sim.nvml" in json.loads(run.stdout)
