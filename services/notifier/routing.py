"""Notification routing: a YAML file of routes that choose channels by severity, topic,
namespace, node and audience.

Routes are tried in order; the first that matches wins unless it says `continue: true`,
in which case the following routes are tried as well. A notice no route matches is an
error the notifier dead-letters (the shipped file ends with a catch-all).

A user's notice takes only `to_owner` routes, whatever their order: it goes to its owner,
never to on-call's channels.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from nodeward.durations import Duration
from nodeward.yamlfile import load_model
from schemas.notify import Notification, Severity

DEFAULT_ROUTES = "routes.yaml"
NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
ONCALL_ONLY = frozenset({"chat", "alertmanager"})  # channel types no user reads


class RoutingError(ValueError):
    """A routes file that cannot be read or does not validate. `str()` is one line."""


class AudienceError(ValueError):
    """A notice's `audience` is neither `oncall` nor `user:<namespace>/<name>`."""


@dataclass(frozen=True)
class Audience:
    """Who a notice is for: on-call, or the owner of one namespaced object (a session)."""

    kind: Literal["oncall", "user"]
    namespace: str | None = None
    name: str | None = None

    @classmethod
    def parse(cls, text: str) -> Audience:
        if text == "oncall":
            return cls("oncall")
        if text.startswith("user:"):
            namespace, _, name = text.removeprefix("user:").partition("/")
            if namespace and name and "/" not in name:
                return cls("user", namespace, name)
        raise AudienceError(f"audience {text!r} is neither 'oncall' nor 'user:<namespace>/<name>'")

    def __str__(self) -> str:
        return "oncall" if self.kind == "oncall" else f"user:{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Facts:
    """What routes match on, taken from one notice."""

    severity: Severity
    topic: str
    audience: Audience
    namespaces: frozenset[str]
    nodes: frozenset[str]
    resolves: bool = False

    @classmethod
    def of(cls, note: Notification, audience: Audience) -> Facts:
        namespaces = {t.namespace for t in note.targets if t.namespace}
        if audience.namespace:
            namespaces.add(audience.namespace)
        nodes = {t.name for t in note.targets if t.kind == "Node"}
        return cls(
            note.severity,
            note.topic,
            audience,
            frozenset(namespaces),
            frozenset(nodes),
            note.resolves,
        )


def _globs(values: list[str], candidates: frozenset[str] | set[str]) -> bool:
    return any(fnmatch.fnmatchcase(c, v) for v in values for c in candidates)


class Match(BaseModel):
    """Every given field must match (globs for topic, namespace and node); empty matches all."""

    model_config = ConfigDict(extra="forbid")

    severity: list[Severity] = Field(default_factory=list)
    topic: list[str] = Field(default_factory=list)
    namespace: list[str] = Field(default_factory=list)
    node: list[str] = Field(default_factory=list)
    audience: list[Literal["oncall", "user"]] = Field(default_factory=list)
    resolves: bool | None = Field(
        default=None, description="true: only notices that end an incident; false: only others"
    )

    def matches(self, facts: Facts) -> bool:
        if self.resolves is not None and facts.resolves != self.resolves:
            return False
        if self.severity and facts.severity not in self.severity:
            return False
        if self.topic and not _globs(self.topic, {facts.topic}):
            return False
        if self.namespace and not _globs(self.namespace, facts.namespaces):
            return False
        if self.node and not _globs(self.node, facts.nodes):
            return False
        return not (self.audience and facts.audience.kind not in self.audience)


class Route(BaseModel):
    """One route: which notices (`match`) go to which `channels`, and to whom."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    match: Match = Field(default_factory=Match)
    channels: list[str] = Field(min_length=1)
    to_owner: bool = Field(
        default=False, description="mail a user's notice to its owner, not the channel's `to`"
    )
    continue_: bool = Field(default=False, alias="continue")
    group_wait: Duration | None = Field(
        default=None,
        description="this route's wait for company, instead of grouping.group_wait "
        "(security notices should not wait as long as routine ones)",
    )

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not NAME_RE.match(value):
            raise ValueError("route names are letters, digits, '-' and '_' (at most 64)")
        return value


class Routes(BaseModel):
    """The routes file."""

    model_config = ConfigDict(extra="forbid")

    routes: list[Route] = Field(min_length=1)

    def check(self, channels: set[str]) -> None:
        """Every channel a route names must be configured; route names are unique."""
        seen: set[str] = set()
        for route in self.routes:
            if route.name in seen:
                raise RoutingError(f"route {route.name!r} is defined twice")
            seen.add(route.name)
            unknown = sorted(set(route.channels) - channels)
            if unknown:
                known = ", ".join(sorted(channels)) or "none"
                raise RoutingError(
                    f"route {route.name!r} names unknown channel(s) {', '.join(unknown)} "
                    f"(configured: {known})"
                )

    def check_personal(self, kinds: dict[str, str]) -> None:
        """A `to_owner` route sends only on channels that reach the owner (`kinds`: channel
        name -> type): a chat room or Alertmanager is on-call's, not the user's."""
        for route in self.routes:
            if not route.to_owner:
                continue
            oncall = sorted(c for c in route.channels if kinds.get(c) in ONCALL_ONLY)
            if oncall:
                raise RoutingError(
                    f"route {route.name!r} sends users' notices (to_owner) on "
                    f"{', '.join(oncall)}, which on-call reads, not the user "
                    "(use email, outbox or webhook channels there)"
                )

    def select(self, facts: Facts) -> list[Route]:
        """The routes a notice takes, in file order; a user's notice only `to_owner` ones."""
        chosen: list[Route] = []
        for route in self.routes:
            if facts.audience.kind == "user" and not route.to_owner:
                continue
            if route.match.matches(facts):
                chosen.append(route)
                if not route.continue_:
                    break
        return chosen


def load_routes(path: Path | None = None) -> Routes:
    """The routes at `path`, or the default file shipped with nodeward."""
    shipped = resources.files("services.notifier").joinpath(DEFAULT_ROUTES)
    return load_model(Routes, path, shipped=shipped, what="routes", error=RoutingError)
