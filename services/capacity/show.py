"""What `nodeward capacity` does: free GPUs per model and profile from the capacity
service's KV snapshot (rich on a terminal, or one JSON object), and `--request`: whether a
pod asking that many fits now, and on which nodes (exit 0 if it fits, 3 if not).

The command itself is `services.capacity.cli`; this loads nats, rich and the schemas, when
the command runs."""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime
from pathlib import Path

from nats.js.errors import BucketNotFoundError, KeyNotFoundError, NotFoundError
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from nodeward.cli.common import (
    Fitted,
    bucket_name,
    connect_nats,
    echo_json,
    fail,
    table_console,
)
from nodeward.config import Settings
from nodeward.durations import format_age
from nodeward.endpoints import DEFAULT_STATE_DIR
from schemas.capacity import STATES, profile_for, resource_for
from schemas.state.capacity import SNAPSHOT, CapacitySnapshot, Fit, matches_model

NO_FIT = 3
"""The exit code of `--request` when the pod fits nowhere now."""
LISTED = 4
"""Nodes named per row in the table's `free on` column."""


def parse_request(spec: str) -> tuple[str, int]:
    """`nvidia.com/gpu=4` or `nvidia.com/mig-1g.10gb=1` as (resource, count); ValueError
    with one line otherwise."""
    resource, sep, number = spec.partition("=")
    resource = resource.strip()
    if not sep or profile_for(resource) is None:
        raise ValueError(
            f"{spec!r}: expected RESOURCE=COUNT with a GPU resource, e.g. nvidia.com/gpu=4 "
            "or nvidia.com/mig-1g.10gb=1"
        )
    try:
        n = int(number)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"{spec!r}: the count must be a whole number of at least 1")
    return resource, n


async def read_snapshot(settings: Settings, state_dir: Path) -> CapacitySnapshot:
    nc = await connect_nats(settings, "cli/capacity", state_dir)
    bucket = bucket_name(settings, "capacity", SNAPSHOT)
    try:
        kv = await nc.jetstream().key_value(bucket)
        entry = await kv.get(SNAPSHOT.key())
    except (BucketNotFoundError, KeyNotFoundError, NotFoundError):
        fail(f"no capacity snapshot in KV {bucket}: is the capacity service running?")
    finally:
        with contextlib.suppress(Exception):
            await nc.close()
    if entry.value is None:
        fail(f"no capacity snapshot in KV {bucket}: is the capacity service running?")
    return SNAPSHOT.load(entry.value)


def filtered(
    snapshot: CapacitySnapshot, model: str | None, profile: str | None
) -> CapacitySnapshot:
    nodes = []
    for n in snapshot.nodes:
        if not matches_model(n.model, model):
            continue
        profiles = {p: c for p, c in n.profiles.items() if profile is None or p == profile}
        if profiles:
            nodes.append(n.model_copy(update={"profiles": profiles}))
    return snapshot.model_copy(update={"nodes": nodes})


async def capacity(
    settings: Settings,
    *,
    as_json: bool,
    model: str | None,
    profile: str | None,
    requests: list[str],
    state_dir: Path = DEFAULT_STATE_DIR,
) -> int:
    """Print the table or answer the request; the exit code."""
    asked: dict[str, int] = {}
    for spec in requests:
        try:
            resource, n = parse_request(spec)
        except ValueError as exc:
            fail(str(exc))
        asked[resource] = asked.get(resource, 0) + n
    snapshot = filtered(await read_snapshot(settings, state_dir), model, profile)
    if asked:
        return answer(snapshot, asked, model, as_json=as_json)
    if as_json:
        echo_json(
            {
                "at": snapshot.at.isoformat(),
                "totals": [t.model_dump(mode="json") for t in snapshot.totals()],
                "nodes": [n.model_dump(mode="json") for n in snapshot.nodes],
            }
        )
    else:
        console = table_console()
        console.print(render(snapshot) if console.is_terminal else plain(snapshot))
    return 0


def answer(
    snapshot: CapacitySnapshot, asked: dict[str, int], model: str | None, *, as_json: bool
) -> int:
    fits = snapshot.fits(asked, model)
    if as_json:
        echo_json(
            {
                "fits": bool(fits),
                "request": asked,
                "model": model,
                "nodes": [f.model_dump() for f in fits],
                "at": snapshot.at.isoformat(),
            }
        )
    else:
        Console(soft_wrap=True, highlight=False).print(fit_line(snapshot, asked, model, fits))
    return 0 if fits else NO_FIT


def fit_line(
    snapshot: CapacitySnapshot, asked: dict[str, int], model: str | None, fits: list[Fit]
) -> str:
    what = " + ".join(f"{n} {r}" for r, n in asked.items())
    of = f" {model}" if model else ""
    if fits:
        where = ", ".join(
            f"{f.node} ({', '.join(f'{n} {p} left' for p, n in f.left.items())})" for f in fits
        )
        return f"fits now: {what} on {len(fits)}{of} node(s): {where}"
    most = []
    for resource in asked:
        p = profile_for(resource) or resource
        best = max(
            (
                (n.profiles[p].free, n.node)
                for n in snapshot.nodes
                if p in n.profiles and n.blocked is None and matches_model(n.model, model)
            ),
            default=None,
        )
        most.append(
            f"most free {resource}: {best[0]} on {best[1]}"
            if best
            else f"no{of} node has {resource}"
        )
    return f"does not fit now: {what} on no{of} node; " + "; ".join(most)


def rows(snapshot: CapacitySnapshot) -> list[list[str]]:
    """Per model and profile: the counts by state and the nodes with the most free."""
    out = []
    for total in snapshot.totals():
        with_free = sorted(
            (
                (n.profiles[total.profile].free, n.node)
                for n in snapshot.nodes
                if n.model == total.model and total.profile in n.profiles
            ),
            key=lambda x: (-x[0], x[1]),
        )
        named = [f"{node} ({free})" for free, node in with_free if free][:LISTED]
        more = sum(1 for free, _ in with_free if free) - len(named)
        out.append(
            [
                total.model,
                total.profile,
                *(str(total.counts.of(s)) for s in STATES),
                ", ".join(named) + (f" +{more} more" if more > 0 else ""),
            ]
        )
    return out


HEADER = ["model", "profile", *STATES, "free on"]


def plain(snapshot: CapacitySnapshot) -> str:
    """The table as aligned text, for a pipe or a file."""
    table = [HEADER, *rows(snapshot)]
    widths = [max(len(r[i]) for r in table) for i in range(len(HEADER) - 1)]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[-1] for r in table
    ]
    lines += [f"held back: {n.node} ({n.blocked})" for n in snapshot.nodes if n.blocked]
    return "\n".join(line.rstrip() for line in lines)


def render(snapshot: CapacitySnapshot) -> RenderableType:
    age = (datetime.now(UTC) - snapshot.at).total_seconds()
    # The service counts again within `max_delay` (2 s) of any change and writes only what
    # changed: the snapshot's time is that of the last change, not how stale it is.
    title = (
        f"GPUs as counted at {snapshot.at:%H:%M:%S} UTC, the last change "
        f"({format_age(age)} ago; counted again on every change)"
    )
    table = Table(title=title, title_justify="left")
    table.add_column("model")
    table.add_column("profile")
    for state in STATES:
        table.add_column(state, justify="right", style="bold green" if state == "free" else None)
    table.add_column("free on")
    for row in rows(snapshot):
        table.add_row(*row)
    parts: list[RenderableType] = [Fitted(table, keep=("model", "profile"), drop=("free on",))]
    held = [n for n in snapshot.nodes if n.blocked]
    if held:
        parts.append(
            Text("held back: " + ", ".join(f"{n.node} ({n.blocked})" for n in held), style="yellow")
        )
    if not snapshot.nodes:
        parts.append(Text("no GPU node matches", style="dim"))
    return Group(*parts)


__all__ = ["NO_FIT", "capacity", "parse_request", "resource_for"]
