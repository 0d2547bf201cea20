"""NVIDIA's XID catalog as shipped in `schemas/data/xid-catalog.csv`: what each XID means.

Part of the contract: the XID semantics that `gpu.health.v1` and `gpu.xid.v1` carry (their
catalog name, class and `RecommendedAction`), read alike by the GPU agent that classifies
an XID, the service that plans a GPU's recovery from one (`services.recovery`) and the fleet
simulator. Its one read is its own shipped data, through `importlib.resources`.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from importlib import resources
from typing import Any

from schemas.gpu import GpuXid, RecommendedAction

APPLICATION = "application"
RECOVERY_ACTION_XID = 154
"""XID 154 announces the driver's recovery action for other XIDs: judged by that action."""
VALIDATION_FAILING_ACTIONS = frozenset(
    {
        RecommendedAction.RESET_GPU,
        RecommendedAction.DRAIN_AND_RESET,
        RecommendedAction.REBOOT_NODE,
        RecommendedAction.DRAIN_AND_RMA,
    }
)
"""The catalog actions that mean the GPU itself is unhealthy (the ones that fail it in the
GPU agent's health classification too): an XID with one of them, seen since a reset or
reboot, fails the GPU's validation. `none`, `restart_app` (the application's fault) and
`check_nvlink` (a link, possibly the remote end's, not this GPU) do not."""


@dataclass(frozen=True)
class XidInfo:
    """One catalog row: the XID's name, our category and NVIDIA's immediate action."""

    xid: int
    name: str
    category: str
    action: RecommendedAction
    notes: str

    @property
    def is_application(self) -> bool:
        """An application fault: it never fails a GPU."""
        return self.category == APPLICATION

    def seen(
        self, node: str, gpu_index: int, gpu_uuid: str, observed_at: datetime, **more: Any
    ) -> GpuXid:
        """The `gpu.xid.v1` of this XID seen on a GPU, with the catalog's name, class and
        action; `more`: its other fields (pods, detectors, `agent_boot_id`, ...)."""
        said = {
            "xid": self.xid,
            "name": self.name,
            "category": self.category,
            "catalog_action": self.action,
            "application": self.is_application,
        }
        return GpuXid(
            node=node,
            gpu_index=gpu_index,
            gpu_uuid=gpu_uuid,
            observed_at=observed_at,
            **said,
            **more,
        )

    @property
    def description(self) -> str:
        """The catalog's words for it, e.g. `GPU has fallen off the bus` for XID 79 (the
        parenthesised part of `name`; the whole name where there is none)."""
        start = self.name.find(" (")
        if start < 0 or not self.name.endswith(")"):
            return self.name
        return self.name[start + 2 : -1]

    @property
    def fails_validation(self) -> bool:
        """Whether this XID, seen since a GPU's reset or reboot, means the GPU is unhealthy:
        its catalog action is one of `VALIDATION_FAILING_ACTIONS` (reset_gpu,
        drain_and_reset, reboot_node, drain_and_rma) and it is no application fault. An XID
        not in the catalog (action none) does not fail; neither does XID 154 by its row:
        `RECOVERY_ACTION_XID` is judged by the recovery action it announced."""
        return not self.is_application and self.action in VALIDATION_FAILING_ACTIONS


@dataclass(frozen=True)
class XidCatalog:
    """XID number to catalog row; unknown XIDs are reported as such by `get`."""

    rows: dict[int, XidInfo]

    def get(self, xid: int) -> XidInfo:
        info = self.rows.get(xid)
        if info is None:
            return XidInfo(
                xid, f"XID {xid} (not in catalog)", "unknown", RecommendedAction.NONE, ""
            )
        return info

    def fails_validation(self, xid: int) -> bool:
        """`XidInfo.fails_validation` of `xid`'s row (False for one not in the catalog)."""
        return self.get(xid).fails_validation


def parse_catalog(text: str) -> XidCatalog:
    rows: dict[int, XidInfo] = {}
    for row in csv.DictReader(io.StringIO(text)):
        xid = int(row["xid"])
        rows[xid] = XidInfo(
            xid=xid,
            name=row["name"],
            category=row["category"],
            action=RecommendedAction(row["recommended_action"]),
            notes=row["notes"],
        )
    return XidCatalog(rows)


@cache
def load_catalog() -> XidCatalog:
    """The shipped catalog (read once; immutable)."""
    text = resources.files("schemas").joinpath("data/xid-catalog.csv").read_text()
    return parse_catalog(text)
