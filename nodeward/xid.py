"""NVIDIA's XID catalog as shipped in `nodeward/data/xid-catalog.csv`: what each XID means."""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from functools import cache
from importlib import resources

from schemas.gpu import RecommendedAction

APPLICATION = "application"


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
    text = resources.files("nodeward").joinpath("data/xid-catalog.csv").read_text()
    return parse_catalog(text)
