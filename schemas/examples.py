"""Pieces the schemas' examples share, each a fresh dict (no example shares another's)."""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict


def alice_notebook() -> dict[str, Any]:
    """Alice's notebook pod and the node it runs on."""
    return {"namespace": "user-alice", "pod": "jupyter-alice-0", "node": "gpu-node-07"}


def alice_kerberos() -> dict[str, Any]:
    """Alice's Kerberos credential Secret."""
    return {
        "namespace": "user-alice",
        "secret": "krb5-alice",
        "kind": "kerberos",
        "principal": "alice@CERN.CH",
    }


def gpu_3() -> dict[str, Any]:
    """GPU 3 of gpu-node-07."""
    return {
        "node": "gpu-node-07",
        "gpu_index": 3,
        "gpu_uuid": "GPU-5d3c1b2a-8f4e-4a7b-9c6d-0e1f2a3b4c5d",
    }


def carbon_ch() -> dict[str, Any]:
    """The Swiss grid's carbon intensity at 14:00 (Electricity Maps, lifecycle)."""
    return {
        "g_per_kwh": 21.0,
        "zone": "CH",
        "provider": "electricitymaps",
        "basis": "lifecycle",
        "observed_at": "2026-08-20T14:00:00Z",
    }


def example(data: dict[str, Any]) -> ConfigDict:
    """A model config whose JSON schema shows `data` as its one example."""
    return ConfigDict(json_schema_extra={"examples": [data]})
