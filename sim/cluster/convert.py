"""Conversion between the two views of one Event store: `events.k8s.io/v1` and core `v1`."""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

# (events.k8s.io/v1 field, core v1 field): the same datum under each view's name.
_FIELDS = (
    ("related", "related"),
    ("reason", "reason"),
    ("note", "message"),
    ("type", "type"),
    ("action", "action"),
    ("eventTime", "eventTime"),
    ("series", "series"),
    ("reportingController", "reportingComponent"),
    ("reportingInstance", "reportingInstance"),
    ("deprecatedFirstTimestamp", "firstTimestamp"),
    ("deprecatedLastTimestamp", "lastTimestamp"),
    ("deprecatedCount", "count"),
)


def _event(
    ev: dict[str, Any], api_version: str, about: tuple[str, str], fields: Iterable[tuple[str, str]]
) -> dict[str, Any]:
    """`ev` as an Event of `api_version`: its metadata, the object it is `about` (its field
    here, its field there) and each (here, there) of `fields` that it sets, copied."""
    here, there = about
    out: dict[str, Any] = {
        "apiVersion": api_version,
        "kind": "Event",
        "metadata": copy.deepcopy(ev.get("metadata", {})),
        there: copy.deepcopy(ev.get(here) or {}),
    }
    for src, dst in fields:
        if ev.get(src) is not None:
            out[dst] = copy.deepcopy(ev[src])
    return out


def to_core_event(ev: dict[str, Any]) -> dict[str, Any]:
    """An `events.k8s.io/v1` Event as the core `v1` API shows it."""
    out = _event(ev, "v1", ("regarding", "involvedObject"), _FIELDS)
    source = copy.deepcopy(ev.get("deprecatedSource") or {})
    if not source and ev.get("reportingController"):
        source = {"component": ev["reportingController"]}
    out["source"] = source
    return out


def from_core_event(ev: dict[str, Any]) -> dict[str, Any]:
    """A core `v1` Event stored as `events.k8s.io/v1`."""
    fields = [*((core, new) for new, core in _FIELDS), ("source", "deprecatedSource")]
    return _event(ev, "events.k8s.io/v1", ("involvedObject", "regarding"), fields)
