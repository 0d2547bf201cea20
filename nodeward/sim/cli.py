"""`nodeward sim ...`: simulated peers on their own. Mount with `app.add_typer(sim_app, name="sim")`."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from pathlib import Path
from typing import Annotated

import typer

sim_app = typer.Typer(
    name="sim", help="Run simulated peers (the sim cluster) on their own.", no_args_is_help=True
)


@sim_app.callback()
def _group() -> None:
    """Simulated peers for trying nodeward without a cluster."""


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code=2)


@sim_app.command("cluster")
def cluster(
    seed: Annotated[
        Path | None, typer.Option("--seed", help="seed YAML (default: the shipped seed)")
    ] = None,
    port: Annotated[int, typer.Option("--port", help="port to listen on; 0 picks a free one")] = 0,
    host: Annotated[str, typer.Option("--host", help="address to listen on")] = "127.0.0.1",
    kubeconfig: Annotated[
        Path, typer.Option("--kubeconfig", help="where to write the kubeconfig")
    ] = Path(".nodeward/kubeconfig"),
    rbac: Annotated[
        list[Path] | None,
        typer.Option(
            "--rbac", help="RBAC manifests (file or dir); default: the source tree's deploy/rbac"
        ),
    ] = None,
) -> None:
    """Run the sim cluster until SIGINT or SIGTERM; kubectl --kubeconfig OUT talks to it."""
    from nodeward.logs import configure_logging
    from nodeward.sim.cluster import SeedError, SimCluster, load_seed

    if not 0 <= port <= 65535:
        raise _fail(f"--port must be between 0 and 65535, not {port}")
    for path in rbac or []:
        if not path.exists():
            raise _fail(f"--rbac {path}: no such file or directory")
    try:
        loaded = load_seed(seed)
    except SeedError as exc:
        raise _fail(str(exc)) from None
    configure_logging("warning")

    async def run() -> None:
        try:
            sim = SimCluster(loaded, host=host, port=port, rbac_dirs=rbac)
        except (ValueError, KeyError) as exc:
            raise _fail(f"cannot build the sim cluster: {exc}") from None
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            await sim.start()
        except OSError as exc:
            raise _fail(f"cannot listen on {host}:{port}: {exc.strerror}") from None
        try:
            try:
                path = sim.write_kubeconfig(kubeconfig)
            except OSError as exc:
                raise _fail(f"cannot write kubeconfig {kubeconfig}: {exc.strerror}") from None
            typer.echo(f"sim cluster: {sim.url}")
            typer.echo(f"kubeconfig: {path.resolve()}")
            typer.echo(f"identities: {', '.join(sorted(sim.identities))}")
            sys.stdout.flush()
            await stop.wait()
        finally:
            await sim.stop()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run())


if __name__ == "__main__":
    sim_app()
