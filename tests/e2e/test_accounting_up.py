"""The done-when of accounting: with `nodeward up` running, `nodeward report --since 1h --by
namespace --format csv` prints one row per namespace with kWh, CO2e and GPU-hours: every
namespace with a pod running on the nodes (CPU-only ones such as `user-*` too), and the
GPU namespaces' training pods with their GPUs' utilisation."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest

from launch.demo import sim_seed
from tests.e2e.platform import running_up
from tests.e2e.test_cli import run, wait_until

pytestmark = pytest.mark.xdist_group("e2e")


def test_report_by_namespace_as_csv_from_a_running_up(tmp_path: Path) -> None:
    seed = sim_seed(None, 2)
    gpu_nodes = {n.name for n in seed.nodes if n.gpu is not None and n.gpu.count > 0}
    gpu_ns = {p.namespace for p in seed.pods if p.gpus > 0 and p.node in gpu_nodes}
    assert gpu_ns, "the seed has GPU pods on its first two nodes"
    expected = {p.namespace for p in seed.pods if p.node in gpu_nodes and p.phase == "Running"}
    assert {ns for ns in expected if ns.startswith("user-")}, "and CPU-only user-* pods"
    env = {
        "NODEWARD_AGENTS__ENERGY__INTERVAL": "2s",
        "NODEWARD_AGENTS__ENERGY__SAMPLE_EVERY": "0.5s",
    }
    with running_up(tmp_path, "--nodes", "2", "--scenario", "none", "--quiet", env=env) as up:
        state = str(up.state)
        rows: dict[str, dict[str, str]] = {}

        def reported() -> bool:
            out = run("report", "--since", "1h", "--by", "namespace", "--format", "csv",
                      "--state-dir", state, timeout=30)  # fmt: skip
            assert out.returncode == 0, out.stderr
            rows.clear()
            rows.update({r["namespace"]: r for r in csv.DictReader(io.StringIO(out.stdout))})
            return (
                set(rows) == expected
                and all(float(r["energy_kwh"]) > 0 for r in rows.values())
                and all(float(rows[ns]["gpu_hours"]) > 0 for ns in gpu_ns)
                and all(float(rows[ns]["gpu_util_pct"] or 0) > 0 for ns in gpu_ns)
            )

        wait_until(reported, timeout=60, what=f"a row with energy for each of {expected}")
        header = next(csv.reader(io.StringIO(run(
            "report", "--since", "1h", "--format", "csv", "--state-dir", state
        ).stdout)))  # fmt: skip
        assert header[:6] == [
            "namespace", "energy_kwh", "gpu_energy_kwh", "cpu_energy_kwh", "co2e_kg",
            "intensity_g_per_kwh",
        ]  # fmt: skip
        assert "gpu_hours" in header and "gap_s" in header
        for row in rows.values():
            assert row["co2e_kg"] != "" and float(row["co2e_kg"]) >= 0
        table = run("report", "--since", "1h", "--by", "model", "--state-dir", state)
        assert table.returncode == 0, table.stderr
        assert "NVIDIA-H100-80GB-HBM3" in table.stdout
