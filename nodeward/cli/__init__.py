"""The `nodeward` command line (typer + rich). Errors are one line and a non-zero exit.

These are the runtime's commands, and they name no service; `launch.cli` adds `up` and
`sim` (the composition root) and the commands each service names in its
plugin (`nodeward.cli.plugins`: `quarantine`, `maintenance`,
`report`, ...), and is the `nodeward` executable. Importing it loads typer and each
command's options only; a command imports what it runs (nats, the bus, the schemas, the
kube client) when it runs, so `nodeward status` loads no daemon and `--help` no client.
"""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any

import typer

from nodeward.cli.common import CliError, CliUsageError, defer_websocket_client, settings_for
from nodeward.cli.daemons import daemon_logging, run_built, run_daemon
from nodeward.cli.options import ConfigOpt, JsonOpt, NatsOpt, StateDirOpt
from nodeward.durations import parse_duration
from nodeward.endpoints import DEFAULT_STATE_DIR

app = typer.Typer(
    name="nodeward",
    help="Event-driven node agents and remediation services for GPU Kubernetes platforms.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
schemas_app = typer.Typer(
    help="The event contract: JSON Schemas and examples.", no_args_is_help=True
)
app.add_typer(schemas_app, name="schemas")


def _duration(value: str | None, option: str) -> timedelta | None:
    """`value` as a duration; a usage error naming `option` when it is not one."""
    if value is None:
        return None
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint=option) from None


def _run(coro: Any) -> None:
    import asyncio

    asyncio.run(coro)


@app.callback()
def _root(
    log_level: Annotated[
        str | None,
        typer.Option(
            "--log-level",
            help="debug, info, warning or error (default: warning; for `agent` and `service`, "
            "the config's log.level, info)",
        ),
    ] = None,
) -> None:
    from nodeward.logs import configure_logging

    if log_level not in (None, "debug", "info", "warning", "error"):
        raise typer.BadParameter(f"unknown log level {log_level!r}", param_hint="--log-level")
    configure_logging(log_level or "warning")


@app.command()
def bus(
    state_dir: Annotated[
        Path, typer.Option("--state-dir", help="where the JetStream store lives")
    ] = DEFAULT_STATE_DIR,
    port: Annotated[
        int, typer.Option("--port", min=0, max=65535, help="client port; 0 picks a free one")
    ] = 4222,
) -> None:
    """Run the embedded nats-server with JetStream and every stream provisioned."""
    from nodeward.platform import run_bus

    def announce(url: str) -> None:
        typer.echo(url)
        sys.stdout.flush()
        print(
            f"nodeward bus: NATS with JetStream at {url} (store {state_dir}/nats); Ctrl-C stops it",
            file=sys.stderr,
        )

    _run(run_bus(state_dir, port, announce))


@app.command()
def publish(  # noqa: PLR0917 - typer maps parameters to options
    type_name: Annotated[
        str, typer.Argument(metavar="TYPE", help="event type, e.g. gpu.health.v1")
    ],
    data: Annotated[
        str,
        typer.Option(
            "--data", help="JSON text, @file, or @- for stdin: the data, or a whole CloudEvent"
        ),
    ],
    nats: NatsOpt = None,
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
    state_dir: StateDirOpt = DEFAULT_STATE_DIR,
) -> None:
    """Validate an event and publish it; invalid data is refused with the validation error."""
    defer_websocket_client()
    from nodeward.cli.events import publish as do_publish

    _run(do_publish(settings_for(config, nats, state_dir), type_name, data, as_json))


@app.command()
def tail(  # noqa: PLR0917 - typer maps parameters to options
    subjects: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="[SUBJECT...]",
            help="subject filters, e.g. 'gpu.health.>' (default: everything)",
        ),
    ] = None,
    since: Annotated[
        str | None,
        typer.Option("--since", help="start this far back, e.g. 1m, 2h (default: new events only)"),
    ] = None,
    count: Annotated[int | None, typer.Option("--count", min=1, help="exit after N events")] = None,
    timeout: Annotated[
        str | None, typer.Option("--timeout", help="give up (exit 1) if nothing arrives in time")
    ] = None,
    node: Annotated[str | None, typer.Option("--node", help="only events about this node")] = None,
    namespace: Annotated[
        str | None, typer.Option("--namespace", help="only events about this namespace")
    ] = None,
    severity: Annotated[
        str, typer.Option("--severity", help="at least info, warning or critical")
    ] = "info",
    heartbeats: Annotated[
        bool, typer.Option("--heartbeats", help="also show periodic health restatements")
    ] = False,
    nats: NatsOpt = None,
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
    state_dir: StateDirOpt = DEFAULT_STATE_DIR,
) -> None:
    """Follow events as they are stored (ordered consumer); readable lines or JSON lines."""
    defer_websocket_client()
    from nodeward.cli.events import SEVERITIES, TailFilter
    from nodeward.cli.events import tail as do_tail

    if severity not in SEVERITIES:
        raise typer.BadParameter(f"must be one of {', '.join(SEVERITIES)}", param_hint="--severity")

    _run(
        do_tail(
            settings_for(config, nats, state_dir),
            subjects or [],
            since=_duration(since, "--since"),
            count=count,
            as_json=as_json,
            timeout=_duration(timeout, "--timeout"),
            where=TailFilter(node, namespace, severity, heartbeats),
        )
    )


@app.command()
def status(  # noqa: PLR0917 - typer maps parameters to options
    actions: Annotated[
        int, typer.Option("--actions", min=0, help="how many recent actions to list")
    ] = 10,
    agent_timeout: Annotated[
        str, typer.Option("--agent-timeout", help="an agent silent this long is shown silent")
    ] = "90s",
    node: Annotated[
        str | None, typer.Option("--node", help="one node in detail, with the actions on it")
    ] = None,
    show_all: Annotated[
        bool, typer.Option("--all", help="list every node, not only those needing attention")
    ] = False,
    state_dir: StateDirOpt = DEFAULT_STATE_DIR,
    nats: NatsOpt = None,
    config: ConfigOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object")] = False,
) -> None:
    """The fleet: per node GPU health, quarantine, maintenance, isolated pods, energy, idle
    sessions, agents; the breaker, DLQ, credentials, recent actions."""
    import gc

    # A one-shot command: its picture (hundreds of thousands of objects at 5,000 nodes) is
    # never scanned by the cyclic collector, and the interpreter skips its final collection.
    # Off before what it reads with is imported: loading the schemas and nats makes objects
    # enough for several collections that would find nothing to free.
    gc.disable()
    defer_websocket_client()
    from nodeward.cli.status import status as do_status
    from schemas.common import dns_subdomain

    timeout = _duration(agent_timeout, "--agent-timeout")
    assert timeout is not None
    if node is not None:
        try:
            dns_subdomain(node)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--node") from None
    _run(
        do_status(
            settings_for(config, nats, state_dir),
            as_json=as_json,
            actions=actions,
            agent_timeout=timeout,
            state_dir=state_dir,
            node=node,
            show_all=show_all,
        )
    )


@app.command()
def replay(  # noqa: PLR0917 - typer maps parameters to options
    since: Annotated[
        str,
        typer.Option("--since", help="a duration back from now (15m, 2h) or an RFC 3339 time"),
    ],
    subjects: Annotated[
        list[str] | None,
        typer.Option(
            "--subject", help="subject pattern, e.g. 'gpu.health.>' (repeatable; default: all)"
        ),
    ] = None,
    to: Annotated[
        Path | None, typer.Option("--to", help="write the JSON lines to FILE (default: stdout)")
    ] = None,
    state_dir: StateDirOpt = DEFAULT_STATE_DIR,
    nats: NatsOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Export stored events as JSON lines (CloudEvents), up to the streams' current end."""
    defer_websocket_client()
    from nodeward.cli.replay import parse_since
    from nodeward.cli.replay import replay as do_replay

    try:
        start = parse_since(since)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--since") from None
    done: list[int] = []

    async def run() -> None:
        done.append(
            await do_replay(
                settings_for(config, nats, state_dir),
                subjects or [],
                since=start,
                to=to,
                state_dir=state_dir,
            )
        )

    _run(run())
    if to is not None:
        print(f"{done[0]} event(s) written to {to}", file=sys.stderr)


@app.command()
def streams(
    nats: NatsOpt = None,
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
    provision: Annotated[
        bool,
        typer.Option(
            "--provision", help="first create or update every stream (needs $JS.API rights)"
        ),
    ] = False,
    state_dir: StateDirOpt = DEFAULT_STATE_DIR,
) -> None:
    """Messages, bytes, consumers and their lag for every nodeward stream."""
    defer_websocket_client()
    from nodeward.cli.inspect import provision_streams
    from nodeward.cli.inspect import streams as do_streams

    settings = settings_for(config, nats, state_dir)
    if provision:
        _run(provision_streams(settings))
    _run(do_streams(settings, as_json))


@app.command()
def agent(  # noqa: PLR0917 - typer maps parameters to options
    ctx: typer.Context,
    name: Annotated[
        str,
        typer.Argument(
            metavar="NAME",
            help="the agent, e.g. gpu or energy; or keygen: make this node's NATS nkey",
        ),
    ],
    nats: NatsOpt = None,
    config: ConfigOpt = None,
    out: Annotated[
        Path, typer.Option("--out", help="keygen: where the seed goes (mode 0600)")
    ] = Path("/etc/nodeward/agent.nk"),
    force: Annotated[
        bool, typer.Option("--force", help="keygen: replace an existing seed")
    ] = False,
    node: Annotated[
        str | None, typer.Option("--node", help="energy: this node's name (default: NODE_NAME)")
    ] = None,
    ipmi_host: Annotated[
        str | None,
        typer.Option("--ipmi-host", help="energy: the BMC over the LAN (default: /dev/ipmi0)"),
    ] = None,
    ipmi_port: Annotated[
        int | None, typer.Option("--ipmi-port", min=1, max=65535, help="energy: BMC port")
    ] = None,
    ipmi_user: Annotated[str | None, typer.Option("--ipmi-user", help="energy: BMC user")] = None,
    ipmi_password: Annotated[
        str | None,
        typer.Option(
            "--ipmi-password", help="energy: BMC password (prefer --ipmi-password-file or env)"
        ),
    ] = None,
    ipmi_password_file: Annotated[
        Path | None,
        typer.Option("--ipmi-password-file", help="energy: file holding the BMC password"),
    ] = None,
    interval: Annotated[
        float | None,
        typer.Option("--interval", min=0.1, metavar="SECONDS", help="energy: publish interval"),
    ] = None,
    carbon_intensity: Annotated[
        float | None,
        typer.Option(
            "--carbon-intensity",
            min=0,
            metavar="G_PER_KWH",
            help="energy: a static carbon intensity (gCO2e/kWh)",
        ),
    ] = None,
) -> None:
    """Run one node agent on its own (what the DaemonSet runs), or make the node's nkey.

    Every energy flag has an env equivalent: NODEWARD_AGENTS__ENERGY__NODE,
    ..._IPMI__HOST, ..._IPMI__PORT, ..._IPMI__USER, ..._IPMI__PASSWORD,
    ..._IPMI__PASSWORD_FILE, ..._INTERVAL, ..._CARBON__STATIC_G_PER_KWH.
    """
    from nodeward.cli.agent_options import EnergyFlags, apply_energy_flags

    flags = EnergyFlags(
        node,
        ipmi_host,
        ipmi_port,
        ipmi_user,
        ipmi_password,
        ipmi_password_file,
        interval,
        carbon_intensity,
    )
    if flags.given() and name != "energy":
        raise CliError(f"{', '.join(flags.given())}: only for `nodeward agent energy`")
    if ipmi_password_file is not None and not ipmi_password_file.is_file():
        raise CliError(f"--ipmi-password-file {ipmi_password_file} is not a readable file")
    if name == "keygen":
        from nodeward.nats_auth import write_agent_seed

        try:
            public = write_agent_seed(out, force=force)
        except FileExistsError:
            raise CliError(f"{out} exists; --force replaces it (then deploy the new key)") from None
        except OSError as exc:
            raise CliError(f"cannot write {out}: {exc.strerror}") from None
        typer.echo(public)
        return
    settings = settings_for(config, nats)
    apply_energy_flags(settings, flags)
    run_daemon(ctx, "agent", name, settings)


@app.command()
def service(  # noqa: PLR0917 - typer maps parameters to options
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(metavar="NAME", help="the service, e.g. cordon")],
    nats: NatsOpt = None,
    kubeconfig: Annotated[
        Path | None, typer.Option("--kubeconfig", help="default: in-cluster config")
    ] = None,
    reset_breaker: Annotated[
        bool,
        typer.Option(
            "--reset-breaker",
            help="close the circuit breaker without the service, unaudited, then exit (`nodeward breaker reset` is the audited way)",
        ),
    ] = False,
    config: ConfigOpt = None,
) -> None:
    """Run one service on its own (what its Deployment runs), or run an operator command."""
    from nodeward.platform import standalone

    settings = settings_for(config, nats)
    if kubeconfig is not None:
        settings.cluster.kubeconfig = kubeconfig
    if reset_breaker:
        from nodeward.plugin import PluginError

        try:
            command = standalone("service", name).admin.get("reset-breaker")
        except (LookupError, PluginError) as exc:
            raise CliError(str(exc)) from None
        if command is None:
            raise CliError(f"service {name} has no circuit breaker")
        done: list[str] = []

        async def run_admin() -> None:
            done.append(await command(settings))

        _run(run_admin())
        typer.echo(done[0])
        return
    run_daemon(ctx, "service", name, settings)


@app.command("auth-callout")
def auth_callout(
    ctx: typer.Context,
    nats: NatsOpt = None,
    kubeconfig: Annotated[
        Path | None, typer.Option("--kubeconfig", help="default: in-cluster config")
    ] = None,
    config: ConfigOpt = None,
    new_keys: Annotated[
        Path | None,
        typer.Option(
            "--new-keys",
            metavar="DIR",
            help="write a new issuer (account) seed, the callout's own user seed and its "
            "curve seed into DIR (issuer.nk, user.nk, xkey.nk; mode 0600), print their "
            "public keys (the chart's values), and exit",
        ),
    ] = None,
) -> None:
    """Run the NATS auth callout: each component signs in with its ServiceAccount token
    (config section auth_callout; docs/deploying.md)."""
    if new_keys is not None:
        from nodeward.callout.keys import write_keys

        try:
            issuer, user, curve = write_keys(new_keys)
        except FileExistsError as exc:
            raise CliError(f"{exc.filename} exists; keys are never overwritten") from None
        typer.echo(
            f"natsAuth.callout.issuerKey: {issuer}\n"
            f"natsAuth.callout.userKey: {user}\n"
            f"natsAuth.callout.xkey: {curve}"
        )
        return
    from nodeward.callout.service import build

    settings = settings_for(config, nats)
    if kubeconfig is not None:
        settings.cluster.kubeconfig = kubeconfig
    daemon_logging(ctx, settings)
    run_built(ctx, build, settings)


@schemas_app.command("export")
def schemas_export(directory: Annotated[Path, typer.Argument(metavar="DIR")]) -> None:
    """Write a JSON Schema per event type and an index.json into DIR."""
    from nodeward.schemas_export import export

    try:
        written = export(directory)
    except OSError as exc:
        raise CliError(f"cannot write to {directory}: {exc.strerror}") from None
    typer.echo(f"{len(written)} file(s) written to {directory}")


@schemas_app.command("example")
def schemas_example(type_name: Annotated[str, typer.Argument(metavar="TYPE")]) -> None:
    """Print a valid example event of TYPE (structured CloudEvent JSON, fresh id)."""
    from schemas import example_event, to_structured
    from schemas.registry import UnknownEventType

    try:
        event = example_event(type_name)
    except UnknownEventType as exc:
        raise CliError(str(exc)) from None
    typer.echo(json.dumps(to_structured(event), indent=2))


@schemas_app.command("list")
def schemas_list() -> None:
    """Every event type with its stream and subject pattern."""
    from schemas import REGISTRY

    for name, et in sorted(REGISTRY.items()):
        typer.echo(f"{name:<24} {et.stream.name:<12} {et.subject_pattern:<32} {et.description}")


def _kinds(exc: BaseException) -> set[str]:
    # typer has vendored click (typer._click) since 0.29; match click's exception classes
    # by name so this works with either.
    return {cls.__name__ for cls in type(exc).__mro__}


def main(argv: list[str] | None = None) -> int:
    """Entry point: usage errors and failures become one line on stderr and an exit code."""
    command = typer.main.get_command(app)
    try:
        result = command.main(args=argv, prog_name="nodeward", standalone_mode=False)
    except CliError as exc:
        print(f"nodeward: error: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, CliUsageError) else 1
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        from nodeward.config import ConfigError  # loaded already if a command raised it

        if isinstance(exc, ConfigError):
            print(f"nodeward: error: {exc}", file=sys.stderr)
            return 1
        kinds = _kinds(exc)
        if "Exit" in kinds:
            return int(getattr(exc, "exit_code", 0))
        if "Abort" in kinds:
            print("nodeward: aborted", file=sys.stderr)
            return 130
        if "UsageError" in kinds or "ClickException" in kinds:
            ctx = getattr(exc, "ctx", None)
            path = getattr(ctx, "command_path", "nodeward") or "nodeward"
            message = " ".join(exc.format_message().split())  # type: ignore[attr-defined]
            print(f"{path}: error: {message}", file=sys.stderr)
            return int(getattr(exc, "exit_code", 2))
        raise
    # Without standalone mode, `typer.Exit(code)` comes back as the return value.
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
