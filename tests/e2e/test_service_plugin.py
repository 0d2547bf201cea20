"""A service is one folder and one entry point: a throw-away service written into a copy of
the tree (`services/throwaway/`) and registered only through an entry point (a dist-info on
the path, as an install writes it) is linted by the import contracts, granted its NATS user
and RBAC role, mounted on the command line, run by `nodeward up` under its own
ServiceAccount, and shown by `nodeward status`; nothing else in the tree is edited."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.e2e.platform import running_up
from tests.e2e.test_cli import NODEWARD, wait_until

pytestmark = [pytest.mark.timeout(300)]

PACKAGES = ("schemas", "nodeward", "agents", "services", "sim", "launch")

THROWAWAY = {
    "__init__.py": '''
"""A throw-away service: counts the cluster's nodes, and the nodes it hears heartbeats from."""

from nodeward.plugin import ServicePlugin

SERVICE = ServicePlugin(
    name="throwaway",
    package=__name__,
    view="view:view",
    commands={"throwaway": "cli:throwaway_app"},
)
''',
    "access.py": """
from nodeward.kube.access import Access

ACCESS = Access("throwaway", frozenset({"nodes.list"}))
""",
    "service.py": """
import json

from pydantic import Field

from nodeward.bus import Delivery
from nodeward.handlers import Consuming, Runtime, Service, setting
from schemas.base import Event
from schemas.control import ControlReply, ControlRequest
from schemas.gpu import GpuHeartbeat
from services.throwaway.access import ACCESS

NAME = "throwaway"


class ThrowawaySettings(Consuming):
    bucket: str = "throwaway"
    subjects: list[str] = Field(default_factory=lambda: ["gpu.heartbeat.>"])


app = Service(NAME, settings=ThrowawaySettings, access=ACCESS, buckets=("throwaway",))


class Throwaway:
    def __init__(self, rt: Runtime[ThrowawaySettings], kv) -> None:
        self.cluster, self.kv = rt.acting, kv
        self.nodes: int | None = None
        self.heard: set[str] = set()

    async def save(self) -> None:
        said = {"nodes": self.nodes, "heard": len(self.heard)}
        await self.kv.put("nodes", json.dumps(said).encode())

    @app.consumes(
        "HEARTBEATS",
        subjects=setting("subjects"),
        types=[GpuHeartbeat],
        order_key=lambda e: e.data.node,
    )
    async def heard_from(self, event: Event[GpuHeartbeat], delivery: Delivery) -> None:
        self.heard.add(event.data.node)
        await self.save()

    @app.task("count")
    async def count(self) -> None:
        self.nodes = len(await self.cluster.nodes.list())
        await self.save()

    @app.ready("counted")
    def counted(self) -> bool:
        return self.nodes is not None

    @app.control("hello")
    async def hello(self, request: ControlRequest) -> ControlReply:
        return ControlReply.ok(f"hello {request.operator}: {self.nodes} nodes")


@app.setup
async def setup(rt: Runtime[ThrowawaySettings]) -> Throwaway:
    return Throwaway(rt, await rt.kv(rt.config.bucket, history=1))


component, standalone = app.daemon()
""",
    "view.py": """
import json
from datetime import datetime

from nodeward.bus.mirror import Watched
from nodeward.views import Row, Shown


class Counted:
    def watched(self):
        return [Watched.bucket("throwaway")]

    async def read(self, reads, *, node, now: datetime) -> Shown:
        raw = await reads.kv("throwaway", ["nodes"])
        if raw is None:
            return Shown(missing=["KV throwaway"])
        said = json.loads(raw["nodes"])
        return Shown(rows=[Row(section="throwaway", text=f"counted {said['nodes']} nodes")])


def view(settings) -> Counted:
    return Counted()
""",
    "cli.py": '''
import typer

from nodeward.cli.controls import control

throwaway_app = typer.Typer(help="The throw-away service.", no_args_is_help=True)


@throwaway_app.command("hello")
@control("throwaway", "hello")
def hello() -> None:
    """Ask the throw-away service how many nodes it counted."""
''',
}


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A copy of the tree with `services/throwaway/` and its entry point, nothing else."""
    root = tmp_path_factory.mktemp("tree")
    for package in PACKAGES:
        shutil.copytree(
            REPO / package, root / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    shutil.copy(REPO / "pyproject.toml", root / "pyproject.toml")
    folder = root / "services" / "throwaway"
    folder.mkdir()
    for name, text in THROWAWAY.items():
        (folder / name).write_text(text.lstrip())
    dist = root / "nodeward_throwaway-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: nodeward-throwaway\nVersion: 0.1\n"
    )
    (dist / "entry_points.txt").write_text(
        "[nodeward.services]\nthrowaway = services.throwaway:SERVICE\n"
    )
    yield root


def _env(tree: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NODEWARD_")}
    return env | {"PYTHONPATH": str(tree)}


def _run(tree: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, cwd=tree, env=_env(tree), capture_output=True, text=True, timeout=timeout
    )


def test_the_import_contracts_cover_it(tree: Path) -> None:
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert exe is not None
    kept = _run(tree, exe, "--no-cache")
    assert kept.returncode == 0 and "0 broken" in kept.stdout, kept.stdout[-3000:]
    service = tree / "services" / "throwaway" / "service.py"
    text = service.read_text()
    service.write_text(text + "\nimport services.cordon.policy  # noqa: E402, F401\n")
    try:
        broken = _run(tree, exe, "--no-cache")
    finally:
        service.write_text(text)
    assert broken.returncode != 0
    assert "each service is its own package" in broken.stdout
    assert "services.throwaway.service -> services.cordon.policy" in broken.stdout


def test_it_is_granted_its_nats_user_and_its_role(tree: Path) -> None:
    code = (
        "import json\n"
        "from launch.access import ACCOUNTS, AGENT_GRANTS, GRANTS, READERS\n"
        "from nodeward.nats_auth import permissions_document\n"
        "doc = permissions_document(GRANTS, AGENT_GRANTS, READERS)\n"
        "print(json.dumps({'doc': doc, 'ops': sorted(ACCOUNTS['throwaway'].operations)}))\n"
    )
    got = _run(tree, sys.executable, "-c", code)
    assert got.returncode == 0, got.stderr[-2000:]
    said = json.loads(got.stdout)
    assert said["ops"] == ["nodes.list"]
    users = json.dumps(said["doc"])
    assert "nodeward-throwaway" in users
    assert "$KV.throwaway.>" in users
    # Derived from its one consumer declaration and its control: written nowhere else.
    assert "$JS.API.CONSUMER.CREATE.HEARTBEATS.throwaway" in users
    assert "control.throwaway.hello" in users


def test_its_command_is_mounted(tree: Path) -> None:
    got = _run(tree, *NODEWARD, "throwaway", "--help")
    assert got.returncode == 0, got.stderr[-2000:]
    assert "hello" in got.stdout and "how many nodes it counted" in got.stdout


def test_up_runs_it_and_status_shows_it(tree: Path, tmp_path: Path) -> None:
    with running_up(tmp_path, "--scenario", "none", env={"PYTHONPATH": str(tree)}) as up:
        assert "throwaway" in up.daemons  # ready, so it listed the nodes as its own account
        url = up.endpoints["nats_url"]

        def shown() -> bool:
            got = _run(tree, *NODEWARD, "status", "--nats", url, timeout=60)
            return got.returncode == 0 and "throwaway: counted 11 nodes" in got.stdout

        wait_until(shown, timeout=30, what="status shows the throwaway's row")
        hello = _run(
            tree, *NODEWARD, "throwaway", "hello", "--reason", "e2e", "--operator", "ada",
            "--state-dir", str(up.state), timeout=60,
        )  # fmt: skip
        assert hello.returncode == 0, hello.stderr[-2000:]
        assert hello.stdout == "hello ada: 11 nodes\n"
        got = _run(tree, *NODEWARD, "status", "--json", "--nats", url, timeout=60)
        rows = json.loads(got.stdout)["rows"]
        assert {"section": "throwaway", "text": "counted 11 nodes"}.items() <= next(
            r for r in rows if r["section"] == "throwaway"
        ).items()
