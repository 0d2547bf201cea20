"""What a service's operator commands share: their options, the checks on their arguments,
the bus from the command line's settings, and the operator controls themselves.

A control is a request on `control.<service>.<verb>` that the owning service answers
(`nodeward.bus.control`); the service acts through the remediation kernel, which audits it
with the operator's name and reason. `send` prints the service's one-line answer; a
refusal or an error exits 1, and no answer says which service did not reply. `control`
makes such a command whole (`@control("cordon", "release", "NODE")` over a function that
names it and says what it does). `records` and `kv_records` read a service's records in KV
as the service declares them (`schemas.state`); `connect_bus` gives a command the bus.

Each service's commands live in its own folder (`services/<name>/cli.py`) and are found
through their plugins (`nodeward.cli.plugins`); this module names
none of them. Typer only at import: the bus, the schemas and nats load when a command runs.
"""

from __future__ import annotations

import asyncio
import getpass
import inspect
import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import typer

from nodeward.cli.common import connect_nats, fail, settings_for
from nodeward.cli.options import ConfigOpt, JsonObjectOpt, NatsOpt, StateDirOpt
from nodeward.endpoints import DEFAULT_STATE_DIR

if TYPE_CHECKING:  # the bus, the schemas and nats load when a command runs
    from collections.abc import Callable, Sequence

    from nodeward.bus import Bus
    from nodeward.config import Settings
    from schemas.control import ControlReply, ControlRequest
    from schemas.state import Bucket

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")

ReasonOpt = Annotated[str, typer.Option("--reason", help="why (required; it is audited)")]
OperatorOpt = Annotated[
    str | None,
    typer.Option("--operator", help="who asks, for the audit record (default: the login user)"),
]
TimeoutOpt = Annotated[
    float, typer.Option("--timeout", min=0.1, help="seconds to wait for the service's answer")
]


def node_name(node: str) -> str:
    """A NODE argument: a Kubernetes node name (a typer callback)."""
    if len(node) > 253 or not _DNS_SUBDOMAIN.match(node):
        raise typer.BadParameter(f"{node!r} is not a Kubernetes node name", param_hint="NODE")
    return node


def checked_pod(pod: str, hint: str) -> str:
    """`pod` if it is NAMESPACE/POD, else a usage error naming the argument `hint`."""
    namespace, _, name = pod.partition("/")
    if not name or not _DNS_LABEL.match(namespace) or not _DNS_SUBDOMAIN.match(name):
        raise typer.BadParameter(f"{pod!r} is not NAMESPACE/POD", param_hint=hint)
    return pod


def pod_ref(pod: str) -> str:
    """A NAMESPACE/POD argument (a typer callback)."""
    return checked_pod(pod, "NAMESPACE/POD")


NodeArg = Annotated[str, typer.Argument(metavar="NODE", callback=node_name)]
PodArg = Annotated[str, typer.Argument(metavar="NAMESPACE/POD", callback=pod_ref)]
Target = Literal["NODE", "NAMESPACE/POD"]
_TARGETS = {"NODE": NodeArg, "NAMESPACE/POD": PodArg}


def operator_name(given: str | None) -> str:
    """`--operator`, else the login user."""
    if given:
        return given
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        fail("cannot tell who you are: pass --operator NAME")


def require_reason(reason: str) -> str:
    """`--reason`, which must say something."""
    if not reason.strip():
        raise typer.BadParameter("say why: it goes into the audit record", param_hint="--reason")
    return reason


async def connect_bus(settings: Settings) -> Bus:
    """The bus for a one-shot command, as the settings say, provisioning nothing; failing,
    one line."""
    from nodeward.bus import Bus, BusError

    settings.bus.provision = False
    try:
        return await Bus.connect(settings.bus, source="cli/nodeward", wait=False)
    except BusError as exc:
        fail(str(exc))


async def send(
    settings: Settings, req: ControlRequest, timeout: float, as_json: bool, state_dir: Path
) -> ControlReply:
    """Send one control request, print the service's answer; exit 1 unless it is ok."""
    from nodeward.bus.control import request
    from nodeward.bus.errors import BusError
    from schemas.control import ControlStatus

    service, verb = req.service, req.verb
    nc = await connect_nats(settings, f"cli/nodeward/{verb}", state_dir)
    try:
        reply = await request(nc, req, timeout=timeout)
    except BusError as exc:
        fail(str(exc))
    finally:
        await nc.close()
    if as_json:
        typer.echo(reply.model_dump_json())
    elif reply.status == ControlStatus.OK:
        typer.echo(reply.message)
    else:
        said = reply.message.startswith(("refused", "skipped"))
        status = "" if said else f"{reply.status.value}: "
        typer.echo(f"nodeward: {service}: {status}{reply.message}", err=True)
    if reply.status != ControlStatus.OK:
        raise typer.Exit(1)
    return reply


def ask(
    service: str,
    verb: str,
    target: str | None,
    *,
    reason: str,
    operator: str | None,
    timeout: float,
    as_json: bool,
    state_dir: Path,
    nats: str | None,
    config: Path | None,
    options: dict[str, str] | None = None,
) -> None:
    """What each control command does with its options (and the verb's own `options`):
    `send` the request to `service`."""
    from pydantic import ValidationError

    from schemas.cloudevents import one_line
    from schemas.control import ControlRequest

    settings = settings_for(config, nats, state_dir)
    try:
        req = ControlRequest(
            service=service,
            verb=verb,
            operator=operator_name(operator),
            reason=require_reason(reason),
            target=target,
            options=options or {},
        )
    except ValidationError as exc:
        fail(f"invalid request: {one_line(exc)}")
    asyncio.run(send(settings, req, timeout, as_json, state_dir))


def control(
    service: str, verb: str, target: Target | None = None, *, timeout: float = 10.0
) -> Callable[[Callable[[], None]], Callable[..., None]]:
    """A command that `ask`s `service` for `verb`: on a NODE, a NAMESPACE/POD, or on
    nothing, with the options every control takes (`--reason`, `--operator`, `--timeout`,
    default `timeout` seconds, the bus's, `--json`). The function it decorates gives the
    command its name and its help; register what it returns (`app.command("release")`)."""
    default_timeout = timeout

    def make(described: Callable[[], None]) -> Callable[..., None]:
        def command(
            target: str | None = None,
            *,
            reason: ReasonOpt,
            operator: OperatorOpt = None,
            timeout: TimeoutOpt = default_timeout,
            state_dir: StateDirOpt = DEFAULT_STATE_DIR,
            nats: NatsOpt = None,
            config: ConfigOpt = None,
            as_json: JsonObjectOpt = False,
        ) -> None:
            ask(
                service,
                verb,
                target,
                reason=reason,
                operator=operator,
                timeout=timeout,
                as_json=as_json,
                state_dir=state_dir,
                nats=nats,
                config=config,
            )

        # What typer reads: the target argument as `target` says (or none), then the options.
        signature = inspect.signature(command, eval_str=True)
        first, *options = signature.parameters.values()
        if target is not None:
            options.insert(0, first.replace(annotation=_TARGETS[target], default=first.empty))
        command.__signature__ = signature.replace(parameters=options)  # type: ignore[attr-defined]
        for attribute in ("__module__", "__name__", "__qualname__", "__doc__"):
            setattr(command, attribute, getattr(described, attribute))
        return command

    return make


async def kv_records(nc: Any, name: str, kinds: Sequence[Bucket[Any]]) -> list[tuple[str, Any]]:
    """Every record of the `kinds` in the KV bucket `name`, each with its key's suffix, read
    in one pass (`nodeward.bus.snapshot.kv_entries`); none when the bucket is missing."""
    from nodeward.bus.snapshot import kv_entries

    entries = await kv_entries(nc, name, [kind.prefix for kind in kinds]) or {}
    out = []
    for key, raw in sorted(entries.items()):
        kind = next((b for b in kinds if b.holds(key)), None)
        if kind is not None and raw:
            out.append((kind.suffix(key), kind.load(raw)))
    return out


async def records(
    settings: Settings, bucket: Bucket[Any], name: str, state_dir: Path
) -> dict[str, Any]:
    """Every record of `bucket`'s kind in the KV bucket `name`, by key suffix (none when the
    bucket is missing)."""
    nc = await connect_nats(settings, "cli/nodeward", state_dir)
    try:
        return dict(await kv_records(nc, name, [bucket]))
    finally:
        await nc.close()
