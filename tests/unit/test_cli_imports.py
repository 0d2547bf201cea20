"""The command line loads what a command runs when it runs: importing `nodeward` loads no
client, daemon or simulator, nor does any command's `--help`; of the services, only the
plugins and the command modules they name, typer alone; and aiohttp (nats-py's
websocket transport) stays unloaded until a websocket URL needs it. What `nodeward status` itself loads against a real
nats-server: tests/integration/test_cli_imports.py."""

from __future__ import annotations

import json
import subprocess
import sys

from nodeward.cli.plugins import registered
from nodeward.plugin import services
from tests.conftest import REPO

NOT_AT_START = (
    "aiohttp",
    "nats",
    "kubernetes",
    "prometheus_client",
    "yaml",
    "structlog",
    "schemas",
    "agents",
    "services",
    "nodeward.bus",
    "nodeward.kube",
    "nodeward.daemon",
    "nodeward.platform",
    "nodeward.config",
    "nodeward.fleet_status",
    "launch.up",
    "launch.demo",
    "launch.access",
    "sim.cluster",
    "sim.nvml",
    "sim.inject",
)
"""Packages and modules that `import launch.cli` (the `nodeward` executable) must not load."""

NOT_FOR_HELP = ("aiohttp", "nats", "nodeward.bus", "services", "agents", "sim.cluster")

COMMAND_MODULES = {ref.split(":")[0] for _, ref in registered()}
"""The services' command modules (`nodeward.cli.plugins` mounts them): loaded with the command
line, with every service's package (its plugin) and nothing else of `services`."""
COMMANDS_AND_PACKAGES = {"services", *COMMAND_MODULES, *(p.package for p in services())}


def _loaded(code: str) -> list[str]:
    """The modules loaded after running `code` in a fresh interpreter."""
    run = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    return list(json.loads(run.stdout.splitlines()[-1]))


def _under(modules: list[str], names: tuple[str, ...]) -> list[str]:
    """What of `names` is loaded, but the services' command modules and their packages."""
    return [
        m
        for m in modules
        if any(m == n or m.startswith(f"{n}.") for n in names) and m not in COMMANDS_AND_PACKAGES
    ]


def test_the_command_line_starts_without_clients_daemons_or_simulators() -> None:
    loaded = _loaded("import launch.cli")
    assert _under(loaded, NOT_AT_START) == []
    assert "typer" in loaded and "services.maintenance.cli" in loaded  # the witness
    assert set(loaded) >= COMMAND_MODULES  # each service's commands are mounted


def test_help_of_every_group_loads_no_client() -> None:
    code = (
        "from launch.cli import main\n"
        "for argv in (['--help'], ['status', '--help'], ['quarantine', '--help'],"
        " ['maintenance', 'start', '--help'], ['breaker', '--help'], ['sim', '--help'],"
        " ['report', '--help'], ['capacity', '--help'], ['falco', 'release', '--help']):\n"
        "    assert main(argv) == 0, argv"
    )
    loaded = _loaded(code)
    assert _under(loaded, NOT_FOR_HELP) == []
    assert "typer._click.formatting" in loaded or "typer.rich_utils" in loaded  # help printed


def test_a_deferred_aiohttp_loads_on_first_use() -> None:
    """nats-py imported after `defer_websocket_client` holds an aiohttp that is not loaded;
    the websocket transport's first touch loads it whole."""
    code = (
        "import sys\n"
        "from nodeward.cli.common import defer_websocket_client\n"
        "defer_websocket_client()\n"
        "import nats\n"
        "from nats.aio import transport\n"
        "assert 'aiohttp.client' not in sys.modules\n"
        "assert transport.aiohttp\n"
        "assert 'aiohttp.client' not in sys.modules\n"
        "print(transport.aiohttp.ClientSession.__module__)"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "aiohttp.client"
