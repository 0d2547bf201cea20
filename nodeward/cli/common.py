"""What every CLI command shares: one-line errors, the NATS URL, input loading.

Light to import (typer, pydantic): the settings, the bus and the schemas load when a
command uses them, so the command line starts without them.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import os
import sys
import types
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import typer

from nodeward.endpoints import DEFAULT_STATE_DIR, Endpoints

if TYPE_CHECKING:
    from collections.abc import Sequence

    from rich.console import Console, ConsoleOptions, RenderResult
    from rich.table import Column, Table

    from nodeward.config import Settings
    from schemas.state import Bucket

DEFAULT_NATS = "nats://127.0.0.1:4222"


class CliError(Exception):
    """A user-facing failure: printed as one line, exit code 1."""


class CliUsageError(CliError):
    """A command given wrong or missing options: printed as one line, exit code 2."""


def fail(message: str) -> NoReturn:
    raise CliError(message)


def usage(message: str) -> NoReturn:
    """A usage error that no single option's type catches (a missing choice, options that
    exclude each other): one line naming the options, exit code 2."""
    raise CliUsageError(message)


def settings_for(
    config: Path | None, nats: str | None, state_dir: Path = DEFAULT_STATE_DIR
) -> Settings:
    """Settings from `--config` and the environment, with the NATS URL resolved.

    URL precedence: `--nats`, `NODEWARD_NATS_URL`, `NODEWARD_BUS__URL` or the config file,
    a `nodeward up` running from `state_dir` (./.nodeward), then nats://127.0.0.1:4222.
    """
    from nodeward.config import ConfigError, load_settings

    try:
        settings = load_settings(config)
    except ConfigError as exc:
        fail(str(exc))
    url = nats or os.environ.get("NODEWARD_NATS_URL") or None  # empty: unset
    if url is None and settings.bus.url == DEFAULT_NATS and "NODEWARD_BUS__URL" not in os.environ:
        running = Endpoints.read(state_dir)
        if running is not None:
            url = running.nats_url
    if url:
        settings.bus.url = url
    return settings


def bucket_name(settings: Settings, service: str, bucket: Bucket[Any]) -> str:
    """The KV bucket `service` keeps `bucket`'s records in: its `services.<service>.bucket`
    setting if the config file sets one, else the declared name."""
    configured = (settings.services.get(service) or {}).get("bucket")
    return str(configured or bucket.name)


async def connect_nats(settings: Settings, name: str, state_dir: Path = DEFAULT_STATE_DIR) -> Any:
    """A NATS connection for a one-shot command, with every credential the bus settings hold
    (user/password, token, creds, nkey seed, TLS); failing, one line that says what to do."""
    from nodeward.bus.connection import connect_nats as connect
    from nodeward.bus.errors import BusError

    try:
        nc, _ = await connect(settings.bus, name=name, wait=False)
    except BusError as exc:
        url = settings.bus.url
        if url == DEFAULT_NATS and Endpoints.read(state_dir) is None:
            fail(
                f"nothing running: no `nodeward up` in {state_dir} and no NATS at {url} "
                f"({exc}); start `nodeward up` or pass --nats URL"
            )
        fail(str(exc))
    return nc


def read_data(spec: str) -> Any:
    """`--data` as JSON text, `@file`, or `@-` for standard input."""
    if spec == "@-":
        text = sys.stdin.read()
        where = "standard input"
    elif spec.startswith("@"):
        path = Path(spec[1:])
        try:
            text = path.read_text()
        except OSError as exc:
            fail(f"cannot read {path}: {exc.strerror}")
        where = str(path)
    else:
        text, where = spec, "--data"
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        fail(f"{where} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}")


def echo_json(obj: Any) -> None:
    typer.echo(json.dumps(obj, separators=(",", ":"), default=str))


PIPE_WIDTH = 200
"""Columns a table gets in a pipe or a file: whole rows, not squeezed to 80 columns."""


NARROWEST = 60
"""No line for people is cut shorter than this."""


def line_width() -> int | None:
    """How wide a line told to people may be: `COLUMNS` when it is set, else the terminal's
    width on a terminal (asked each time: a terminal may be resized); None in a pipe or a
    file (whole lines, for grep)."""
    import shutil

    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit():
        return max(int(columns), NARROWEST)
    if sys.stdout.isatty():
        return max(shutil.get_terminal_size().columns, NARROWEST)
    return None


def fit(line: str, width: int | None) -> str:
    """`line` cut to `width` characters, the cut marked with `…`."""
    return line if width is None or len(line) <= width else line[: width - 1] + "…"


def table_console() -> Console:
    """The console a command prints its tables to: the terminal's width on a terminal,
    `COLUMNS` when it is set, else `PIPE_WIDTH` columns in a pipe or a file."""
    from rich.console import Console

    console = Console(soft_wrap=False)
    if not console.is_terminal and not os.environ.get("COLUMNS", "").isdigit():
        console.width = PIPE_WIDTH
    return console


def keep_whole(table: Table, *headers: str) -> Table:
    """Never cut the columns that tell rows apart (a node's name, a pod's, a GPU model):
    at their widest cell, unwrapped; rich wraps the other columns to fit instead."""
    from rich.cells import cell_len

    for column in table.columns:
        if str(column.header) in headers:
            widest = max((cell_len(str(c)) for c in column.cells), default=0)
            column.no_wrap = True
            column.min_width = max(widest, cell_len(str(column.header)))
    return table


class Fitted:
    """A table whose identifying columns (`keep`) are never cut, and which, when the width
    cannot hold every column readably (each as wide as its header and its longest word,
    up to 12), leaves out the columns named in `drop`, first named first, and says so
    under it."""

    READABLE = 12

    def __init__(self, table: Table, *, keep: Sequence[str], drop: Sequence[str] = ()) -> None:
        self.table = keep_whole(table, *keep)
        self.drop = [d for d in drop if d not in keep]

    def _width(self, columns: list[Column]) -> int:
        from rich.cells import cell_len

        def readable(column: Column) -> int:
            if column.no_wrap and column.min_width:
                return column.min_width
            words = [w for c in column.cells for w in str(c).split()]
            longest = max((cell_len(w) for w in words), default=1)
            return max(cell_len(str(column.header)), min(longest, self.READABLE))

        return sum(readable(c) for c in columns) + 3 * len(columns) + 1

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        import copy

        from rich.text import Text

        columns = list(self.table.columns)
        dropped: list[str] = []
        for name in self.drop:
            if self._width(columns) <= options.max_width:
                break
            if any(str(c.header) == name for c in columns):
                columns = [c for c in columns if str(c.header) != name]
                dropped.append(name)
        for column in columns:
            if not column.no_wrap:
                column.overflow = "fold"  # a long word breaks rather than ends in "…"
        table = copy.copy(self.table)
        table.columns = columns
        yield table
        if dropped:
            yield Text(
                f"  (not shown at {options.max_width} columns: {', '.join(dropped)}; a wider "
                "terminal shows them)",
                style="dim",
            )


def defer_websocket_client() -> None:
    """Load aiohttp (a tenth of a second) only if a websocket URL needs it.

    nats-py imports aiohttp for its websocket transport alone; a one-shot command on a
    nats:// or tls:// URL never uses it. Before nats is first imported, this puts a stand-in
    module in aiohttp's place whose first attribute read (a ws:// URL) imports aiohttp
    itself and answers from it (PEP 562). importlib's LazyLoader does not serve here: an
    `import aiohttp` statement reads the module's `__spec__`, which loads it. Nothing to
    do when nats or aiohttp is loaded already.
    """
    if "nats" in sys.modules or "aiohttp" in sys.modules:
        return
    spec = importlib.util.find_spec("aiohttp")
    if spec is None:
        return  # nats-py runs without it (no websocket transport)
    stand_in = types.ModuleType("aiohttp", "aiohttp, imported on first use")
    # Where it lives, said without loading it: `inspect.getmodule` (pydantic reading a
    # class's attribute docstrings) asks every module in sys.modules for its `__file__`.
    stand_in.__file__ = spec.origin

    def load(attr: str) -> Any:
        if sys.modules.get("aiohttp") is stand_in:
            with contextlib.suppress(KeyError):  # another thread took it out first
                del sys.modules["aiohttp"]
        return getattr(importlib.import_module("aiohttp"), attr)

    stand_in.__getattr__ = load  # type: ignore[method-assign]
    sys.modules["aiohttp"] = stand_in
