"""`nodeward`: the runtime's commands plus `up` and `sim`, which need the simulators, and the
commands each service names in its plugin (`nodeward.plugin`: `quarantine`,
`maintenance`, `capacity`, `report`, ...).

This is the composition root's command line and the `nodeward` executable. The simulators
are imported only when `up` or a `sim` command runs, so `nodeward service cordon` loads none of them.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from nodeward.cli import _run, app
from nodeward.cli import main as _main
from nodeward.cli.common import CliError
from nodeward.cli.options import ConfigOpt, NatsOpt
from nodeward.cli.plugins import mount
from nodeward.endpoints import DEFAULT_STATE_DIR, Endpoints
from sim.cli import SimContext, sim_app  # typer only: the simulators load when a sim command runs

if TYPE_CHECKING:
    from nodeward.kube.access import Access


@app.command()
def up(  # noqa: PLR0917 - typer maps parameters to options
    state_dir: Annotated[
        Path, typer.Option("--state-dir", help="NATS store, kubeconfig, outbox, endpoints.json")
    ] = DEFAULT_STATE_DIR,
    nats_port: Annotated[
        int, typer.Option("--nats-port", min=0, max=65535, help="embedded NATS port; 0 picks one")
    ] = 0,
    nats: NatsOpt = None,
    kubeconfig: Annotated[
        Path | None,
        typer.Option("--kubeconfig", help="a real cluster (default: run the sim cluster)"),
    ] = None,
    seed: Annotated[
        Path | None,
        typer.Option("--seed", help="the sim cluster's seed YAML (default: the shipped one)"),
    ] = None,
    scenario: Annotated[
        str,
        typer.Option(
            "--scenario",
            help="FILE of timed injections into the simulated GPUs, none, or default "
            "(a GPU fails 10 s in and recovers later)",
        ),
    ] = "default",
    nodes: Annotated[
        int | None,
        typer.Option("--nodes", min=1, help="simulated GPU nodes (default: the seed's)"),
    ] = None,
    fleet_above: Annotated[
        int,
        typer.Option(
            "--fleet-above",
            min=0,
            help="above this many GPU nodes the simulated agents run as one fleet process "
            "(`nodeward sim fleet`) instead of one set per node in this process",
        ),
    ] = 32,
    bmc_node: Annotated[
        list[str] | None,
        typer.Option(
            "--bmc-node",
            help="a GPU node whose machine a simulated BMC (ipmi_sim) runs, for "
            "`sim inject --node N --hang` (repeatable; default gpu-h100-04; none: no BMC)",
        ),
    ] = None,
    quiet: Annotated[
        bool, typer.Option("--quiet", help="do not tell the story of each remediation")
    ] = False,
    config: ConfigOpt = None,
) -> None:
    """Run the whole platform in one process: NATS, the sim cluster, every agent and service."""
    from nodeward.plugin import PluginError, services

    try:  # every registered service runs: one that does not load stops `up`, in one line
        services()
    except PluginError as exc:
        raise CliError(str(exc)) from None
    from launch.demo import (
        demo_settings,
        hint_command,
        load_demo_scenario,
        sim_seed,
    )
    from launch.up import run_up

    running = Endpoints.read(state_dir)
    if running is not None:
        raise CliError(
            f"nodeward up is already running from {state_dir} (pid {running.pid}, NATS {running.nats_url})"
        )
    if kubeconfig is not None and not kubeconfig.is_file():
        raise CliError(f"kubeconfig {kubeconfig} does not exist")
    if seed is not None and not seed.is_file():
        raise CliError(f"seed {seed} does not exist")
    if kubeconfig is not None and (
        nodes is not None or scenario not in ("default", "none") or bmc_node
    ):
        raise CliError(
            "--nodes, --scenario FILE and --bmc-node size and drive the sim cluster; "
            "not with --kubeconfig"
        )
    settings, profile = demo_settings(config, nats, sim=kubeconfig is None)
    if kubeconfig is not None:
        settings.cluster.kubeconfig = kubeconfig
    seed_data = sim_seed(seed, nodes) if kubeconfig is None else None
    steps = load_demo_scenario(scenario, seed_data) if seed_data is not None else []
    bmc_run: list[str] = []
    if seed_data is not None:
        from launch.sim_bmc import chosen

        gpu_nodes = [n.name for n in seed_data.nodes if n.gpu is not None and n.gpu.count > 0]
        try:
            bmc_run = chosen(bmc_node, gpu_nodes)
        except ValueError as exc:
            raise CliError(str(exc)) from None

    hint = hint_command(state_dir)

    def announce(endpoints: Endpoints) -> None:
        from launch.demo import banner_rows, print_banner

        rows = banner_rows(endpoints, profile=profile, hint=hint, steps=steps, seed=seed_data)
        print_banner(endpoints.nats_url, rows)

    story = None
    if not quiet:
        from launch.demo import story_for

        story = story_for(settings)
    _run(
        run_up(
            settings,
            state_dir,
            nats_port=nats_port,
            external_nats=nats is not None,
            seed=seed_data,
            scenario=steps,
            fleet_above=fleet_above,
            bmc_nodes_run=bmc_run,
            announce=announce,
            story=story,
        )
    )


@sim_app.command("fleet")
def fleet(  # noqa: PLR0917 - typer maps parameters to options
    nodes: Annotated[
        int | None,
        typer.Option("--nodes", min=1, help="GPU nodes (default: the seed's); the seed resized"),
    ] = None,
    gpus: Annotated[
        int | None, typer.Option("--gpus", min=1, help="GPUs per node (default: the seed's)")
    ] = None,
    faults: Annotated[
        float,
        typer.Option("--faults", min=0, help="XID 79s per node per hour, at random (default 0)"),
    ] = 0.0,
    seed: Annotated[
        Path | None,
        typer.Option("--seed", help="the fleet's nodes and pods (default: the shipped seed)"),
    ] = None,
    nkeys: Annotated[
        Path | None,
        typer.Option(
            "--nkeys",
            help="a folder of node nkey seeds (<node>.nk): each node publishes as itself",
        ),
    ] = None,
    port: Annotated[int, typer.Option("--port", help="its /healthz /readyz /metrics; 0 picks")] = 0,
    nats: NatsOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Publish what N nodes' GPU, energy and idle agents would, from one process, until
    SIGINT or SIGTERM; answer `nodeward sim inject` for those nodes."""

    from launch.demo import sim_seed
    from launch.sim_agents.fleet import fleet_daemon
    from nodeward.cli.common import settings_for
    from nodeward.daemon import serve

    if seed is not None and not seed.is_file():
        raise CliError(f"seed {seed} does not exist")
    if nkeys is not None and not nkeys.is_dir():
        raise CliError(f"--nkeys {nkeys} is not a folder")
    data = sim_seed(seed, nodes)
    settings = settings_for(config, nats)

    async def run() -> None:
        daemon, sim = await fleet_daemon(
            settings, data.nodes, data.pods, gpus=gpus, faults_per_hour=faults, nkeys=nkeys
        )
        await daemon.start(port=port or None)
        typer.echo(f"fleet: {len(sim.nodes)} nodes on {settings.bus.url}; {daemon.url}")
        sys.stdout.flush()
        await serve([daemon])

    _run(run())


def _declared_access() -> tuple[Access, ...]:
    """Every daemon's declared access (imported only when a sim command asks)."""
    from launch.access import DECLARED

    return DECLARED


app.add_typer(sim_app, name="sim", context_settings={"obj": SimContext(access=_declared_access)})
# Last, so that a service's command named like one of ours is refused, not shadowed: each
# service's commands, from its own folder (typer only: they load what they run when they run).
mount(app)


def main(argv: list[str] | None = None) -> int:
    """The `nodeward` executable: the runtime's commands, `up` and `sim`."""
    return _main(argv)


if __name__ == "__main__":
    sys.exit(main())
