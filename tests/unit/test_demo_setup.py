"""What `nodeward up` sets up for the demo: timings, the default scenario, checks."""

from __future__ import annotations

from pathlib import Path

import pytest

from launch.demo import demo_settings, load_demo_scenario, sim_seed
from nodeward.cli.common import CliError


def test_the_demo_profile_applies_with_the_sim_cluster_and_no_config(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("NODEWARD_SERVICES__CORDON__HEALTHY_PERIOD", raising=False)
    settings, said = demo_settings(None, None, sim=True)
    assert settings.services["cordon"]["healthy_period"] == "15s"
    assert said is not None and "healthy_period 15s" in said and "group_wait 3s" in said
    assert "warn_after 1m, cull_after 2m" in said
    # The environment still wins over the profile.
    monkeypatch.setenv("NODEWARD_SERVICES__CORDON__HEALTHY_PERIOD", "40s")
    settings, said = demo_settings(None, None, sim=True)
    assert settings.services["cordon"]["healthy_period"] == "40s"
    assert settings.services["cordon"]["cooldown"] == "10s"
    assert said is not None and "healthy_period 40s" in said


def test_a_config_file_or_a_real_cluster_replaces_the_profile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NODEWARD_SERVICES__CORDON__HEALTHY_PERIOD", raising=False)
    config = tmp_path / "c.yaml"
    config.write_text("log: {level: info}\n")
    settings, said = demo_settings(config, None, sim=True)
    assert "cordon" not in settings.services and said is None
    settings, said = demo_settings(None, None, sim=False)
    assert "cordon" not in settings.services and said is None


def test_the_default_scenario_fails_a_gpu_and_leaves_its_recovery_to_nodeward() -> None:
    steps = load_demo_scenario("default", sim_seed(None, None))
    health = [s for s in steps if s.load is None]
    # No step recovers the GPU by hand: services.recovery drains, reboots and releases it.
    assert [(s.after.total_seconds(), s.xid, s.recover) for s in health] == [(10.0, 79, False)]
    # A job on another GPU of the node meanwhile: the energy agent's power follows it.
    assert [(s.after.total_seconds(), s.gpu, s.load) for s in steps if s.load is not None] == [
        (5.0, 1, 95.0),
        (35.0, 1, 10.0),
    ]
    assert load_demo_scenario("none", sim_seed(None, None)) == []


def test_a_scenario_naming_a_node_the_fleet_lacks_is_refused(tmp_path: Path) -> None:
    scenario = tmp_path / "s.yaml"
    scenario.write_text("- {after: 1s, node: gpu-h100-04, gpu: 0, xid: 79}\n")
    with pytest.raises(
        CliError, match=r"names node 'gpu-h100-04'.*GPU nodes: gpu-h100-01, gpu-h100-02"
    ):
        load_demo_scenario(str(scenario), sim_seed(None, 2))


def test_metrics_summary_names_each_service_and_the_agents_ports() -> None:
    from launch.demo import metrics_summary

    lines = metrics_summary(
        {
            "platform": "http://127.0.0.1:4000",
            "agent-gpu-a": "http://127.0.0.1:4002",
            "agent-gpu-b": "http://127.0.0.1:4001",
            "cordon": "http://127.0.0.1:4003",
        }
    )
    assert lines == [
        "platform   http://127.0.0.1:4000/metrics",
        "cordon     http://127.0.0.1:4003/metrics",
        "GPU agents http://127.0.0.1:PORT/metrics, PORT 4002 4001 (2, by node in endpoints.json)",
    ]


def _program(where: Path) -> Path:
    where.mkdir(parents=True, exist_ok=True)
    exe = where / "nodeward"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    return exe


def test_the_banner_hints_are_commands_that_work_as_printed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`make demo` runs `.venv/bin/nodeward up`, which is not on PATH: the hint says
    `.venv/bin/nodeward status`, and names `--state-dir` when it is not `./.nodeward`."""
    from launch.demo import hint_command

    venv = _program(tmp_path / ".venv" / "bin")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    hint = hint_command(Path(".nodeward"), argv0=".venv/bin/nodeward", cwd=tmp_path)
    assert hint("status") == ".venv/bin/nodeward status"
    hint = hint_command(Path("demo"), argv0=str(venv), cwd=tmp_path)
    assert hint("sim", "inject", "--node", "n") == (
        ".venv/bin/nodeward sim inject --node n --state-dir demo"
    )
    # State elsewhere: its absolute path; the program on PATH: its name.
    monkeypatch.setenv("PATH", str(venv.parent))
    elsewhere = tmp_path.parent / "state elsewhere"
    hint = hint_command(elsewhere, argv0="nodeward", cwd=tmp_path)
    assert hint("tail") == f"nodeward tail --state-dir '{elsewhere.resolve()}'"
    # Another nodeward first on PATH than the one running: the one running, by its path.
    other = _program(tmp_path / "other")
    monkeypatch.setenv("PATH", str(other.parent))
    assert hint_command(Path(".nodeward"), argv0=str(venv), cwd=tmp_path)("status") == (
        ".venv/bin/nodeward status"
    )
    # python -m launch
    hint = hint_command(Path(".nodeward"), argv0="/x/launch/__main__.py", cwd=tmp_path)
    assert hint("status").endswith(" -m launch status")


def test_the_banner_fits_80_columns_and_its_commands_stay_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At 80 columns what each line says wraps under itself (it ran past the edge: the
    profile's 230 characters over three terminal lines); a command too long for its column
    gets a line of its own, unwrapped, so that it is copied whole. At 200, one line each."""
    import io

    from launch.demo import banner_rows, hint_command, print_banner
    from nodeward.endpoints import Endpoints

    state = tmp_path / "a-rather-long-state-directory-name-for-this-demo"
    metrics = {f"agent-gpu-gpu-h100-{i:02d}": f"http://127.0.0.1:{40000 + i}" for i in range(11)}
    endpoints = Endpoints(
        nats_url="nats://127.0.0.1:4222",
        state_dir=state,
        kubeconfig=state / "kubeconfig",
        kube_api="https://127.0.0.1:6443",
        outbox=state / "outbox",
        metrics={"platform": "http://127.0.0.1:39527", **metrics},
        console_url="http://127.0.0.1:34161/",
    )
    profile = "demo timings: " + ", ".join(f"services.x{i} period {i}s" for i in range(12))
    hint = hint_command(state, argv0=".venv/bin/nodeward", cwd=tmp_path)
    rows = banner_rows(endpoints, profile=profile, hint=hint, steps=[], seed=None)
    commands = [r.said for r in rows if r.command]
    assert hint("status") in commands and any("sim inject" in c for c in commands)

    def printed(columns: int) -> list[str]:
        monkeypatch.setenv("COLUMNS", str(columns))
        out = io.StringIO()
        print_banner(endpoints.nats_url, rows, file=out)
        return out.getvalue().splitlines()

    narrow = printed(80)
    long_commands = [c for c in commands if 14 + len(c) > 80]
    assert long_commands  # the state dir makes them long: the case this is about
    for line in narrow:
        assert len(line) <= 80 or line.strip() in long_commands, line
    for command in commands:
        assert any(line.strip() == command or line.endswith(command) for line in narrow)
    wrapped = [line for line in narrow if "services.x" in line]
    assert len(wrapped) > 1 and all(line.startswith(" " * 14) for line in wrapped[1:])
    wide = printed(200)
    assert len([line for line in wide if "services.x" in line]) < len(wrapped)
