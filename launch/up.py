"""`nodeward up`: NATS, the sim cluster (or a real one), the simulated agents and every service,
in one process until SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import structlog

from launch import sim_identity
from launch.access import DECLARED
from launch.registry import RegistryUnavailable, run_registry
from launch.sim_agents import energy as sim_energy
from launch.sim_agents import gpu as sim_gpu
from launch.sim_agents import idle as sim_idle
from launch.sim_agents.fleet import FLEET_ABOVE, fleet_process
from launch.sim_bmc import BmcNodes, bmc_nodes
from launch.story import story_line
from nodeward.bus import Bus
from nodeward.bus.errors import BusError
from nodeward.bus.server import EmbeddedNats, ServerRestart, free_port
from nodeward.config import Settings
from nodeward.daemon import Daemon, install_signal_handlers
from nodeward.endpoints import Endpoints
from nodeward.kube.client import KubeClient
from nodeward.kube.errors import KubeError
from nodeward.platform import Component, UpContext, bus_daemon, components
from nodeward.supervisor import ACTOR, Restart, RestartPolicy, Supervisor, Unit, restart_audit
from schemas.base import make_event
from schemas.remediation import Remediation
from services.admission.webhook import configuration
from sim.cluster.embedded import EmbeddedCluster, embedded_cluster
from sim.cluster.seed import Seed, load_seed
from sim.inject import InjectReply
from sim.notebooks import SimNotebookController
from sim.reboot import Machines, SimRebootOperator
from sim.scenario import Step, play

SimAgents = Callable[[UpContext, Seed], Awaitable[list[Daemon]]]
SIM_AGENTS: tuple[SimAgents, ...] = (
    sim_energy.build_for_up,
    sim_gpu.build_for_up,
    sim_idle.build_for_up,
)
"""The simulated node agents `up` runs on each seeded node, beside the services."""

NODE_GRACE_S = 10.0
"""The sim cluster's node lifecycle controller in `up`: a node whose kubelet stops (a hung
BMC-run node's machine) is `Ready=Unknown` this long after, not 40-50 s; the sim's kubelets
renew their Leases every quarter of it, and the controller looks every second."""


async def _platform_daemon(settings: Settings) -> tuple[Daemon, Bus]:
    """The `up` process's own daemon: health of the bus it provisioned, and its metrics."""
    return await bus_daemon("platform", settings, source="nodeward/up")


def _play_scenario(
    daemon: Daemon, bus: Bus, scenario: list[Step], daemons: Callable[[], list[Daemon]]
) -> None:
    """Run the scenario's injections as a task of the platform daemon. Its clock starts when
    every daemon is ready (a GPU agent takes no injection before it watches its GPUs)."""
    if scenario:
        log = structlog.get_logger().bind(component="scenario")

        def report(step: Step, reply: InjectReply | None, error: str | None) -> None:
            if error is None and reply is not None and reply.ok:
                log.info("scenario.injected", node=step.node, gpu=reply.gpu, applied=reply.applied)
            else:
                log.warning(
                    "scenario.failed",
                    node=step.node,
                    error=error or (reply.error if reply else None),
                )

        async def run() -> None:
            while not all([(await d.readiness()).ready for d in daemons()]):  # noqa: ASYNC110
                await asyncio.sleep(0.1)
            await play(bus.nc, scenario, on_reply=report)

        daemon.add_task(run, name="scenario")


def _sim_controllers(
    daemon: Daemon, bus: Bus, cluster: EmbeddedCluster, machines: Machines | None = None
) -> None:
    """What a real cluster's other controllers do, as tasks of the platform daemon: the
    simulated reboot operator (Kured's part: it reboots the sim nodes services.recovery
    asks to reboot; a BMC-run node through its BMC, `machines`) and Kubeflow's notebook
    controller (a notebook the culler stopped loses its pod, and its GPUs are free)."""
    client = KubeClient.from_settings(cluster.settings_for(None), user_agent="sim-controllers")
    operator = SimRebootOperator(client, bus.nc, machines=machines)
    daemon.add_task(operator.run, name="sim-reboot")
    daemon.add_task(SimNotebookController(client).run, name="sim-notebooks")
    daemon.add_shutdown_hook(client.close)


def _admission_in_sim(
    daemon: Daemon,
    bus: Bus,
    cluster: EmbeddedCluster,
    endpoints: Endpoints,
    supervisor: Supervisor,
    *,
    show: bool,
) -> None:
    """Once the admission webhook is ready, register it with the sim cluster (by URL, its CA
    as `caBundle`); with `show`, then tell the demo's credential story
    (`launch.sim_identity.show_mounted_credentials`)."""
    url, ca_file = endpoints.admission_url, endpoints.admission_ca_file
    if url is None or ca_file is None:
        return
    client = KubeClient.from_settings(cluster.settings_for(None), user_agent="sim-admission")
    daemon.add_shutdown_hook(client.close)
    log = structlog.get_logger().bind(component="up")

    async def ready() -> bool:
        webhook = next((d for d in supervisor.daemons if d.name == sim_identity.ADMISSION), None)
        return webhook is not None and webhook.started and (await webhook.readiness()).ready

    async def register() -> None:
        await sim_identity.until(ready, float("inf"))
        ca = await asyncio.to_thread(ca_file.read_bytes)
        try:
            await sim_identity.register_webhook(client, configuration(ca, url=url))
            log.info("up.admission_registered", url=url)
            if show:
                nodes = endpoints.state_dir / "nodes"
                await sim_identity.show_mounted_credentials(client, bus.nc, nodes, story_line)
        except (KubeError, OSError, ValueError) as exc:  # told, never the platform's end
            log.warning("up.admission_demo_failed", error=str(exc))

    daemon.add_task(register, name="sim-admission")


def _teller(daemon: Daemon, bus: Bus) -> Callable[[Remediation], None]:
    """Publish `up`'s restart audits on the bus (the story and operators read them there), as
    a task of the platform daemon; returns the (non-blocking) way to hand it one."""
    queue: asyncio.Queue[Remediation] = asyncio.Queue()
    log = structlog.get_logger().bind(component="up")

    async def publish() -> None:
        while True:
            event = make_event(await queue.get(), source=ACTOR)
            for attempt in range(1, 4):  # the same id each time: stored once
                try:
                    await bus.publish(event)
                    break
                except BusError as exc:
                    log.warning(
                        "up.restart_untold",
                        subject=event.data.nats_subject(),
                        attempt=attempt,
                        error=str(exc),
                    )

    daemon.add_task(publish, name="restarts")
    return queue.put_nowait


async def _units(
    context: UpContext,
    seed: Seed | None,
    fleet_above: int,
    by_node: dict[str, list[str]] | None = None,
) -> list[Unit]:
    """What `up` restarts as one when a daemon of it dies: each component, and each
    simulated agent of each node (or, above `fleet_above` GPU nodes, the fleet process).
    `by_node` gets each node's units of simulated agents, by name."""
    units = []
    gpu_nodes = [n for n in seed.nodes if n.gpu is not None and n.gpu.count > 0] if seed else []
    if seed is not None and len(gpu_nodes) > fleet_above:

        async def build_fleet(s: Seed = seed) -> list[Daemon]:
            return await fleet_process(context, s)

        units.append(Unit("fleet", build_fleet, await build_fleet()))
    elif seed is not None:
        for build_agents in SIM_AGENTS:
            for node in seed.nodes:
                one = seed.model_copy(update={"nodes": [node]})

                async def build(b: SimAgents = build_agents, s: Seed = one) -> list[Daemon]:
                    return await b(context, s)

                built = await build()
                if built:
                    units.append(Unit(", ".join(d.name for d in built), build, built))
                    if by_node is not None:
                        by_node.setdefault(node.name, []).append(units[-1].name)
    for component in components():

        async def build_component(c: Component = component) -> list[Daemon]:
            return await c.build(context)

        units.append(Unit(component.name, build_component, await build_component()))
    return units


def _bmc_run(seed: Seed, asked: Sequence[str], fleet_above: int) -> list[str]:
    """The nodes a BMC runs: those asked, unless the fleet simulates the agents (a hung
    machine silences its node's agents, which must then run in this process)."""
    gpu_nodes = [n for n in seed.nodes if n.gpu is not None and n.gpu.count > 0]
    if asked and len(gpu_nodes) > fleet_above:
        structlog.get_logger().warning(
            "up.no_bmc",
            nodes=list(asked),
            why=f"the fleet simulator runs the agents of more than {fleet_above} GPU nodes",
        )
        return []
    return list(asked)


def _push_to(settings: Settings, registry: str, nodes: Path) -> None:
    """The checkpoint service pushes moved pods' images to `up`'s registry and reads the sim
    nodes' archives under `nodes`, unless the config says otherwise."""
    section = settings.services.setdefault("checkpoint", {})
    images = section.setdefault("images", {})
    if not images.get("registry"):
        images.update(registry=f"{registry}/nodeward-checkpoints", insecure=True)
    images.setdefault("node_root", f"{nodes}/{{node}}")


async def _registry(stack: contextlib.AsyncExitStack, state_dir: Path) -> str | None:
    """The local registry checkpoint images are pushed to (`<state>/registry`), or None with
    a warning where docker-registry is missing or does not start."""
    try:
        return await stack.enter_async_context(
            run_registry(state_dir / "registry", dies_with_parent=True)
        )
    except RegistryUnavailable as exc:
        structlog.get_logger().warning("up.no_registry", error=str(exc))
        return None


async def run_up(
    settings: Settings,
    state_dir: Path,
    *,
    nats_port: int = 0,
    external_nats: bool = False,
    seed: Path | Seed | None = None,
    scenario: list[Step] | None = None,
    fleet_above: int = FLEET_ABOVE,
    bmc_nodes_run: Sequence[str] = (),
    announce: Callable[[Endpoints], None],
    story: Callable[[Endpoints], Awaitable[None]] | None = None,
) -> None:
    """The whole platform in this process until SIGINT/SIGTERM.

    Without a kubeconfig in `settings.cluster` the sim cluster runs too, and its kubeconfig
    is written to `<state-dir>/kubeconfig`, with a registry (docker-registry, where
    installed) that the checkpoint service pushes moved pods' images to and the sim nodes'
    kubelets restore them from; the nodes' checkpoint archives are under
    `<state-dir>/nodes/<node>/`. Simulated agents run in this process for up to
    `fleet_above` GPU nodes; for more, the fleet simulator runs them in a process of its own
    (`nodeward sim fleet`). A simulated BMC runs the machine of each node of `bmc_nodes_run`
    (`launch.sim_bmc`; with the sim cluster and in-process agents, where `ipmi_sim` is
    installed, else one warning says why not). `story(endpoints)` runs as a task of the
    platform daemon once everything has started (it must not raise). A daemon that dies is
    restarted with its component (`nodeward.supervisor`); the platform daemon dying stops
    everything.
    """
    log = structlog.get_logger().bind(component="up")
    state_dir = state_dir.resolve()  # noqa: ASYNC240 - once, before anything runs
    outbox = state_dir / "outbox"
    outbox.mkdir(parents=True, exist_ok=True)
    endpoints: Endpoints | None = None
    server: EmbeddedNats | None = None
    # From the first moment: a Ctrl-C, SIGTERM or hang-up while the platform is built
    # stops it as one later does (the supervisor's run returns at once), never half-built.
    signalled = asyncio.Event()
    remove_handlers = install_signal_handlers(lambda _: signalled.set())
    async with contextlib.AsyncExitStack() as stack:
        stack.callback(remove_handlers)
        if not external_nats:
            # The port is chosen once: a restarted server must come back where clients look.
            server = EmbeddedNats(
                state_dir / "nats", port=nats_port or free_port(), dies_with_parent=True
            )
            await stack.enter_async_context(server)
            settings.bus.url = server.url
        kube_api: str | None = None
        bmcs = BmcNodes()
        cluster: EmbeddedCluster | None = None
        seed_data: Seed | None = None
        registry: str | None = None
        if settings.cluster.kubeconfig is None:
            seed_data = seed if isinstance(seed, Seed) else load_seed(seed)
            registry = await _registry(stack, state_dir)
            cluster = await stack.enter_async_context(
                embedded_cluster(
                    state_dir,
                    seed=seed_data,
                    access=DECLARED,
                    archive_root=state_dir / "nodes",
                    registries=(registry,) if registry else (),
                    lease_renew_s=NODE_GRACE_S / 4,
                    node_monitor_period_s=1.0,
                    node_monitor_grace_s=NODE_GRACE_S,
                )
            )
            settings.cluster = cluster.settings_for(None)
            kube_api = cluster.url
            bmcs = await stack.enter_async_context(
                bmc_nodes(
                    state_dir,
                    cluster.settings_for(None),
                    _bmc_run(seed_data, bmc_nodes_run, fleet_above),
                )
            )
            if bmcs.unavailable is not None:
                log.warning("up.no_bmc", nodes=list(bmc_nodes_run), why=bmcs.unavailable)
            if registry:
                _push_to(settings, registry, state_dir / "nodes")
            await stack.enter_async_context(sim_identity.directory(state_dir, settings))
        # The platform daemon goes first: its bus provisions the streams the others use.
        platform, platform_bus = await _platform_daemon(settings)
        context = UpContext(
            settings, state_dir, cluster.settings_for if cluster is not None else None
        )
        by_node: dict[str, list[str]] = {}
        units = await _units(context, seed_data, fleet_above, by_node)
        for name, bmc_node in bmcs.nodes.items():
            bmc_node.units = by_node.get(name, [])
        tell = _teller(platform, platform_bus)

        def restarted(report: Restart) -> None:
            tell(report.audit())
            if report.gave_up:
                platform.add_readiness_check(f"gave up on {report.unit}", lambda: False)
            assert endpoints is not None
            endpoints.metrics = {d.name: d.url for d in supervisor.daemons if d.started}
            for key, value in context.endpoints.items():
                setattr(endpoints, key, value)
            endpoints.write()

        supervisor = Supervisor(
            [platform],
            units,
            RestartPolicy.of(settings.daemon.restart),
            on_restart=restarted,
        )
        for d in supervisor.daemons:
            await d.start()
        endpoints = Endpoints(
            nats_url=settings.bus.url,
            state_dir=state_dir,
            outbox=outbox,
            kubeconfig=settings.cluster.kubeconfig,
            kube_api=kube_api,
            registry=registry,
            bmcs=bmcs.addresses,
            metrics={d.name: d.url for d in supervisor.daemons},
            **context.endpoints,
        )
        if server is not None:
            supervised = server

            def server_restarted(r: ServerRestart) -> None:
                result = f"back on {r.address} after {r.down_s:.1f} s"
                details = {"restarts": r.restarts, "down_s": round(r.down_s, 3)}
                tell(restart_audit("nats-server", r.reason, result, details=details))

            async def supervise() -> None:
                await supervised.supervise(on_restart=server_restarted)

            platform.add_task(supervise, name="nats-server")
        if story is not None:
            told = endpoints

            async def tell_story() -> None:
                await story(told)

            platform.add_task(tell_story, name="story")
        _play_scenario(platform, platform_bus, scenario or [], lambda: supervisor.daemons)
        if cluster is not None:
            bmcs.attach(platform, platform_bus.nc, supervisor)
            _sim_controllers(platform, platform_bus, cluster, bmcs if bmcs.nodes else None)
            _admission_in_sim(
                platform, platform_bus, cluster, endpoints, supervisor, show=story is not None
            )
        stack.callback(endpoints.remove)
        endpoints.write()
        log.info(
            "up.ready",
            nats=settings.bus.url,
            kube=kube_api,
            daemons=[d.name for d in supervisor.daemons],
        )
        announce(endpoints)
        await supervisor.run(handle_signals=False, signalled=signalled)
