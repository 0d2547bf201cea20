"""What `nodeward up` adds for a newcomer: the demo profile, the default scenario, the fleet
size, and the story on the terminal."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import structlog

from nodeward.aio import within
from nodeward.bus.connection import connect_nats as connect_bus
from nodeward.bus.errors import BusError
from nodeward.cli.common import CliError, settings_for
from nodeward.config import Settings
from nodeward.endpoints import DEFAULT_STATE_DIR, Endpoints
from sim.cluster.seed import Seed, SeedError, load_seed
from sim.scenario import ScenarioError, Step, load_scenario

DEMO_PROFILE = "demo-profile.yaml"
DEFAULT_SCENARIO = "default.yaml"


def demo_settings(
    config: Path | None, nats: str | None, *, sim: bool
) -> tuple[Settings, str | None]:
    """Settings for `up`, and a line describing the demo profile when it applies.

    The profile applies only with the sim cluster and no `--config`; the environment
    (`NODEWARD_SERVICES__CORDON__HEALTHY_PERIOD`, ...) still overrides it.
    """
    if config is not None or not sim:
        return settings_for(config, nats), None
    with resources.as_file(resources.files("launch") / "data" / DEMO_PROFILE) as path:
        settings = settings_for(path, nats)
    cordon = settings.services.get("cordon", {})
    shown = ", ".join(
        f"{key} {cordon[key]}"
        for key in ("healthy_period", "cooldown", "reconcile_interval")
        if key in cordon
    )
    wait = settings.services.get("notifier", {}).get("grouping", {}).get("group_wait")
    if wait:
        shown += f"; services.notifier group_wait {wait}"
    culler = settings.services.get("culler", {})
    if culler.get("warn_after") and culler.get("cull_after"):
        shown += (
            f"; services.culler warn_after {culler['warn_after']}, "
            f"cull_after {culler['cull_after']}"
        )
    scan = settings.services.get("credentials", {}).get("scan_interval")
    if scan:
        shown += f"; services.credentials scan_interval {scan}"
    hang = settings.services.get("recovery", {}).get("hang", {})
    if hang.get("not_ready_after"):
        rungs = [
            f"{r['action']} {r['timeout']}"
            for ladder in hang.get("ladders", [])[:1]
            for r in ladder.get("steps", [])
            if "timeout" in r
        ]
        shown += f"; services.recovery.hang not_ready_after {hang['not_ready_after']}" + (
            f", rungs {', '.join(rungs)}" if rungs else ""
        )
    return settings, f"demo timings: services.cordon {shown} (--config FILE replaces them)"


def sim_seed(seed: Path | None, nodes: int | None) -> Seed:
    """The sim cluster's seed (`--seed` or the shipped one), resized to `--nodes`. The
    shipped one also gets the Falco sample alerts' pods, so any sample can be posted."""
    from sim.cluster.resize import resize_seed
    from sim.falco_samples import with_sample_pods

    try:
        data = load_seed(seed)
        data = resize_seed(data, nodes) if nodes is not None else data
    except SeedError as exc:
        raise CliError(str(exc)) from None
    return with_sample_pods(data) if seed is None else data


def load_demo_scenario(scenario: str, seed: Seed) -> list[Step]:
    """`--scenario`: none, default (the shipped one), or a file; checked against the fleet.

    The default scenario moves to the fleet's first GPU node when a seed lacks its node.
    """
    if scenario == "none":
        return []
    gpu_nodes = [n.name for n in seed.nodes if n.gpu is not None and n.gpu.count > 0]
    try:
        if scenario == "default":
            ref = resources.files("sim.scenarios") / DEFAULT_SCENARIO
            with resources.as_file(ref) as path:
                steps = load_scenario(path)
            if gpu_nodes and any(s.node not in gpu_nodes for s in steps):
                steps = [s.model_copy(update={"node": gpu_nodes[0]}) for s in steps]
        else:
            steps = load_scenario(Path(scenario))
    except ScenarioError as exc:
        raise CliError(str(exc)) from None
    for step in steps:
        if step.node not in gpu_nodes:
            raise CliError(
                f"scenario {scenario} names node {step.node!r}, which has no simulated GPU agent "
                f"(GPU nodes: {', '.join(gpu_nodes) or 'none'})"
            )
    return steps


def _shown(path: Path, cwd: Path, *, program: bool = False) -> str:
    """`path` as short as still works from `cwd`: relative below it, else absolute (a
    program in `cwd` itself as `./name`, which the shell does not look up on PATH)."""
    path = Path(os.path.abspath(path))  # not resolve(): a venv's python is a symlink
    try:
        shown = str(path.relative_to(cwd))
    except ValueError:
        return shlex.quote(str(path))
    return shlex.quote(f"./{shown}" if program and "/" not in shown else shown)


@dataclass(frozen=True)
class Hint:
    """Another `nodeward` command against this `up`, as it works when typed in the same
    directory: `hint("status")` is `nodeward status`, or `.venv/bin/nodeward status
    --state-dir demo` when that is what it takes."""

    program: str
    state_flag: str = ""

    def __call__(self, *words: str) -> str:
        return " ".join([self.program, *words]) + self.state_flag


def hint_command(
    state_dir: Path,
    *,
    argv0: str | None = None,
    cwd: Path | None = None,
    default_state_dir: Path = DEFAULT_STATE_DIR,
) -> Hint:
    """The program as it was started (`nodeward` when that is the one on PATH,
    `.venv/bin/nodeward`, or `python -m launch`), and `--state-dir` unless the state is in
    `./.nodeward`, where every command looks by default."""
    here = (cwd or Path.cwd()).resolve()
    program = argv0 if argv0 is not None else sys.argv[0]
    if Path(program).name == "__main__.py":  # python -m launch
        command = f"{_shown(Path(sys.executable), here, program=True)} -m launch"
    else:
        started = here / program if os.sep in program else Path(shutil.which(program) or program)
        on_path = shutil.which("nodeward")
        same = on_path is not None and Path(on_path).resolve() == started.resolve()
        command = "nodeward" if same else _shown(started, here, program=True)
    flag = ""
    if (here / state_dir).resolve() != (here / default_state_dir).resolve():
        flag = f" --state-dir {_shown(here / state_dir, here)}"
    return Hint(command, flag)


def metrics_summary(metrics: dict[str, str], shown: int = 8) -> list[str]:
    """Where each daemon's metrics are; each kind of simulated agent on one line, by port."""
    groups = {
        "agent-gpu-": "GPU agents",
        "agent-energy-": "energy agents",
        "agent-idle-": "idle agents",
    }
    grouped = {p: {n: u for n, u in metrics.items() if n.startswith(p)} for p in groups}
    members = {n for g in grouped.values() for n in g}
    lines = [f"{name:<10} {url}/metrics" for name, url in metrics.items() if name not in members]
    for prefix, agents in grouped.items():
        if not agents:
            continue
        host = next(iter(agents.values())).rsplit(":", 1)[0]
        ports = [u.rsplit(":", 1)[1] for u in agents.values()]
        more = " ..." if len(ports) > shown else ""
        lines.append(
            f"{groups[prefix]:<10} {host}:PORT/metrics, PORT {' '.join(ports[:shown])}{more} "
            f"({len(ports)}, by node in endpoints.json)"
        )
    return lines


@dataclass(frozen=True)
class Line:
    """One line of the banner `up` prints once ready: a label (empty: it continues the last
    one) and what it says; a command is never wrapped (copied whole, it works)."""

    label: str
    said: str
    command: bool = False


Banner = list[Line]


def banner_rows(
    endpoints: Endpoints,
    *,
    profile: str | None,
    hint: Hint,
    steps: Sequence[Step],
    seed: Seed | None,
) -> Banner:
    """What `up` says once ready: where everything is, and commands that work as printed."""
    rows: Banner = []
    if profile is not None:
        rows.append(Line("profile", profile))
    if endpoints.outbox:
        rows.append(Line("outbox", f"{endpoints.outbox}  (one file per delivered notice)"))
    rows.append(Line("daemons", f"{len(endpoints.metrics)}, each with /healthz /readyz /metrics:"))
    rows += [Line("", line) for line in metrics_summary(endpoints.metrics)]
    if endpoints.kubeconfig:
        where = f"sim cluster at {endpoints.kube_api}" if endpoints.kube_api else "cluster"
        rows.append(
            Line("kubectl", f"kubectl --kubeconfig {endpoints.kubeconfig} get nodes", command=True)
        )
        rows.append(Line("", f"({where})"))
    if endpoints.console_url:
        rows.append(Line("console", f"{endpoints.console_url}  (read-only, live)"))
    rows.append(Line("endpoints", str(endpoints.state_dir / "endpoints.json")))
    if endpoints.falco_ingest_url:
        token = (
            f"bearer token in {endpoints.falco_token_file}"
            if endpoints.falco_token_file
            else "mTLS"
        )
        rows.append(Line("falco", f"POST alerts to {endpoints.falco_ingest_url}  ({token})"))
    if endpoints.oauth2_token_url:
        rows.append(
            Line("oauth2", f"{endpoints.oauth2_token_url}  (the seeded Secrets renew here)")
        )
        rows.append(Line("", "kubectl get secrets -A -l nodeward.io/credential", command=True))
    sim_nodes = [
        n.removeprefix("agent-gpu-") for n in endpoints.metrics if n.startswith("agent-gpu-")
    ]
    tried = sim_nodes[-1:]
    if "fleet" in endpoints.metrics and seed is not None:
        gpu_nodes = [n.name for n in seed.nodes if n.gpu is not None and n.gpu.count]
        rows.append(Line("fleet", f"{len(gpu_nodes)} nodes' agents in one process (sim fleet)"))
        tried = gpu_nodes[-1:]
    if tried:
        inject = hint("sim", "inject", "--node", tried[0], "--gpu", "0", "--xid", "79")
        rows.append(Line("try it", inject, command=True))
    for node, address in endpoints.bmcs.items():
        rows.append(Line("hang it", hint("sim", "inject", "--node", node, "--hang"), command=True))
        rows.append(Line("", f"({node}'s machine runs under a simulated BMC at {address})"))
    if steps:
        # The first fault is what the story is about (a load step only sets the scene).
        first = next((s for s in steps if s.load is None), steps[0])
        rows.append(
            Line(
                "scenario",
                f"{len(steps)} step(s); in {first.after.total_seconds():g}s "
                f"{first.request().describe()} on {first.node} GPU {first.gpu}; the story "
                "follows below (--quiet hides it)",
            )
        )
    rows.append(Line("watch it", hint("status"), command=True))
    rows.append(Line("", hint("tail"), command=True))
    rows.append(Line("", "(in another terminal, this directory)  ·  Ctrl-C stops everything"))
    return rows


def print_banner(nats_url: str, rows: Banner, *, file: Any = None) -> None:
    """The banner on stderr (or `file`): labels in a column, what each says wrapped at the
    terminal's width (`COLUMNS`; whole lines in a pipe) under itself; a command too long for
    its column on a line of its own, unwrapped."""
    from rich.console import Console
    from rich.text import Text

    from nodeward.cli.common import PIPE_WIDTH

    console = Console(stderr=file is None, file=file, soft_wrap=False, highlight=False)
    if not console.is_terminal and not os.environ.get("COLUMNS", "").isdigit():
        console.width = PIPE_WIDTH
    console.print(Text.assemble(("nodeward is up", "bold green"), f" — NATS {nats_url}"))
    indent = 2 + LABEL_COLUMN + 1
    for line in rows:
        head = f"  {line.label:<{LABEL_COLUMN}} "
        if line.command and indent + len(line.said) > console.width:
            if line.label:
                console.print(head.rstrip())
            console.print(f"    {line.said}", overflow="ignore", crop=False)
            continue
        for k, part in enumerate(Text(line.said).wrap(console, max(console.width - indent, 20))):
            part.rstrip()
            console.print(Text(head if k == 0 else " " * indent) + part, crop=False)


LABEL_COLUMN = 11
"""The banner's labels' width."""


def story_for(settings: Settings) -> Callable[[Endpoints], Awaitable[None]]:
    """The task `up` runs to tell the story; it logs and ends instead of raising."""

    async def run(endpoints: Endpoints) -> None:
        from launch.story import tell

        log = structlog.get_logger().bind(component="story")
        try:
            # A connection that reconnects: `up` restarts its nats-server when it dies, and
            # the story carries on (re-subscribing) once it is back.
            nc, _ = await within(
                connect_bus(settings.bus, name="nodeward/up-story", wait=True), 30.0
            )
        except (BusError, OSError, TimeoutError) as exc:
            log.warning("story.unavailable", error=str(exc))
            return
        try:
            await tell(nc, endpoints.outbox)
        finally:
            with contextlib.suppress(Exception):
                await nc.close()

    return run
