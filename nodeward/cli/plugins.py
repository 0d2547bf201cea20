"""The commands a service brings: found through the `nodeward.commands` entry points, so
the runtime's command line names no service.

Each entry point's name is the command's; its object is either a `typer.Typer`, mounted
as the group of that name (`nodeward quarantine release ...`), or a plain function,
registered as a top-level command (`nodeward report ...`). Entry points are mounted in
the order of their names, so `--help` reads the same on every machine. One that does not
load (an import error, a missing object, something else, a name already taken) is said in
one line on stderr and left out: the other commands still run.

A service's command module is imported when the command line is (its group's `--help`
needs it), so it imports typer and the runtime's light CLI modules only; what a command
runs (nats, the bus, the schemas, the kube client) it imports in its body.
"""

from __future__ import annotations

import inspect
import sys
from importlib.metadata import EntryPoint, entry_points

import typer

GROUP = "nodeward.commands"


def _taken(app: typer.Typer) -> set[str]:
    """The names of the commands and groups `app` has already."""
    names = {group.name for group in app.registered_groups if group.name}
    for command in app.registered_commands:
        if command.name:
            names.add(command.name)
        elif command.callback is not None:
            names.add(command.callback.__name__.lower().replace("_", "-"))
    return names


def _broken(entry: EntryPoint, why: str) -> None:
    said = " ".join(why.split())
    print(f"nodeward: command {entry.name} ({entry.value}) left out: {said}", file=sys.stderr)


def mount(app: typer.Typer, group: str = GROUP) -> list[str]:
    """Add every command registered in `group` to `app`; the names mounted."""
    mounted = []
    taken = _taken(app)
    for entry in sorted(entry_points(group=group), key=lambda e: (e.name, e.value)):
        if entry.name in taken:
            _broken(entry, f"nodeward has a command {entry.name} already")
            continue
        try:
            found = entry.load()
        except Exception as exc:  # noqa: BLE001 - any failure of one plugin leaves it out
            _broken(entry, f"{type(exc).__name__}: {exc}")
            continue
        if isinstance(found, typer.Typer):
            app.add_typer(found, name=entry.name)
        elif inspect.isfunction(found):
            app.command(name=entry.name)(found)
        else:
            _broken(entry, f"a {type(found).__name__}, neither a typer.Typer nor a function")
            continue
        taken.add(entry.name)
        mounted.append(entry.name)
    return mounted
