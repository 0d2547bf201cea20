"""`nodeward sim ...`: simulated peers on their own (mounted by `launch.cli`)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from nodeward.endpoints import DEFAULT_STATE_DIR

if TYPE_CHECKING:
    from nodeward.kube.access import Access

sim_app = typer.Typer(
    name="sim", help="Run simulated peers (the sim cluster) on their own.", no_args_is_help=True
)


def _none() -> Iterable[Access]:
    return ()


@dataclass(frozen=True)
class SimContext:
    """What the composition root hands the `sim` commands (typer's `ctx.obj`): the daemons'
    declared access, loaded when asked (the sim cluster's roles without deploy/rbac)."""

    access: Callable[[], Iterable[Access]] = _none


@sim_app.callback()
def _group() -> None:
    """Simulated peers for trying nodeward without a cluster."""


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code=2)


@sim_app.command("cluster")
def cluster(  # noqa: PLR0917 - typer maps parameters to options
    ctx: typer.Context,
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
            "--rbac",
            help="RBAC manifests (file or dir); default: the source tree's deploy/rbac, "
            "else roles built from the daemons' declared access",
        ),
    ] = None,
    kube_version: Annotated[
        str | None,
        typer.Option(
            "--kube-version",
            help="the Kubernetes release to claim and serve the APIs of, e.g. 1.33 "
            "(default: $NODEWARD_SIM_KUBE_VERSION, else the client models' release)",
        ),
    ] = None,
    enable: Annotated[
        list[str] | None,
        typer.Option(
            "--enable",
            help="a feature gate or runtime-config group-version to enable, e.g. "
            "resource.k8s.io/v1alpha3 (repeatable; default: DRADeviceTaints)",
        ),
    ] = None,
) -> None:
    """Run the sim cluster until SIGINT or SIGTERM; kubectl --kubeconfig OUT talks to it."""
    from nodeward.logs import configure_logging
    from sim.cluster import SeedError, SimCluster, load_seed

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
    declared = tuple(ctx.obj.access()) if isinstance(ctx.obj, SimContext) else ()

    async def run() -> None:
        try:
            sim = SimCluster(
                loaded,
                host=host,
                port=port,
                rbac_dirs=rbac,
                access=declared,
                kube_version=kube_version,
                enabled=enable,
            )
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


@sim_app.command("inject")
def inject(  # noqa: PLR0917 - typer options
    node: Annotated[str | None, typer.Option("--node", help="the simulated node")] = None,
    gpu: Annotated[int, typer.Option("--gpu", help="GPU index on that node")] = 0,
    xid: Annotated[int | None, typer.Option("--xid", help="raise this XID")] = None,
    fault: Annotated[
        str | None,
        typer.Option(
            "--fault",
            help="NVIDIA: ecc-dbe-burst, row-remap-failure, retired-page-limit, fallen-off-bus, "
            "thermal, nvlink-errors, pcie-replay or hang; AMD (MI300X nodes): "
            "ecc-uncorrectable, ecc-correctable-burst, bad-page-threshold, "
            "bad-page-unreservable, ring-hang, gpu-reset, thermal, fallen-off-bus or hang",
        ),
    ] = None,
    recover: Annotated[
        bool, typer.Option("--recover", help="reset the GPU: clear every fault")
    ] = False,
    load: Annotated[
        float | None,
        typer.Option("--load", help="set the GPU's utilisation % (its power follows)"),
    ] = None,
    hang: Annotated[
        bool,
        typer.Option(
            "--hang",
            help="hang the whole node (not a GPU): its BMC-run machine stops (SIGSTOP) and its "
            "agents fall silent until its BMC powers it off and on (nodeward up's BMC nodes)",
        ),
    ] = False,
    via: Annotated[
        str,
        typer.Option(
            "--via", help="with --xid: nvml (NVML's event), kmsg (the kernel log only) or both"
        ),
    ] = "nvml",
    driver: Annotated[
        str,
        typer.Option(
            "--driver", help="with --via kmsg/both: the driver's line format (r470, r535, r550)"
        ),
    ] = "r550",
    scenario: Annotated[
        Path | None,
        typer.Option("--scenario", help="a YAML file of timed injections, instead of one"),
    ] = None,
    nats: Annotated[
        str | None,
        typer.Option("--nats", help="NATS URL (default: NODEWARD_NATS_URL, nodeward up)"),
    ] = None,
    timeout: Annotated[
        float, typer.Option("--timeout", help="seconds to wait for each reply")
    ] = 3.0,
    state_dir: Annotated[
        Path,
        typer.Option(
            "--state-dir", help="where a running `nodeward up` wrote endpoints.json (to find NATS)"
        ),
    ] = DEFAULT_STATE_DIR,
) -> None:
    """Inject a fault (or a load) into a simulated node's GPU (its GPU agent answers on sim.inject.<node>).

    With --hang, hang the node itself (`nodeward up` answers on sim.hang.<node>). With
    --scenario, play a file of timed injections and print one line per step.
    Errors are one line on stderr: exit code 2 for wrong options, 1 for the rest.
    """
    from pydantic import ValidationError

    from nodeward.cli.common import fail, settings_for, usage
    from sim.inject import InjectReply, InjectRequest, request_injection
    from sim.scenario import ScenarioError, Step, load_scenario, play

    steps: list[Step] = []
    request: InjectRequest | None = None
    if hang:
        if node is None or scenario is not None:
            usage("--hang takes --node (and no --scenario)")
        if xid is not None or fault is not None or recover or load is not None or gpu != 0:
            usage("--hang hangs the whole node: no --gpu, --xid, --fault, --recover or --load")
    elif scenario is not None:
        try:
            steps = load_scenario(scenario)
        except ScenarioError as exc:
            fail(str(exc))
    else:
        if node is None:
            usage("give --node (or --scenario)")
        chosen = [xid is not None, fault is not None, recover, load is not None]
        if sum(chosen) != 1:
            usage("give exactly one of --xid, --fault, --recover, --load or --hang")
        if xid is None and (via != "nvml" or driver != "r550"):
            usage("--via and --driver go with --xid only")
        try:
            request = InjectRequest(
                gpu=gpu,
                xid=xid,
                fault=fault,
                recover=recover,
                load=load,
                via=via,  # validated by the model
                driver=driver,
            )
        except ValidationError as exc:  # an unknown fault or driver, a load over 100
            error = exc.errors()[0]
            where = "".join(f"--{part}: " for part in error["loc"] if isinstance(part, str))
            usage(where + str(error["msg"]).removeprefix("Value error, "))
    bus = settings_for(None, nats, state_dir).bus

    async def quiet(exc: Exception) -> None:
        """Connection errors are reported once, below."""

    async def run() -> str:
        import nats as nats_client
        from nats.errors import NoRespondersError
        from nats.errors import TimeoutError as NatsTimeout

        try:
            nc = await nats_client.connect(
                bus.url,
                name="cli/sim-inject",
                max_reconnect_attempts=1,
                allow_reconnect=False,
                connect_timeout=bus.connect_timeout.total_seconds(),
                error_cb=quiet,
                user=bus.user,
                password=bus.password.get_secret_value() if bus.password else None,
                token=bus.token.get_secret_value() if bus.token else None,
                user_credentials=str(bus.creds_file) if bus.creds_file else None,
            )
        except Exception as exc:  # noqa: BLE001 - any connection failure is one line
            fail(f"cannot connect to NATS at {bus.url}: {exc or type(exc).__name__}")
        try:
            if hang:
                assert node is not None
                return await _hang(nc, node, timeout)
            if request is None:
                failures: list[str] = []

                def report(step: Step, reply: InjectReply | None, error: str | None) -> None:
                    if reply is not None and reply.ok:
                        typer.echo(f"{step.after} {reply.node} gpu {reply.gpu}: {reply.applied}")
                    else:
                        why = error or (reply.error if reply else "no reply")
                        failures.append(f"{step.node} gpu {step.gpu}: {why}")
                        typer.echo(f"{step.after} {step.node} gpu {step.gpu}: FAILED {why}")

                await play(nc, steps, on_reply=report, timeout=timeout)
                if failures:
                    fail(f"{len(failures)} of {len(steps)} steps failed; first: {failures[0]}")
                return f"scenario done: {len(steps)} steps"
            assert node is not None
            try:
                reply = await request_injection(nc, node, request, timeout=timeout)
            except NoRespondersError:
                fail(f"no simulated GPU agent for node {node!r} is listening")
            except NatsTimeout:
                fail(f"node {node!r} did not answer within {timeout:g}s")
            if not reply.ok:
                fail(f"{node}: {reply.error}")
            return f"{reply.node} gpu {reply.gpu}: {reply.applied} injected"
        finally:
            await nc.close()

    typer.echo(asyncio.run(run()))


async def _hang(nc: Any, node: str, timeout: float) -> str:
    """`sim inject --hang`: what `nodeward up` did, or one line on why not."""
    from nats.errors import NoRespondersError
    from nats.errors import TimeoutError as NatsTimeout

    from nodeward.cli.common import fail
    from sim.hang import request_hang

    try:
        reply = await request_hang(nc, node, timeout=max(timeout, 5.0))
    except NoRespondersError:
        fail(
            f"nothing answers sim.hang for {node!r}: is `nodeward up` (with the sim cluster) running?"
        )
    except NatsTimeout:
        fail(f"nodeward up did not answer the hang of {node!r} within {max(timeout, 5.0):g}s")
    if not reply.ok:
        fail(f"{node}: {reply.error}")
    return f"{reply.node}: {reply.applied}"


if __name__ == "__main__":
    sim_app()
