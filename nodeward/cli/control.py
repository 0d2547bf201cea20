"""Operator controls: `quarantine release|list`, `falco release`, `breaker status|reset`,
`recovery force-drain` (and `maintenance finish|cancel`, in `nodeward.cli.maintenance`).

Each control is a request on `control.<service>.<verb>` that the owning service answers
(`nodeward.bus.control`); the service acts through the remediation kernel, which audits it
with the operator's name and reason. This prints the service's one-line answer; a refusal
or an error exits 1, and no answer says which service did not reply. `list` and `status`
read the services' records in KV as they declare them (`schemas.state`).
"""

from __future__ import annotations

import asyncio
import getpass
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from nodeward.cli.common import bucket_name, connect_nats, echo_json, fail, settings_for
from nodeward.endpoints import DEFAULT_STATE_DIR

if TYPE_CHECKING:  # the bus, the schemas and nats load when a command runs
    from nodeward.config import Settings
    from schemas.control import ControlReply
    from schemas.state import Bucket
    from schemas.state.breaker import BreakerState
    from schemas.state.cordon import NodeRecord

quarantine_app = typer.Typer(
    help="GPU quarantines: list them, release one nodeward applied.", no_args_is_help=True
)
breaker_app = typer.Typer(
    help="The circuit breaker on removing nodes from service: status, reset.",
    no_args_is_help=True,
)
falco_app = typer.Typer(
    help="Falco response: lift an isolation nodeward applied.", no_args_is_help=True
)
recovery_app = typer.Typer(
    help="GPU recovery: force a blocked drain past its disruption budgets.", no_args_is_help=True
)

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")

NatsOpt = Annotated[
    str | None,
    typer.Option("--nats", envvar="NODEWARD_NATS_URL", help="NATS URL (default: a running `up`)"),
]
ConfigOpt = Annotated[Path | None, typer.Option("--config", help="YAML config file")]
StateDirOpt = Annotated[
    Path, typer.Option("--state-dir", help="where a running `nodeward up` wrote endpoints.json")
]
JsonOpt = Annotated[bool, typer.Option("--json", help="one JSON object")]
ReasonOpt = Annotated[str, typer.Option("--reason", help="why (required; it is audited)")]
OperatorOpt = Annotated[
    str | None,
    typer.Option("--operator", help="who asks, for the audit record (default: the login user)"),
]
TimeoutOpt = Annotated[
    float, typer.Option("--timeout", min=0.1, help="seconds to wait for the service's answer")
]


def node_name(node: str) -> str:
    """A NODE argument: a Kubernetes node name."""
    if len(node) > 253 or not _DNS_SUBDOMAIN.match(node):
        raise typer.BadParameter(f"{node!r} is not a Kubernetes node name", param_hint="NODE")
    return node


def pod_ref(pod: str) -> str:
    """A NAMESPACE/POD argument."""
    namespace, _, name = pod.partition("/")
    if not name or not _DNS_LABEL.match(namespace) or not _DNS_SUBDOMAIN.match(name):
        raise typer.BadParameter(f"{pod!r} is not NAMESPACE/POD", param_hint="NAMESPACE/POD")
    return pod


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


async def send(  # noqa: PLR0917 - one control, all its parts
    settings: Settings,
    service: str,
    verb: str,
    target: str | None,
    operator: str | None,
    reason: str,
    timeout: float,
    as_json: bool,
    state_dir: Path = DEFAULT_STATE_DIR,
) -> ControlReply:
    """Send one control request, print the service's answer; exit 1 unless it is ok."""
    from pydantic import ValidationError

    from nodeward.bus.control import request
    from nodeward.bus.errors import BusError
    from schemas.cloudevents import one_line
    from schemas.control import ControlRequest, ControlStatus

    try:
        req = ControlRequest(
            service=service,
            verb=verb,
            operator=operator_name(operator),
            reason=reason,
            target=target,
        )
    except ValidationError as exc:
        fail(f"invalid request: {one_line(exc)}")
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
) -> None:
    """What each control command does with its options: `send` the request to `service`."""
    settings = settings_for(config, nats, state_dir)
    asyncio.run(
        send(
            settings,
            service,
            verb,
            target,
            operator,
            require_reason(reason),
            timeout,
            as_json,
            state_dir,
        )
    )


async def _records(
    settings: Settings, bucket: Bucket[Any], name: str, state_dir: Path
) -> dict[str, Any]:
    """Every record of `bucket`'s kind, by key suffix (none when the bucket is missing)."""
    from nats.js.errors import BucketNotFoundError, KeyNotFoundError, NoKeysError, NotFoundError

    nc = await connect_nats(settings, "cli/nodeward", state_dir)
    try:
        js = nc.jetstream()
        try:
            kv = await js.key_value(name)
            keys = await kv.keys()
        except (BucketNotFoundError, NotFoundError, NoKeysError):
            return {}
        out: dict[str, Any] = {}
        for key in keys:
            if not bucket.holds(key):
                continue
            try:
                entry = await kv.get(key)
            except KeyNotFoundError:
                continue
            if entry.value:
                out[bucket.suffix(key)] = bucket.load(entry.value)
        return out
    finally:
        await nc.close()


def _at(ts: float | datetime | None) -> str:
    if ts is None:
        return "-"
    when = ts if isinstance(ts, datetime) else datetime.fromtimestamp(ts, UTC)
    return f"{when:%Y-%m-%d %H:%M:%S} UTC"


def quarantine_lines(records: dict[str, NodeRecord]) -> list[str]:
    """One line per node with a quarantine or an operator's release."""
    lines = []
    for node, record in sorted(records.items()):
        q = record.quarantine
        if q is not None:
            marks = ", ".join(
                [*(f"taint {e}" for e in q.taints), *(["cordoned"] if q.cordoned else [])]
            )
            state: str = "dry run" if q.dry_run else q.phase
            if q.operator_released:
                state += ", taken back by hand"
            lines.append(
                f"{node:<28} quarantined since {_at(q.started_at)} [{q.rule}] ({state}) "
                f"GPUs {', '.join(q.gpus)}; {marks or 'no marks'}; incident {q.incident}"
            )
        elif record.operator_release is not None:
            r = record.operator_release
            lines.append(
                f"{node:<28} released by operator {r.operator} at {_at(r.at)} from incident "
                f"{r.incident}: {r.reason or '-'}"
            )
    return lines


@quarantine_app.command("release")
def quarantine_release(  # noqa: PLR0917 - typer maps parameters to options
    node: Annotated[str, typer.Argument(metavar="NODE", callback=node_name)],
    reason: ReasonOpt,
    operator: OperatorOpt = None,
    timeout: TimeoutOpt = 10.0,
    state_dir: StateDirOpt = DEFAULT_STATE_DIR,
    nats: NatsOpt = None,
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Undo nodeward's quarantine of NODE (taint, cordon, label, condition); refuses a node
    nodeward did not quarantine."""
    ask(
        "cordon",
        "release",
        node,
        reason=reason,
        operator=operator,
        timeout=timeout,
        as_json=as_json,
        state_dir=state_dir,
        nats=nats,
        config=config,
    )


@quarantine_app.command("list")
def quarantine_list(
    state_dir: StateDirOpt = DEFAULT_STATE_DIR,
    nats: NatsOpt = None,
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Every node nodeward holds in quarantine (and those an operator released)."""
    from schemas.state.cordon import NODES

    settings = settings_for(config, nats, state_dir)
    records: dict[str, NodeRecord] = asyncio.run(
        _records(settings, NODES, bucket_name(settings, "cordon", NODES), state_dir)
    )
    held = {n: r for n, r in records.items() if r.quarantine or r.operator_release}
    if as_json:
        echo_json({n: r.model_dump(mode="json", exclude={"gpus"}) for n, r in sorted(held.items())})
        return
    lines = quarantine_lines(held)
    for line in lines or ["no node is quarantined by nodeward"]:
        typer.echo(line)


def breaker_line(state: BreakerState) -> str:
    """The breaker in one line."""
    admitted = ", ".join(sorted(state.admitted)) or "none"
    if state.tripped_at is None:
        return f"circuit breaker closed; admitted in its window: {admitted}"
    return (
        f"circuit breaker TRIPPED at {_at(state.tripped_at)}: {state.trip_reason or '-'}; "
        f"admitted in its window: {admitted}; `nodeward breaker reset --reason R` closes it"
    )


@breaker_app.command("status")
def breaker_status(
    state_dir: StateDirOpt = DEFAULT_STATE_DIR,
    nats: NatsOpt = None,
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Whether the shared circuit breaker is tripped, and what it admitted in its window."""
    from schemas.state.breaker import SHARED, BreakerState

    settings = settings_for(config, nats, state_dir)
    cordon = settings.services.get("cordon") or {}
    name = str((cordon.get("breaker") or {}).get("bucket") or SHARED.name)
    found = asyncio.run(_records(settings, SHARED, name, state_dir))
    state = found.get("", BreakerState())
    if as_json:
        typer.echo(state.model_dump_json())
    else:
        typer.echo(breaker_line(state))


@breaker_app.command("reset")
def breaker_reset(  # noqa: PLR0917 - typer maps parameters to options
    reason: ReasonOpt,
    operator: OperatorOpt = None,
    timeout: TimeoutOpt = 10.0,
    state_dir: StateDirOpt = DEFAULT_STATE_DIR,
    nats: NatsOpt = None,
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Close a tripped circuit breaker (the cordon service answers; audited)."""
    ask(
        "cordon",
        "reset-breaker",
        None,
        reason=reason,
        operator=operator,
        timeout=timeout,
        as_json=as_json,
        state_dir=state_dir,
        nats=nats,
        config=config,
    )


@falco_app.command("release")
def falco_release(  # noqa: PLR0917 - typer maps parameters to options
    pod: Annotated[str, typer.Argument(metavar="NAMESPACE/POD", callback=pod_ref)],
    reason: ReasonOpt,
    operator: OperatorOpt = None,
    timeout: TimeoutOpt = 10.0,
    state_dir: StateDirOpt = DEFAULT_STATE_DIR,
    nats: NatsOpt = None,
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Lift the network isolation nodeward put on a pod; refuses one it did not isolate."""
    ask(
        "falco",
        "release",
        pod,
        reason=reason,
        operator=operator,
        timeout=timeout,
        as_json=as_json,
        state_dir=state_dir,
        nats=nats,
        config=config,
    )


@recovery_app.command("force-drain")
def recovery_force_drain(  # noqa: PLR0917 - typer maps parameters to options
    node: Annotated[str, typer.Argument(metavar="NODE", callback=node_name)],
    reason: ReasonOpt,
    operator: OperatorOpt = None,
    timeout: TimeoutOpt = 30.0,
    state_dir: StateDirOpt = DEFAULT_STATE_DIR,
    nats: NatsOpt = None,
    config: ConfigOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Delete the pods a PodDisruptionBudget keeps on NODE, whose recovery is blocked on its
    drain (nodeward never does on its own); exempt pods and pods Falco isolated stay."""
    ask(
        "recovery",
        "force-drain",
        node,
        reason=reason,
        operator=operator,
        timeout=timeout,
        as_json=as_json,
        state_dir=state_dir,
        nats=nats,
        config=config,
    )
