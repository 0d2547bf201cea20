"""import-linter contracts whose module lists are the registered services and agents.

`independence` and `forbidden` take their modules one by one; written by hand, three lists
once missed a service. These contract types (`contract_types` in pyproject.toml) fill the
list from the registrations instead (`nodeward.plugin` for the services, the
`nodeward.agents` entry points for the agents), so a service added in one folder and
registered is linted like the others. Only packages under the configured `root_packages`
are ours to lint; a service another distribution registers is left to its own checks.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any, ClassVar

from importlinter.contracts.forbidden import ForbiddenContract
from importlinter.contracts.independence import IndependenceContract

from nodeward.plugin import services


def service_packages(roots: list[str] | None = None) -> list[str]:
    """Each registered service's package, under `roots` when given."""
    return sorted(
        p.package for p in services() if roots is None or p.package.split(".")[0] in roots
    )


def agent_packages(roots: list[str] | None = None) -> list[str]:
    """Each registered agent's package (its standalone's module's package)."""
    found = {e.value.split(":")[0].rsplit(".", 1)[0] for e in entry_points(group="nodeward.agents")}
    return sorted(p for p in found if roots is None or p.split(".")[0] in roots)


def _roots(session_options: dict[str, Any]) -> list[str]:
    roots = session_options.get("root_packages") or [session_options.get("root_package")]
    return [str(r) for r in roots if r]


class _Derived:
    """A contract whose `KEY` option is filled with `listed(roots)` before it is parsed."""

    KEY: ClassVar[str]
    listed: ClassVar[Callable[[list[str] | None], list[str]]]

    def __init__(
        self, name: str, session_options: dict[str, Any], contract_options: dict[str, Any]
    ) -> None:
        options = {**contract_options, self.KEY: type(self).listed(_roots(session_options))}
        super().__init__(name, session_options, options)  # type: ignore[call-arg]


class ServicesIndependent(_Derived, IndependenceContract):
    """`independence` over every registered service's package: no service imports another."""

    KEY = "modules"
    listed = staticmethod(service_packages)


class AgentsIndependent(_Derived, IndependenceContract):
    """`independence` over every registered agent's package."""

    KEY = "modules"
    listed = staticmethod(agent_packages)


class NoServiceImported(_Derived, ForbiddenContract):
    """`forbidden`: the `source_modules` import no registered service's package."""

    KEY = "forbidden_modules"
    listed = staticmethod(service_packages)
