"""The commands the services' plugins name (`nodeward.plugin`) are the
executable's: each loads and shows in `nodeward --help`, in the order of their names; one
that does not load is said in one line on stderr, and every other command still runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from nodeward.cli import plugins
from nodeward.plugin import GROUP
from tests.conftest import REPO


def _nodeward(*args: str, pythonpath: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, COLUMNS="200")
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(pythonpath), env.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "launch", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def _listed(help_text: str) -> list[str]:
    """The command names `--help` lists, in its order."""
    lines = help_text.split("Commands:", 1)[1].splitlines()
    return [line.split()[0] for line in lines if line.startswith("  ") and line.strip()]


def test_every_registered_command_loads_and_is_in_the_help() -> None:
    registered = plugins.registered()
    names = sorted(name for name, _ in registered)
    # What the runtime's command line used to name itself, now each in its service's folder.
    assert {"quarantine", "breaker", "falco", "recovery", "maintenance", "capacity", "report"} <= (
        set(names)
    )
    for name, ref in registered:
        assert ref.startswith("services."), (name, ref)
        found = plugins.resolve(ref)
        assert isinstance(found, typer.Typer) or callable(found), (name, ref)
    run = _nodeward("--help")
    assert run.returncode == 0, run.stderr
    assert run.stderr == ""
    listed = _listed(run.stdout)
    assert set(names) <= set(listed)
    # Groups after commands (typer's order), each kind in the order of the names.
    groups = sorted(n for n, ref in registered if isinstance(plugins.resolve(ref), typer.Typer))
    commands = [n for n in names if n not in groups]
    assert [n for n in listed if n in groups] == groups
    assert [n for n in listed if n in commands] == commands
    for name in groups:
        run = _nodeward(name, "--help")
        assert run.returncode == 0 and run.stdout.startswith(f"Usage: nodeward {name} "), run


def _app() -> typer.Typer:
    app = typer.Typer()

    @app.command()
    def status() -> None:
        """The runtime's own."""

    return app


def test_mount_refuses_what_does_not_load_in_one_line_each(
    capsys: pytest.CaptureFixture[str],
) -> None:
    commands = [
        ("zeta", "services.falco.cli:falco_app"),
        ("gone", "no_such_module_of_nodeward:app"),
        ("alpha", "services.capacity.cli:capacity"),
        ("missing", "services.falco.cli:no_such_app"),
        ("text", "os:sep"),
        ("status", "services.accounting.cli:report"),
    ]
    app = _app()
    assert plugins.mount(app, commands) == ["alpha", "zeta"]
    said = capsys.readouterr().err.splitlines()
    assert len(said) == 4, said
    assert said[0].startswith("nodeward: command gone (no_such_module_of_nodeward:app) left out:")
    assert "ModuleNotFoundError" in said[0]
    assert said[1].startswith("nodeward: command missing (services.falco.cli:no_such_app)")
    assert "AttributeError" in said[1]
    assert said[2] == (
        "nodeward: command status (services.accounting.cli:report) left out: "
        "nodeward has a command status already"
    )
    assert said[3].startswith("nodeward: command text (os:sep) left out: a str, neither")
    assert [g.name for g in app.registered_groups] == ["zeta"]
    assert [c.name for c in app.registered_commands] == [None, "alpha"]


def test_a_broken_plugin_leaves_the_rest_of_the_command_line_working(tmp_path: Path) -> None:
    """A distribution registering a service whose plugin fails on import, and one whose
    plugin names a command module that is not there: each said once, in one line; `--help`
    and the other commands still answer."""
    (tmp_path / "broken_nodeward_plugin.py").write_text(
        "raise RuntimeError('this plugin is broken\\non two lines')\n"
    )
    (tmp_path / "lacking_nodeward_plugin.py").write_text(
        "from nodeward.plugin import ServicePlugin\n"
        "SERVICE = ServicePlugin(name='lacking', package=__name__, commands={'lack': 'cli:app'})\n"
    )
    dist = tmp_path / "broken_nodeward_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: broken-nodeward-plugin\nVersion: 0.1\n"
    )
    (dist / "entry_points.txt").write_text(
        f"[{GROUP}]\nbroken = broken_nodeward_plugin:SERVICE\n"
        "lacking = lacking_nodeward_plugin:SERVICE\n"
    )
    run = _nodeward("--help", pythonpath=tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stderr.splitlines() == [
        "nodeward: service broken (broken_nodeward_plugin:SERVICE) left out: "
        "RuntimeError: this plugin is broken on two lines",
        "nodeward: command lack (lacking_nodeward_plugin.cli:app) left out: "
        "ModuleNotFoundError: No module named 'lacking_nodeward_plugin.cli'; "
        "'lacking_nodeward_plugin' is not a package",
    ]
    assert "broken" not in _listed(run.stdout) and "lack" not in _listed(run.stdout)
    assert {"quarantine", "report", "status"} <= set(_listed(run.stdout))
    run = _nodeward("quarantine", "release", "Bad_Node!", "--reason", "r", pythonpath=tmp_path)
    assert run.returncode == 2
    err = run.stderr.splitlines()
    assert len(err) == 3 and err[0].startswith("nodeward: service broken")
    assert "not a Kubernetes node name" in err[2]


def test_a_broken_plugin_stops_only_what_runs_it(tmp_path: Path) -> None:
    """Its own daemon and `up` (which runs every service) refuse in one line; another
    service's daemon (a Pod's `nodeward service cordon`) loads no other plugin and starts."""
    (tmp_path / "broken_nodeward_plugin.py").write_text("raise RuntimeError('broken\\nplugin')\n")
    dist = tmp_path / "broken_nodeward_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: broken-nodeward-plugin\nVersion: 0.1\n"
    )
    (dist / "entry_points.txt").write_text(f"[{GROUP}]\nbroken = broken_nodeward_plugin:SERVICE\n")
    said = (
        "service broken (broken_nodeward_plugin:SERVICE) does not load: RuntimeError: broken plugin"
    )
    run = _nodeward("service", "broken", pythonpath=tmp_path)
    assert run.returncode != 0
    assert run.stderr.splitlines()[-1] == f"nodeward: error: {said}", run.stderr
    run = _nodeward("up", "--state-dir", str(tmp_path / "state"), pythonpath=tmp_path)
    assert run.returncode != 0
    assert run.stderr.splitlines()[-1] == f"nodeward: error: {said}", run.stderr
    code = "from nodeward.platform import standalone; print(standalone('service', 'cordon'))"
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    )
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60, env=env
    )
    assert run.returncode == 0 and run.stdout.startswith("Standalone("), run.stderr[-2000:]
