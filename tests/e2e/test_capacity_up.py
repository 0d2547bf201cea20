"""With `nodeward up` running, `nodeward capacity` shows the seed's free GPUs by model and
MIG profile, and an XID 79 quarantine lowers the free count of that node's model within 5 s
(an AMD uncorrectable ECC error on an MI300X node within a poll interval); on the DRA node the
one failed GPU is counted unhealthy and the node keeps 7 free."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from tests.e2e.platform import running_up
from tests.e2e.test_cli import run, wait_until

pytestmark = pytest.mark.timeout(240)

H100 = "NVIDIA-H100-80GB-HBM3"
A100 = "NVIDIA-A100-SXM4-80GB"
MI300X = "AMD_Instinct_MI300X_OAM"
NODE = "gpu-h100-04"  # the seed's one H100 node with a GPU free (7 of 8 held by pods)
DRA_NODE = "gpu-h100-dra-01"  # the seed's DRA node: 8 H100s in a ResourceSlice


def _capacity(nats: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run("capacity", "--nats", nats, *args, env={"NODEWARD_NATS_URL": ""})


def _free(nats: str) -> dict[tuple[str, str], int] | None:
    got = _capacity(nats, "--json")
    if got.returncode != 0:
        return None
    return {
        (t["model"], t["profile"]): t["counts"]["free"] for t in json.loads(got.stdout)["totals"]
    }


def test_capacity_shows_the_seeds_free_gpus_and_a_quarantine_lowers_them(tmp_path: Path) -> None:
    # Recovery in dry run: the quarantined node stays out of service while the counts are read
    # (recovery would drain, reboot and release it within seconds; test_recovery_up.py).
    quiet = {"NODEWARD_SERVICES__RECOVERY__DRY_RUN": "true"}
    with running_up(tmp_path, "--nats-port", "0", "--scenario", "none", env=quiet) as up:
        nats = up.endpoints["nats_url"]
        # The default seed by hand: H100 32, 31 held (one free on gpu-h100-04), and the DRA
        # node's 8, free; A100 24 whole GPUs, all held but two on gpu-a100-01 (where moved
        # notebooks can go); the MIG node 28 x 1g.10gb (5
        # notebooks hold one each) and 12 x 2g.20gb; two MI300X nodes, 16 amd.com/gpu, all free.
        seed = {
            (H100, "gpu"): 9,
            (A100, "gpu"): 2,
            (A100, "1g.10gb"): 23,
            (A100, "2g.20gb"): 12,
            (MI300X, "gpu"): 16,
        }
        wait_until(lambda: _free(nats) == seed, timeout=30, what="the seed's free GPUs")

        table = _capacity(nats, "--model", "H100")
        assert table.returncode == 0, table.stderr
        assert H100 in table.stdout and A100 not in table.stdout
        assert f"{NODE} (1)" in table.stdout  # where the free one is

        fits = _capacity(nats, "--request", "nvidia.com/gpu=1", "--model", "H100")
        assert fits.returncode == 0 and NODE in fits.stdout, fits.stdout + fits.stderr
        big = _capacity(nats, "--request", "nvidia.com/gpu=4", "--model", "H100")
        assert big.returncode == 3 and big.stdout.startswith("does not fit now"), big.stdout

        began = time.monotonic()
        injected = run("sim", "inject", "--node", NODE, "--gpu", "0", "--xid", "79", "--nats", nats)
        assert injected.returncode == 0, injected.stderr
        wait_until(
            lambda: (_free(nats) or {}).get((H100, "gpu")) == 8,
            timeout=5,
            what="the H100 free count to drop within 5 s of the XID",
        )
        print(f"capacity: XID 79 on {NODE} -> H100 free 8 after {time.monotonic() - began:.2f}s")
        after = _capacity(nats, "--json", "--model", "H100")
        node = next(n for n in json.loads(after.stdout)["nodes"] if n["node"] == NODE)
        assert node["profiles"]["gpu"]["free"] == 0 and node["profiles"]["gpu"]["used"] == 7

        # On the DRA node one failed GPU is tainted alone: its node keeps 7 free.
        injected = run(
            "sim", "inject", "--node", DRA_NODE, "--gpu", "2", "--xid", "79", "--nats", nats
        )
        assert injected.returncode == 0, injected.stderr
        wait_until(
            lambda: (_free(nats) or {}).get((H100, "gpu")) == 7,
            timeout=10,
            what="the DRA node's failed GPU counted unhealthy",
        )
        after = _capacity(nats, "--json", "--model", "H100")
        dra = next(n for n in json.loads(after.stdout)["nodes"] if n["node"] == DRA_NODE)
        assert dra["profiles"]["gpu"]["free"] == 7 and dra["profiles"]["gpu"]["unhealthy"] == 1
        assert dra["blocked"] is None and dra["dra"] is True
        assert (_free(nats) or {}).get((A100, "1g.10gb")) == 23  # the other models as they were

        # An AMD uncorrectable ECC error quarantines its MI300X node: 8 fewer free.
        injected = run(
            "sim",
            "inject",
            "--node",
            "gpu-mi300x-02",
            "--gpu",
            "6",
            "--fault",
            "ecc-uncorrectable",
            "--nats",
            nats,
        )
        assert injected.returncode == 0, injected.stderr
        # AMD SMI has no ECC event: the agent sees it at its next poll (poll_interval 10 s).
        wait_until(
            lambda: (_free(nats) or {}).get((MI300X, "gpu")) == 8,
            timeout=20,
            what="the MI300X free count to drop by a node within a poll of the ECC error",
        )
