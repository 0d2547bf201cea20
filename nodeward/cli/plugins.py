"""The commands a service brings, named in its plugin (`nodeward.plugin`), so the runtime's
command line names no service.

Each command's name is the one its plugin gives; its object is either a `typer.Typer`,
mounted as the group of that name (`nodeward quarantine release ...`), or a plain function,
registered as a top-level command (`nodeward report ...`). Commands are mounted in the order
of their names, so `--help` reads the same on every machine. A plugin or a command that does
not load (an import error, a missing object, something else, a name already taken) is said
in one line on stderr and left out: the other commands still run.

A service's command module is imported when the command line is (its group's `--help`
needs it), so it imports typer and the runtime's light CLI modules only; what a command
runs (nats, the bus, the schemas, the kube client) it imports in its body. Its plugin, in
the package's `__init__.py`, imports nothing but `nodeward.plugin`.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Iterable

import typer

from nodeward.plugin import PluginError, resolve, services


def _taken(app: typer.Typer) -> set[str]:
    """The names of the commands and groups `app` has already."""
    names = {group.name for group in app.registered_groups if group.name}
    for command in app.registered_commands:
        if command.name:
            names.add(command.name)
        elif command.callback is not None:
            names.add(command.callback.__name__.lower().replace("_", "-"))
    return names


def _said(what: str, why: str) -> None:
    said = " ".join(why.split())
    print(f"nodeward: {what} left out: {said}", file=sys.stderr)


def _broken_plugin(exc: PluginError) -> None:
    _said(f"service {exc.entry.name} ({exc.entry.value})", exc.why)


def registered() -> list[tuple[str, str]]:
    """(command, `module:attribute`) of every command the registered services name."""
    return [
        (name, plugin.ref(ref))
        for plugin in services(broken=_broken_plugin)
        for name, ref in plugin.commands.items()
    ]


def mount(app: typer.Typer, commands: Iterable[tuple[str, str]] | None = None) -> list[str]:
    """Add `commands` (default: every registered one) to `app`; the names mounted."""
    mounted = []
    taken = _taken(app)
    for name, ref in sorted(registered() if commands is None else commands):
        what = f"command {name} ({ref})"
        if name in taken:
            _said(what, f"nodeward has a command {name} already")
            continue
        try:
            found = resolve(ref)
        except Exception as exc:  # noqa: BLE001 - any failure of one plugin leaves it out
            _said(what, f"{type(exc).__name__}: {exc}")
            continue
        if isinstance(found, typer.Typer):
            app.add_typer(found, name=name)
        elif inspect.isfunction(found):
            app.command(name=name)(found)
        else:
            _said(what, f"a {type(found).__name__}, neither a typer.Typer nor a function")
            continue
        taken.add(name)
        mounted.append(name)
    return mounted
