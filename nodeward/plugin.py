"""One entry point per service: what the runtime and the composition root take from it.

A service registers one object in the `nodeward.services` entry point group
(pyproject.toml): its `ServicePlugin`, kept in its package's `__init__.py`. The plugin names
everything else by reference (`module:attribute`, relative to the package), resolved only
where it is needed, so `nodeward --help` loads no daemon code:

- `component`: what `nodeward up` runs (`nodeward.platform.Component`);
- `standalone`: what `nodeward service NAME` runs (`nodeward.platform.Standalone`);
- `access`: the module declaring its Kubernetes operations (`ACCESS`), from which its RBAC
  role is made; None for a service that only reads the bus;
- `handlers`: its declarations (`nodeward.handlers.Service`; default `service:app`), from
  which its NATS user's grants are derived (`Service.grants()`); every service with
  `access` has them (None for one that declares none, as the console);
- `commands`: the operators' commands it mounts on `nodeward` (`nodeward.cli.plugins`);
- `view`: what it adds to `nodeward status` and the console (`nodeward.views`).

Nothing else lists services: `up`, `nodeward service`, the command line, the grants, the
RBAC roles, the import contracts' check and `status` all come from here.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from typing import Any

GROUP = "nodeward.services"


@dataclass(frozen=True)
class ServicePlugin:
    """A service as the runtime sees it. References are `module:attribute` relative to
    `package` (`"service:component"` is `services.cordon.service:component`)."""

    name: str
    package: str
    component: str = "service:component"
    standalone: str = "service:standalone"
    access: str | None = "access"
    handlers: str | None = "service:app"
    commands: Mapping[str, str] = field(default_factory=dict)
    view: str | None = None

    def ref(self, relative: str) -> str:
        """The absolute `module:attribute` of a reference."""
        return f"{self.package}.{relative}"

    def load(self, relative: str) -> Any:
        return resolve(self.ref(relative))


def resolve(ref: str) -> Any:
    """The object a `module:attribute` reference names (the module itself without one)."""
    module, _, attribute = ref.partition(":")
    found = importlib.import_module(module)
    return getattr(found, attribute) if attribute else found


class PluginError(Exception):
    """A registered service whose plugin does not load, said in one line."""

    def __init__(self, entry: EntryPoint, why: str) -> None:
        super().__init__(f"service {entry.name} ({entry.value}) does not load: {why}")
        self.entry = entry
        self.why = why


def _load(entry: EntryPoint) -> ServicePlugin:
    try:
        found = entry.load()
    except Exception as exc:
        raise PluginError(entry, " ".join(f"{type(exc).__name__}: {exc}".split())) from exc
    if not isinstance(found, ServicePlugin):
        raise PluginError(entry, f"a {type(found).__name__}, not a ServicePlugin")
    if found.name != entry.name:
        raise PluginError(entry, f"it names itself {found.name!r}")
    return found


def _entries() -> list[EntryPoint]:
    return sorted(entry_points(group=GROUP), key=lambda e: (e.name, e.value))


def names() -> list[str]:
    """The registered services' names, none of them loaded."""
    return sorted({e.name for e in _entries()})


def services(broken: Callable[[PluginError], None] | None = None) -> list[ServicePlugin]:
    """Every registered service, in name order. One that does not load raises
    `PluginError`, unless `broken` is given: then it is told there and left out (the
    command line does so)."""
    found = []
    for entry in _entries():
        try:
            found.append(_load(entry))
        except PluginError as exc:
            if broken is None:
                raise
            broken(exc)
    return found


def service(name: str) -> ServicePlugin:
    """The registered service `name`, loading no other (a broken plugin of another service
    does not stop this one); LookupError naming the known ones if none."""
    for entry in _entries():
        if entry.name == name:
            return _load(entry)
    raise LookupError(f"no service named {name!r} (known: {', '.join(names()) or 'none'})")
