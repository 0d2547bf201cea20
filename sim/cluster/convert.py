"""Conversion between the two views of one Event store: `events.k8s.io/v1` and core `v1`."""

from __future__ import annotations

import copy
from typing import Any


def to_core_event(ev: dict[str, Any]) -> dict[str, Any]:
    """An `events.k8s.io/v1` Event as the core `v1` API shows it."""
    out: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": copy.deepcopy(ev.get("metadata", {})),
    }
    out["involvedObject"] = copy.deepcopy(ev.get("regarding") or {})
    for src, dst in (
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
    ):
        if ev.get(src) is not None:
            out[dst] = copy.deepcopy(ev[src])
    source = copy.deepcopy(ev.get("deprecatedSource") or {})
    if not source and ev.get("reportingController"):
        source = {"component": ev["reportingController"]}
    out["source"] = source
    return out


def from_core_event(ev: dict[str, Any]) -> dict[str, Any]:
    """A core `v1` Event stored as `events.k8s.io/v1`."""
    out: dict[str, Any] = {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": copy.deepcopy(ev.get("metadata", {})),
    }
    out["regarding"] = copy.deepcopy(ev.get("involvedObject") or {})
    for src, dst in (
        ("related", "related"),
        ("reason", "reason"),
        ("message", "note"),
        ("type", "type"),
        ("action", "action"),
        ("eventTime", "eventTime"),
        ("series", "series"),
        ("reportingComponent", "reportingController"),
        ("reportingInstance", "reportingInstance"),
        ("firstTimestamp", "deprecatedFirstTimestamp"),
        ("lastTimestamp", "deprecatedLastTimestamp"),
        ("count", "deprecatedCount"),
        ("source", "deprecatedSource"),
    ):
        if ev.get(src) is not None:
            out[dst] = copy.deepcopy(ev[src])
    return out
