"""What `nodeward report` does: energy, CO2e and GPU-hours per namespace, owner, node, GPU
model, group or experiment, from the accounting service's rollups (KV bucket `accounting`),
summed by `services.accounting.report`; group and experiment from the namespaces' directory
labels, read from the cluster (`--config`'s `cluster`, else the sim cluster of a running
`nodeward up`).

The command itself is `services.accounting.cli`; this loads nats and the schemas, when the
command runs."""

from __future__ import annotations

import contextlib
from datetime import datetime
from pathlib import Path
from typing import Any

import typer
from pydantic import ValidationError

from nodeward.bus.snapshot import kv_entries
from nodeward.cli.common import bucket_name, connect_nats, fail, table_console
from nodeward.config import Settings
from nodeward.endpoints import Endpoints
from schemas.directory import NamespaceOwner
from schemas.state import Bucket
from services.accounting.report import (
    BY_DIRECTORY,
    By,
    Row,
    Window,
    build,
    gap_text,
    to_csv,
    to_json,
)
from services.accounting.state import IDLE, NODE_HOURS, USAGE

FORMATS = ("table", "csv", "json")


def _load(bucket: Bucket[Any], entries: dict[str, bytes]) -> list[Any]:
    out = []
    for key, raw in entries.items():
        if bucket.holds(key):
            with contextlib.suppress(ValidationError):
                out.append(bucket.load(raw))
    return out


async def read_rollups(
    settings: Settings, state_dir: Path
) -> tuple[list[Any], list[Any], list[Any]]:
    """The usage cells, node hours and idle periods in the accounting bucket."""
    bucket = bucket_name(settings, "accounting", USAGE)
    nc = await connect_nats(settings, "cli/report", state_dir)
    try:
        entries = await kv_entries(nc, bucket, [USAGE.prefix, NODE_HOURS.prefix, IDLE.prefix])
    finally:
        with contextlib.suppress(Exception):
            await nc.close()
    if entries is None:
        fail(
            f"no accounting bucket {bucket!r}: the accounting service has not run yet "
            "(nodeward up runs it; nodeward service accounting alone)"
        )
    return _load(USAGE, entries), _load(NODE_HOURS, entries), _load(IDLE, entries)


async def read_owners(settings: Settings, state_dir: Path) -> dict[str, NamespaceOwner]:
    """Each namespace's owner as the directory labelled it, listed from the cluster: the
    config's `cluster` (kubeconfig, or in-cluster), else the sim cluster `nodeward up` runs."""
    from nodeward.kube import Cluster, KubeError

    cluster_settings = settings.cluster
    running = Endpoints.read(state_dir)
    if cluster_settings.kubeconfig is None and running is not None and running.kubeconfig:
        cluster_settings = cluster_settings.model_copy(update={"kubeconfig": running.kubeconfig})
    try:
        async with Cluster.connect(cluster_settings) as cluster:
            namespaces = await cluster.namespaces.list()
    except (KubeError, OSError, ValueError) as exc:
        fail(f"cannot read the namespaces' directory labels: {' '.join(str(exc).split())}")
    owners = {}
    for ns in namespaces:
        meta = ns.get("metadata") or {}
        owners[str(meta.get("name", ""))] = NamespaceOwner.of(
            meta.get("labels") or {}, meta.get("annotations") or {}
        )
    return owners


def _num(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def render_table(by: By, window: Window, rows: list[Row]) -> Any:
    from rich.table import Table

    title = (
        f"usage by {by}, {window.start:%Y-%m-%d %H:%M} to {window.end:%Y-%m-%d %H:%M} UTC "
        "(whole hours)"
    )
    table = Table(title=title, title_justify="left")
    heads = [by, "kWh", "CO2e kg", "g/kWh", "GPU-h", "idle GPU-h", "warned", "stopped"]
    if by == "node":  # kWh is what the node measured; its pods were attributed this much
        heads.insert(2, "pods kWh")
    if by == "model":
        heads += ["GPU util %", "GPU kWh/GPU-h", "GPU kWh/busy GPU-h"]
    heads.append("gap")
    for i, head in enumerate(heads):
        table.add_column(
            head, justify="left" if i in (0, len(heads) - 1) else "right", no_wrap=i == 0
        )
    for row in rows:
        c = row.columns()
        cells = [
            row.key,
            _num(c["energy_kwh"]) + ("+" if c["gap_s"] else ""),
            *([_num(c["attributed_kwh"])] if by == "node" else []),
            _num(c["co2e_kg"], 4),
            _num(c["intensity_g_per_kwh"], 1),
            _num(c["gpu_hours"], 2),
            _num(c["idle_gpu_hours"], 2),
            str(c["sessions_warned"]),
            str(c["sessions_stopped"]),
        ]
        if by == "model":
            cells += [
                _num(c["gpu_util_pct"], 1),
                _num(c["gpu_kwh_per_gpu_hour"], 4),
                _num(c["gpu_kwh_per_busy_gpu_hour"], 4),
            ]
        cells.append(gap_text(row))
        table.add_row(*cells)
    return table


async def report(
    settings: Settings,
    *,
    since: datetime,
    until: datetime,
    by: By,
    fmt: str,
    state_dir: Path,
) -> None:
    cells, hours, periods = await read_rollups(settings, state_dir)
    owners = await read_owners(settings, state_dir) if by in BY_DIRECTORY else {}
    window = Window.of(since, until)
    rows = build(by, window, cells, hours, periods, owners=owners)
    if fmt == "csv":
        typer.echo(to_csv(by, rows), nl=False)
    elif fmt == "json":
        typer.echo(to_json(by, window, rows))
    else:
        console = table_console()
        if not rows:
            console.print(f"nothing recorded from {window.start:%Y-%m-%d %H:%M} UTC")
            return
        console.print(render_table(by, window, rows))
        if any(r.gap_s or r.silent_since for r in rows):
            console.print(
                "+ : a gap: part of the time had no energy reading (agent silent or a source "
                "away); the figure covers only the measured time"
            )
