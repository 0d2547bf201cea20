"""The layers of docs/architecture.md hold: import-linter's contracts, and no simulator in a daemon."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
import tomllib
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from nodeward.plugin import services

ROOT = Path(__file__).resolve().parents[2]


def _registered(kind: str) -> dict[str, str]:
    """Each registered agent or service (the `nodeward.agents` entry points, the services'
    plugins): name -> the module its daemon is built in."""
    if kind == "service":
        return {p.name: p.ref(p.standalone).split(":")[0] for p in services()}
    return {e.name: e.value.split(":")[0] for e in entry_points(group=f"nodeward.{kind}s")}


DAEMON_MODULES = sorted({*_registered("agent").values(), *_registered("service").values()})
"""What a Pod imports to run each registered agent or service: derived, so one added in its
folder and registered is covered."""


def _contract(contract: str) -> dict[str, object]:
    """One import-linter contract of pyproject.toml, by the start of its name."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    found = [c for c in config["contracts"] if c["name"].startswith(contract)]
    assert len(found) == 1, contract
    return dict(found[0])


def test_the_contracts_cover_every_registered_agent_and_service() -> None:
    """The service and agent contracts take their lists from the registrations
    (`launch.layers`), none written by hand (three hand-written lists missed
    services.recovery): each list is every registered service's or agent's package."""
    from launch.layers import AgentsIndependent, NoServiceImported, ServicesIndependent

    services = {p.rsplit(".", 1)[0] for p in _registered("service").values()}
    agents = {p.rsplit(".", 1)[0] for p in _registered("agent").values()}
    assert "services.recovery" in services and "services.kernel" not in services
    session = {"root_packages": ["schemas", "nodeward", "agents", "services", "sim", "launch"]}
    made = [
        (ServicesIndependent, "each service is its own package", "modules", services),
        (
            NoServiceImported,
            "the remediation kernel knows no service",
            "forbidden_modules",
            services,
        ),
        (AgentsIndependent, "each agent is its own package", "modules", agents),
    ]
    for kind, name, key, expected in made:
        options = {k: v for k, v in _contract(name).items() if k not in ("name", "type")}
        assert key not in options, f"{name}: its list is derived, not written"
        contract = kind(name, session, options)
        assert {str(m) for m in getattr(contract, key)} == expected, name


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


SHARED_STATE = frozenset({"breaker", "dedup", "encoding", "energy", "lease", "marks"})
"""`schemas.state` modules several components share (and the energy agent's totals, whose
bucket the runtime provisions: an agent may create nothing); the others are one service's
records."""


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the module's, classes' and functions' docstring constants."""
    found = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        first = body[0] if isinstance(body, list) and body else None
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
            found.add(id(first.value))
    return found


def _literal_types(tree: ast.AST) -> set[int]:
    """The ids of the constants inside `Literal[...]` annotations (a log format `console`)."""
    return {
        id(c)
        for node in ast.walk(tree)
        if isinstance(node, ast.Subscript) and getattr(node.value, "id", None) == "Literal"
        for c in ast.walk(node.slice)
    }


def _naming(path: Path, names: set[str], modules: set[str]) -> list[str]:
    """What in `path` names a service: a string that is (or starts a subject or key with)
    a service's name or one of its buckets, or an import of a service's own records."""
    tree = ast.parse(path.read_text())
    skip = _docstrings(tree) | _literal_types(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            value = node.value
            if value in names or any(value.startswith(f"{n}.") for n in names):
                found.append(repr(value))
        if isinstance(node, ast.ImportFrom) and node.module in modules:
            found.append(f"import {node.module}")
    return found


def test_the_runtime_names_no_service() -> None:
    """The runtime (`nodeward/`) names no registered service, none of their buckets and
    none of their own records: a module that does, or a service added that an old module
    names, fails here. (The fleet picture's services' parts are their views.)"""
    from launch.access import GRANTS

    names = {p.name for p in services()} | {p.package.rsplit(".", 1)[1] for p in services()}
    names |= {b for g in GRANTS.values() for b in g.buckets if b not in SHARED_STATE}
    owned = {
        f"schemas.state.{f.stem}"
        for f in (ROOT / "schemas" / "state").glob("*.py")
        if f.stem not in SHARED_STATE | {"__init__"}
    }
    naming = {}
    for path in sorted((ROOT / "nodeward").rglob("*.py")):
        if found := _naming(path, names, owned):
            naming[str(path.relative_to(ROOT))] = found
    assert naming == {}
