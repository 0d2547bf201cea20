"""The real-GPU device check (`bench/gpu_real.py`) runs end to end on the simulated NVML,
without pydantic or structlog (GPU hosts may lack them), and sees active -> idle."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

# Run the script as `python3 bench/gpu_real.py` would, with these modules made unimportable.
BLOCKED = ("pydantic", "pydantic_settings", "structlog", "nats", "nkeys", "schemas")
RUNNER = (
    "import runpy, sys\n"
    "for m in {blocked!r}: sys.modules[m] = None\n"
    "sys.argv = {argv!r}\n"
    "runpy.run_path({script!r}, run_name='__main__')\n"
)


def test_device_check_runs_on_sim_without_pydantic(tmp_path: Path) -> None:
    script = str(REPO / "bench" / "gpu_real.py")
    argv = [script, "--sim", "--out", str(tmp_path), "--seconds", "3", "--load-seconds", "1.2"]
    argv += ["--settle", "1"]
    code = RUNNER.format(blocked=BLOCKED, argv=argv, script=script)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "== PASS: active -> idle SEEN" in done.stdout
    report = json.loads((tmp_path / "gpu_real.json").read_text())
    assert report["mode"] == "sim"
    assert report["inventory"]["count"] == 2
    assert [g["supported"] for g in report["gpm"]] == [True, True]
    series = report["series"]
    assert series["rows"][0]["util_gpu0_pct"] == 95.0
    assert series["rows"][-1]["util_gpu0_pct"] == 0.0
    reads = report["agent_reads"]
    assert all("error" not in r for r in reads), reads
    assert reads[0]["events"]["registered"]["nvmlEventTypeXidCriticalError"] is True
    assert reads[0]["events"]["wait_500ms"] == "<Timeout>"
    assert len(reads[1]["identity"]["migs"]) == 2
