"""The maintenance service's commands: `nodeward maintenance start|status|restore|finish|
cancel`: ask for a node's maintenance, follow it, restore a pod, end it. Named in its
plugin (`services.maintenance.SERVICE`).

`start` validates the request at the edge (node name, times, and the node's existence: in
the cluster when a kubeconfig is at hand, else among the nodes whose agents speak on the
bus) before it publishes `maintenance.requested`, and waits a little for the
checkpoint service to take it or refuse it. `status` and `restore` read the service's
records in KV as it declares them (`services.maintenance.state`); `restore` prints the plan
(`services.maintenance.restore.restore_plan`) to turn a pod's checkpoint archives into images
and run the pod elsewhere (it executes nothing). `finish` and `cancel` are operator
controls (`nodeward.cli.controls`): requests the checkpoint service answers and audits.
Typer only at import: the bus, the schemas, nats and yaml load when a command runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from nodeward.cli.common import bucket_name, echo_json, fail, settings_for
from nodeward.cli.controls import (
    NodeArg,
    OperatorOpt,
    TimeoutOpt,
    ask,
    checked_pod,
    connect_bus,
    control,
    kv_records,
    node_name,
    operator_name,
)
from nodeward.cli.options import ConfigOpt, JsonObjectOpt, NatsOpt, StateDirOpt
from nodeward.durations import parse_duration
from nodeward.endpoints import DEFAULT_STATE_DIR, Endpoints

if TYPE_CHECKING:  # the bus, the schemas, nats and yaml load when a command runs
    from nodeward.bus import Bus
    from nodeward.config import Settings
    from services.maintenance.state import MaintenanceState, PodPlan

maintenance_app = typer.Typer(
    help="Node maintenance: warn owners, cordon, checkpoint opted-in pods, drain; restore plans.",
    no_args_is_help=True,
)


def parse_at(value: str | None, now: datetime) -> datetime | None:
    """`--at`: an ISO 8601 time (UTC if no zone), or a duration from now (`10m`)."""
    if value is None or value == "now":
        return None
    try:
        return now + parse_duration(value)
    except ValueError:
        pass
    try:
        at = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise typer.BadParameter(
            f"{value!r} is neither a time (2026-12-01T18:00:00Z) nor a duration (10m)",
            param_hint="--at",
        ) from None
    return at if at.tzinfo else at.replace(tzinfo=UTC)


def _bucket(settings: Settings) -> str:
    from services.maintenance.state import MAINTENANCES

    return bucket_name(settings, "checkpoint", MAINTENANCES)


async def _check_node(kubeconfig: Path, node: str) -> None:
    from nodeward.config import ClusterSettings
    from nodeward.kube import Cluster, KubeError, NotFound

    cluster = Cluster.connect(ClusterSettings(kubeconfig=kubeconfig, retries=1))
    try:
        await cluster.nodes.get(node)
    except NotFound:
        fail(f"no node named {node} in the cluster of {kubeconfig}")
    except KubeError as exc:
        fail(f"cannot read node {node} from {kubeconfig}: {exc}")
    finally:
        await cluster.close()


def default_kubeconfig() -> Path | None:
    """The kubeconfig kubectl would use: the first file of `KUBECONFIG` that exists, else
    `~/.kube/config` if it exists."""
    listed = [Path(p) for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    for path in [*listed, Path.home() / ".kube" / "config"]:
        if path.is_file():
            return path
    return None


async def _check_node_on_bus(bus: Bus, node: str) -> None:
    """Without a cluster to ask: the node must be one whose agents speak on the bus (its
    last GPU heartbeat or energy interval is stored), else the request is refused."""
    from nats.errors import TimeoutError as NatsTimeout
    from nats.js.errors import NotFoundError

    from schemas.tokens import token

    for stream, subject in (
        ("HEARTBEATS", f"gpu.heartbeat.{token(node)}"),
        ("ENERGY", f"energy.node.{token(node)}"),
    ):
        # With bus.partitions > 1 the stream stores it with the partition appended.
        for stored in (subject, f"{subject}.*"):
            with contextlib.suppress(NotFoundError, NatsTimeout):
                await bus.js.get_last_msg(stream, stored)
                return
    fail(
        f"no node named {node} is known: no agent of it on the bus, and no kubeconfig to ask "
        "the cluster (--kubeconfig, KUBECONFIG or ~/.kube/config)"
    )


async def _state(bus: Bus, bucket: str, node: str) -> MaintenanceState | None:
    from nats.js.errors import BucketNotFoundError, KeyNotFoundError, NotFoundError

    from services.maintenance.state import MAINTENANCES

    try:
        kv = await bus.js.key_value(bucket)
        entry = await kv.get(MAINTENANCES.key(node))
    except (BucketNotFoundError, NotFoundError, KeyNotFoundError):
        return None
    if entry.value is None:
        return None
    return MAINTENANCES.load(entry.value)


async def _refusal(bus: Bus, node: str, maintenance_id: str) -> str | None:
    """The error of a `maintenance.failed` the service published for this request, if any."""
    from nats.js.errors import NotFoundError

    from schemas import decode
    from schemas.maintenance import Maintenance
    from schemas.tokens import token

    subject = f"maintenance.failed.{token(node)}"
    found = []
    # With bus.partitions > 1 the stream stores it with the partition appended.
    for stored in (subject, f"{subject}.*"):
        with contextlib.suppress(NotFoundError):
            found.append(await bus.js.get_last_msg("MAINTENANCE", stored))
    if not found:
        return None
    msg = max(found, key=lambda m: m.seq or 0)
    try:
        event = decode(msg.subject or "", msg.headers or {}, msg.data or b"")
    except Exception:  # noqa: BLE001 - an undecodable event is not this request's answer
        return None
    data = event.data
    if isinstance(data, Maintenance) and data.maintenance_id == maintenance_id:
        return data.error or "failed"
    return None


async def start(  # noqa: PLR0917 - the command's options
    settings: Settings,
    node: str,
    reason: str,
    at: str | None,
    deadline: str | None,
    wait: float,
    kubeconfig: Path | None,
    state_dir: Path,
    as_json: bool,
    *,
    requested_by: str,
    move: bool = False,
) -> None:
    """Validate, publish `maintenance.requested` as asked by `requested_by` (the operator,
    named as the operator controls name them), and wait a little for the answer."""
    from pydantic import ValidationError

    from nodeward.bus import PublishError
    from schemas import make_event
    from schemas.cloudevents import one_line
    from schemas.maintenance import Maintenance, MaintenancePhase

    now = datetime.now(UTC)
    start_at = parse_at(at, now)
    deadline_s = None
    if deadline is not None:
        try:
            deadline_s = parse_duration(deadline).total_seconds()
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--deadline") from None
        if deadline_s <= 0:
            raise typer.BadParameter("must be longer than 0s", param_hint="--deadline")
    if kubeconfig is None:
        running = Endpoints.read(state_dir)
        kubeconfig = running.kubeconfig if running else default_kubeconfig()
    if kubeconfig is not None:
        await _check_node(kubeconfig, node)
    maintenance_id = f"mnt-{now:%Y%m%dT%H%M%S}-{node}"
    try:
        data = Maintenance(
            node=node,
            phase=MaintenancePhase.REQUESTED,
            maintenance_id=maintenance_id,
            reason=reason,
            requested_by=requested_by,
            start_at=start_at,
            deadline_s=deadline_s,
            move=move,
        )
    except ValidationError as exc:
        fail(f"invalid request: {one_line(exc)}")
    bus = await connect_bus(settings)
    try:
        if kubeconfig is None:  # validated before anything is published
            await _check_node_on_bus(bus, node)
        try:
            await bus.publish(make_event(data, source="cli/nodeward"))
        except PublishError as exc:
            fail(f"not published: {exc}")
        accepted = await _await_answer(bus, _bucket(settings), node, maintenance_id, wait)
    finally:
        await bus.close(grace=1)
    if as_json:
        echo_json({"maintenance_id": maintenance_id, "node": node, "accepted": accepted})
        return
    when = f"at {start_at:%Y-%m-%d %H:%M:%S} UTC" if start_at else "now"
    if accepted:
        typer.echo(f"maintenance {maintenance_id} of {node} accepted; starts {when}")
        typer.echo(f"follow it: nodeward maintenance status {node}")
    else:
        typer.echo(
            f"maintenance {maintenance_id} of {node} requested; the checkpoint service has not "
            f"taken it within {wait:g}s (is `nodeward service checkpoint` running?)"
        )


async def _await_answer(bus: Bus, bucket: str, node: str, maintenance_id: str, wait: float) -> bool:
    end = time.monotonic() + wait
    while True:
        state = await _state(bus, bucket, node)
        if state is not None and state.maintenance_id == maintenance_id:
            return True
        refused = await _refusal(bus, node, maintenance_id)
        if refused is not None:
            fail(f"maintenance of {node} refused: {refused}")
        if time.monotonic() >= end:
            return False
        await asyncio.sleep(0.2)


def _pod_line(plan: PodPlan) -> str:
    archives = ", ".join(c.checkpoint_image or c.path or "?" for c in plan.checkpoints)
    detail = archives or plan.reason or ""
    if plan.move is not None and plan.move.stage == "failed" and plan.status == "checkpointed":
        detail = plan.move.reason or detail
    return f"  {plan.key:<48} {plan.shown:<19} {detail}"


def render_status(state: MaintenanceState) -> list[str]:
    from schemas.maintenance import MaintenancePhase

    deadline = state.deadline_at()
    lines = [
        f"maintenance {state.maintenance_id} of {state.node}: {state.phase.value}"
        + (" (dry run)" if state.dry_run else ""),
        f"  reason: {state.reason or '-'}; requested by {state.requested_by or '-'} at "
        f"{state.requested_at:%Y-%m-%d %H:%M:%S} UTC",
        f"  starts: {state.start_at:%Y-%m-%d %H:%M:%S} UTC; deadline: "
        + (
            f"{deadline:%Y-%m-%d %H:%M:%S} UTC"
            if deadline
            else f"{state.deadline_s:g}s after start"
        ),
        f"  cordon: {'by nodeward' if state.cordoned else 'not by nodeward'}"
        + (" (it was cordoned before)" if state.prior_unschedulable else ""),
    ]
    if state.pods:
        lines.append("  pods:")
        lines += [_pod_line(p) for p in sorted(state.pods.values(), key=lambda p: p.key)]
    if state.failures:
        lines.append("  failures:")
        lines += [f"    {f}" for f in state.failures]
    if state.error:
        lines.append(f"  error: {state.error}")
    if state.ended_by:
        done = "cancelled" if state.phase == MaintenancePhase.CANCELLED else "finished"
        lines.append(f"  {done} by operator {state.ended_by}")
    return lines


async def status(settings: Settings, node: str, as_json: bool) -> None:
    bus = await connect_bus(settings)
    try:
        state = await _state(bus, _bucket(settings), node)
    finally:
        await bus.close(grace=1)
    if state is None:
        fail(f"no maintenance recorded for node {node}")
    if as_json:
        typer.echo(state.model_dump_json())
        return
    for line in render_status(state):
        typer.echo(line)


async def _states(bus: Bus, bucket: str) -> list[MaintenanceState]:
    """Every maintenance in the bucket: the running ones and the finished."""
    from services.maintenance.state import HISTORY, MAINTENANCES

    return [state for _, state in await kv_records(bus.nc, bucket, [MAINTENANCES, HISTORY])]


def render_restore(plan: dict[str, Any]) -> str:
    import yaml

    lines = [
        f"# Restore plan for {plan['pod']} (maintenance {plan['maintenance_id']}, "
        f"checkpointed on {plan['node']})",
        "",
    ]
    for i, build in enumerate(plan["builds"], 1):
        lines.append(
            f"# {i}. Container {build['container']}: on node {build['node']}, build an image "
            f"from {build['archive']}"
        )
        lines += build["commands"]
        lines.append(f"#    or: {build['alternative']}")
        lines.append("")
    lines.append("# Then run the pod from the checkpoint images on another node:")
    lines.append("kubectl apply -f - <<'EOF'")
    lines.append(yaml.safe_dump(plan["manifest"], sort_keys=False).rstrip())
    lines.append("EOF")
    lines.append("")
    lines += [f"# Note: {n}" for n in plan["notes"]]
    return "\n".join(lines)


async def restore(settings: Settings, pod: str, registry: str, as_json: bool) -> None:
    from services.maintenance.restore import restorable, restore_plan

    checked_pod(pod, "POD")
    bus = await connect_bus(settings)
    try:
        states = await _states(bus, _bucket(settings))
    finally:
        await bus.close(grace=1)
    found = restorable(states, pod)
    if isinstance(found, str):
        fail(found)
    state, plan = found
    result = restore_plan(state, plan, registry)
    if as_json:
        echo_json(result)
    else:
        typer.echo(render_restore(result))


@maintenance_app.command("start")
def start_command(  # noqa: PLR0917 - typer maps parameters to options
    node: NodeArg,
    reason: Annotated[str, typer.Option("--reason", help="why (owners are told)")] = "",
    at: Annotated[
        str | None,
        typer.Option("--at", help="when the work starts: a time (2026-12-01T18:00:00Z) or 10m"),
    ] = None,
    deadline: Annotated[
        str | None,
        typer.Option("--deadline", help="every pod gone this long after the start (e.g. 30m)"),
    ] = None,
    wait: Annotated[
        float, typer.Option("--wait", min=0, help="seconds to wait for the service's answer")
    ] = 10.0,
    kubeconfig: Annotated[
        Path | None,
        typer.Option(
            "--kubeconfig",
            help="check the node exists (default: a running `up`'s, else KUBECONFIG or "
            "~/.kube/config; without any, the node must have agents on the bus)",
        ),
    ] = None,
    move: Annotated[
        bool,
        typer.Option(
            "--move",
            help="restore the opted-in pods (annotation nodeward.io/move=true on the pod or "
            "its namespace) on other nodes instead of evicting them",
        ),
    ] = False,
    operator: OperatorOpt = None,
    state_dir: StateDirOpt = DEFAULT_STATE_DIR,
    nats: NatsOpt = None,
    config: ConfigOpt = None,
    as_json: JsonObjectOpt = False,
) -> None:
    """Request a node's maintenance: owners warned, cordon, checkpoints (and with --move
    a restore elsewhere), drain."""
    asyncio.run(
        start(
            settings_for(config, nats, state_dir),
            node,
            reason,
            at,
            deadline,
            wait,
            kubeconfig,
            state_dir,
            as_json,
            requested_by=operator_name(operator),
            move=move,
        )
    )


@maintenance_app.command("status")
def status_command(
    node: NodeArg,
    state_dir: StateDirOpt = DEFAULT_STATE_DIR,
    nats: NatsOpt = None,
    config: ConfigOpt = None,
    as_json: JsonObjectOpt = False,
) -> None:
    """Where a node's (latest) maintenance stands: phase, pods, checkpoints, failures."""
    asyncio.run(status(settings_for(config, nats, state_dir), node, as_json))


ToOpt = Annotated[
    str | None, typer.Option("--to", help="the node to restore it on (default: where it fits)")
]
PlanOpt = Annotated[
    bool, typer.Option("--plan", help="print the restore plan (image builds, manifest); do nothing")
]
RegistryOpt = Annotated[
    str, typer.Option("--registry", help="with --plan: where the images are pushed")
]
ReasonUnlessPlanOpt = Annotated[str, typer.Option("--reason", help="why (required unless --plan)")]


@maintenance_app.command("restore")
def restore_command(  # noqa: PLR0917 - typer maps parameters to options
    pod: Annotated[str, typer.Argument(metavar="POD", help="NAMESPACE/NAME")],
    to: ToOpt = None,
    plan: PlanOpt = False,
    registry: RegistryOpt = "localhost/checkpoints",
    reason: ReasonUnlessPlanOpt = "",
    operator: OperatorOpt = None,
    timeout: TimeoutOpt = 600.0,
    state_dir: StateDirOpt = DEFAULT_STATE_DIR,
    nats: NatsOpt = None,
    config: ConfigOpt = None,
    as_json: JsonObjectOpt = False,
) -> None:
    """Run a checkpointed pod again from its newest checkpoint images (built and pushed
    first if need be), on --to NODE or where it fits, through the checkpoint service;
    --plan prints the plan instead."""
    if plan:
        asyncio.run(restore(settings_for(config, nats, state_dir), pod, registry, as_json))
        return
    checked_pod(pod, "POD")
    if to is not None:
        node_name(to)
    ask("checkpoint", "restore", pod, reason=reason, operator=operator, timeout=timeout,
        as_json=as_json, state_dir=state_dir, nats=nats, config=config,
        options={"to": to} if to else None)  # fmt: skip


@maintenance_app.command("finish")
@control("checkpoint", "finish", "NODE")
def finish_command() -> None:
    """The work is over: uncordon NODE if nodeward cordoned it for the maintenance."""


@maintenance_app.command("cancel")
@control("checkpoint", "cancel", "NODE")
def cancel_command() -> None:
    """Stop NODE's maintenance before its drain (nodeward's cordon comes off); after the
    drain began, it says what was already done."""
