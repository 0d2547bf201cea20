"""`nodeward streams`: what is stored, and how far behind each consumer is."""

from __future__ import annotations

import contextlib
from typing import Any

from nats.js.errors import NotFoundError
from rich.console import Console
from rich.table import Table

from nodeward.cli.common import connect_nats, echo_json, fail
from nodeward.config import Settings
from schemas.streams import STREAMS


async def provision_streams(settings: Settings) -> None:
    """Create or update every stream (`streams --provision`: the chart's provision Job)."""
    from nodeward.bus import Bus
    from nodeward.bus.errors import BusError

    bus_settings = settings.bus.model_copy(update={"provision": True})
    try:
        bus = await Bus.connect(bus_settings, source="cli/provision", wait=False)
    except BusError as exc:
        fail(str(exc))
    await bus.close(grace=1)


async def streams(settings: Settings, as_json: bool) -> None:
    nc = await connect_nats(settings, "cli/streams")
    js = nc.jetstream()
    rows: list[dict[str, Any]] = []
    try:
        for spec in STREAMS:
            try:
                info = await js.stream_info(spec.name)
            except NotFoundError:
                rows.append({"stream": spec.name, "missing": True})
                continue
            consumers = [
                {
                    "name": c.name,
                    "pending": c.num_pending or 0,
                    "ack_pending": c.num_ack_pending or 0,
                    "redelivered": c.num_redelivered or 0,
                }
                for c in await js.consumers_info(spec.name)
            ]
            rows.append(
                {
                    "stream": spec.name,
                    "subjects": list(spec.subjects),
                    "messages": info.state.messages,
                    "bytes": info.state.bytes,
                    "consumers": consumers,
                }
            )
    finally:
        with contextlib.suppress(Exception):
            await nc.close()
    if as_json:
        echo_json(rows)
        return
    table = Table(title=f"JetStream at {settings.bus.url}")
    for col in (
        "stream",
        "subjects",
        "messages",
        "bytes",
        "consumer",
        "lag",
        "unacked",
        "redelivered",
    ):
        # A header is never cut: only the subjects column folds to fit a narrow terminal.
        table.add_column(
            col,
            justify="right" if col not in ("stream", "subjects", "consumer") else "left",
            min_width=len(col),
            no_wrap=col != "subjects",
            overflow="fold",
        )
    for row in rows:
        if row.get("missing"):
            table.add_row(row["stream"], "", "not provisioned", "", "", "", "", "")
            continue
        cons = row["consumers"] or [
            {"name": "-", "pending": "", "ack_pending": "", "redelivered": ""}
        ]
        for i, c in enumerate(cons):
            first = i == 0
            table.add_row(
                row["stream"] if first else "",
                " ".join(row["subjects"]) if first else "",
                str(row["messages"]) if first else "",
                _bytes(row["bytes"]) if first else "",
                c["name"],
                str(c["pending"]),
                str(c["ack_pending"]),
                str(c["redelivered"]),
            )
    console = Console()
    if not console.is_terminal:  # piped or captured: the whole table, not 80 columns of it
        console = Console(width=1000)
    console.print(table)


def _bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"
