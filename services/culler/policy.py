"""The culler's policy: when to warn about and stop an idle session, per kind and namespace.

The defaults live in `services.culler` of the config file, a kind may override them
(`kinds: {ssh: {cull_after: 1h}}`) and a namespace may override both with annotations:
`nodeward.io/idle-warn-after`, `nodeward.io/idle-cull-after`, `nodeward.io/max-session-age`
(durations such as `90m`; `off` disables culling for the namespace, or the age limit).
A user defers their own session with `nodeward.io/keep-until=<RFC 3339 time>` on the pod
or its Notebook: idleness before that time does not count.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Self

from pydantic import Field, ValidationError, model_validator

from nodeward.config import Section
from nodeward.durations import Duration, parse_duration

WARN_ANNOTATION = "nodeward.io/idle-warn-after"
CULL_ANNOTATION = "nodeward.io/idle-cull-after"
AGE_ANNOTATION = "nodeward.io/max-session-age"
KEEP_UNTIL = "nodeward.io/keep-until"
OFF = "off"


class KindPolicy(Section):
    """Overrides for one kind of session; unset fields keep the defaults."""

    warn_after: Duration | None = None
    cull_after: Duration | None = None
    max_age: Duration | None = None


@dataclass(frozen=True)
class Limits:
    """The policy that applies to one session, and where it came from."""

    warn_after: timedelta
    cull_after: timedelta
    max_age: timedelta | None
    enabled: bool = True
    source: str = "defaults"
    problems: tuple[str, ...] = ()

    @property
    def lead(self) -> timedelta:
        """How long a warning comes before the stop."""
        return self.cull_after - self.warn_after


class CullPolicy(Section):
    """The part of `services.culler` that says when."""

    warn_after: Duration = timedelta(hours=2)
    """idle this long: the owner is warned"""
    cull_after: Duration = timedelta(hours=3)
    """idle this long (and warned): the session stops"""
    max_age: Duration | None = None
    """stop sessions older than this even if active (warned first)"""
    kinds: dict[str, KindPolicy] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.cull_after <= self.warn_after:
            raise ValueError(
                f"cull_after ({self.cull_after}) must be longer than warn_after ({self.warn_after})"
            )
        return self

    def limits(self, kind: str, namespace: Mapping[str, Any] | None = None) -> Limits:
        """The limits for a session of `kind` in the namespace object `namespace`."""
        override = self.kinds.get(kind, KindPolicy())
        warn = override.warn_after or self.warn_after
        cull = override.cull_after or self.cull_after
        age = override.max_age if override.max_age is not None else self.max_age
        source = f"kind {kind}" if kind in self.kinds else "defaults"
        annotations = ((namespace or {}).get("metadata") or {}).get("annotations") or {}
        ns_name = ((namespace or {}).get("metadata") or {}).get("name", "")
        problems: list[str] = []
        enabled = True

        def read(key: str, current: timedelta | None) -> timedelta | None:
            nonlocal enabled, source
            raw = annotations.get(key)
            if raw is None:
                return current
            if str(raw).strip().lower() == OFF:
                source = f"namespace {ns_name}"
                if key == AGE_ANNOTATION:
                    return None
                enabled = False
                return current
            try:
                value = parse_duration(str(raw))
            except (ValueError, ValidationError) as exc:
                problems.append(f"namespace {ns_name}: {key}={raw!r} ignored: {exc}")
                return current
            source = f"namespace {ns_name}"
            return value

        warn = read(WARN_ANNOTATION, warn) or warn
        cull = read(CULL_ANNOTATION, cull) or cull
        age = read(AGE_ANNOTATION, age)
        if cull <= warn:
            problems.append(
                f"namespace {ns_name}: cull after {cull} is not longer than warn after {warn}; "
                "the defaults apply"
            )
            warn, cull = self.warn_after, self.cull_after
        return Limits(warn, cull, age, enabled, source, tuple(problems))


def keep_until(*objs: Mapping[str, Any] | None) -> tuple[datetime | None, str | None]:
    """The latest `nodeward.io/keep-until` on the objects, and a problem if one is unreadable."""
    latest: datetime | None = None
    problem: str | None = None
    for obj in objs:
        meta = (obj or {}).get("metadata") or {}
        raw = (meta.get("annotations") or {}).get(KEEP_UNTIL)
        if raw is None:
            continue
        try:
            at = datetime.fromisoformat(str(raw).strip().replace("Z", "+00:00"))
        except ValueError:
            problem = f"{KEEP_UNTIL}={raw!r} on {meta.get('name')} is not an RFC 3339 time"
            continue
        if at.tzinfo is None:
            at = at.replace(tzinfo=UTC)
        latest = at if latest is None else max(latest, at)
    return latest, problem
