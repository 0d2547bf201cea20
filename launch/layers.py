"""import-linter contracts whose module lists are the registered services and agents.

`independence` and `forbidden` take their modules one by one; written by hand, three lists
once missed a service. These contract types (`contract_types` in pyproject.toml) fill the
list from the registrations instead (`nodeward.plugin` for the services, the
`nodeward.agents` entry points for the agents), so a service added in one folder and
registered is linted like the others. Only packages under the configured `root_packages`
are ours to lint; a service another distribution registers is left to its own checks.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

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


class ServicesIndependent(IndependenceContract):
    """`independence` over every registered service's package: no service imports another."""

    def __init__(
        self, name: str, session_options: dict[str, Any], contract_options: dict[str, Any]
    ) -> None:
        modules = service_packages(_roots(session_options))
        super().__init__(name, session_options, {**contract_options, "modules": modules})


class AgentsIndependent(IndependenceContract):
    """`independence` over every registered agent's package."""

    def __init__(
        self, name: str, session_options: dict[str, Any], contract_options: dict[str, Any]
    ) -> None:
        modules = agent_packages(_roots(session_options))
        super().__init__(name, session_options, {**contract_options, "modules": modules})


class NoServiceImported(ForbiddenContract):
    """`forbidden`: the `source_modules` import no registered service's package."""

    def __init__(
        self, name: str, session_options: dict[str, Any], contract_options: dict[str, Any]
    ) -> None:
        forbidden = service_packages(_roots(session_options))
        options = {**contract_options, "forbidden_modules": forbidden}
        super().__init__(name, session_options, options)
