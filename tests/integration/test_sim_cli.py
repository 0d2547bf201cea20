"""`nodeward sim cluster` on its own: kubectl lists the seeded nodes, cordon shows, signals stop it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.integration.simkube import kubectl_binaries

KUBECTLS = kubectl_binaries()


def _sim_cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "sim.cli", *args]


def _read_until(proc: subprocess.Popen[str], prefix: str, timeout: float) -> list[str]:
    """Lines of the child's stdout up to the first starting with `prefix` (an error if it exits first)."""
    lines: list[str] = []
    found = threading.Event()

    def reader() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if line.startswith(prefix):
                found.set()
                return

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    if not found.wait(timeout):
        proc.kill()
        raise AssertionError(
            f"no {prefix!r} line within {timeout}s; got {lines}; stderr: {proc.stderr.read() if proc.stderr else ''}"
        )
    return lines


@pytest.mark.peer("kubectl")
@pytest.mark.skipif(
    not KUBECTLS, reason="kubectl is not installed (make test installs Debian's kubernetes-client)"
)
def test_sim_cluster_cli_with_kubectl(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "out" / "kubeconfig"
    with subprocess.Popen(
        _sim_cli("cluster", "--port", "0", "--kubeconfig", str(kubeconfig)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        try:
            lines = _read_until(proc, "kubeconfig:", 30)
            assert lines[0].startswith("sim cluster: https://127.0.0.1:")
            assert lines[-1] == f"kubeconfig: {kubeconfig.resolve()}"
            assert oct(kubeconfig.stat().st_mode & 0o777) == "0o600"
            env = {"HOME": str(tmp_path), "PATH": os.environ.get("PATH", "/usr/bin")}

            def kubectl(*args: str) -> str:
                out = subprocess.run(
                    [KUBECTLS[0], "--kubeconfig", str(kubeconfig), *args],
                    capture_output=True,
                    text=True,
                    timeout=60,
                    env=env,
                    check=False,
                )
                assert out.returncode == 0, out.stderr
                return out.stdout

            nodes = kubectl("get", "nodes").strip().splitlines()[1:]
            assert len(nodes) == 11  # with the AMD and the DRA nodes
            assert {n.split()[0] for n in nodes} >= {"gpu-h100-01", "gpu-a100-mig-01"}
            kubectl("cordon", "gpu-a100-mig-01")
            row = next(
                n for n in kubectl("get", "nodes").splitlines() if n.startswith("gpu-a100-mig-01")
            )
            assert row.split()[1] == "Ready,SchedulingDisabled"
        finally:
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait(timeout=15)
        assert rc == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--port", "70000"], "error: --port must be between 0 and 65535, not 70000"),
        (
            ["--seed", "/nonexistent/seed.yaml"],
            "error: cannot read seed /nonexistent/seed.yaml: No such file or directory",
        ),
        (["--rbac", "/nonexistent"], "error: --rbac /nonexistent: no such file or directory"),
    ],
)
def test_bad_arguments_are_one_clear_line(args: list[str], message: str, tmp_path: Path) -> None:
    out = subprocess.run(
        _sim_cli("cluster", "--kubeconfig", str(tmp_path / "kc"), *args),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 2
    assert out.stderr.strip() == message
    assert out.stdout == ""


def test_invalid_seed_is_one_line(tmp_path: Path) -> None:
    seed = tmp_path / "seed.yaml"
    seed.write_text("nodes:\n  - name: n1\n    gpu: {count: -1}\n")
    out = subprocess.run(
        _sim_cli("cluster", "--seed", str(seed)),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 2
    assert out.stderr.strip().startswith(f"error: invalid seed {seed}: nodes.0.gpu.count:")
    assert len(out.stderr.strip().splitlines()) == 1


def test_bad_rbac_manifest_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "rbac.yaml"
    bad.write_text("kind: [unclosed\n")
    out = subprocess.run(
        _sim_cli("cluster", "--rbac", str(bad), "--kubeconfig", str(tmp_path / "kc")),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 2
    assert out.stderr.startswith("error: cannot build the sim cluster: cannot load RBAC manifests:")
    assert len(out.stderr.strip().splitlines()) == 1
