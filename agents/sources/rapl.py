"""RAPL package and DRAM energy from the powercap sysfs tree (`intel-rapl:*` zones).

Each zone's `energy_uj` is a counter that wraps at `max_energy_range_uj`; the reader keeps
the last raw value and an offset per zone, so the energy it returns only grows. Core and
uncore subzones are left out: they lie inside their package and would be counted twice.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import structlog

from agents.sources.power import PowerSample, SourceError
from nodeward.config import Section
from schemas.energy import PowerSource

log = structlog.get_logger(__name__)

_PERMISSION_HINT = (
    "needs root, or read access for the agent's group (a udev rule or chmod g+r on "
    "energy_uj; root-only since Linux 5.10, CVE-2020-8694)"
)


class RaplSettings(Section):
    enabled: bool = True
    root: Path = Path("/sys/class/powercap")
    """the powercap sysfs root"""


@dataclass
class _Zone:
    """One RAPL zone and the state that undoes its counter's wrap-around."""

    component: str
    path: Path
    max_range_uj: int
    last_raw_uj: int | None = None
    offset_uj: int = 0

    def advance(self, raw_uj: int) -> int:
        """The monotonic counter (µJ) for a new raw reading."""
        if self.last_raw_uj is not None and raw_uj < self.last_raw_uj:
            self.offset_uj += self.max_range_uj
        self.last_raw_uj = raw_uj
        return self.offset_uj + raw_uj


def _read_int(path: Path) -> int:
    """An integer sysfs attribute; `SourceError` naming the file when it cannot be read."""
    try:
        text = path.read_text()
    except PermissionError:
        raise SourceError(
            f"rapl: cannot read {path}: permission denied; {_PERMISSION_HINT}"
        ) from None
    except OSError as exc:
        raise SourceError(f"rapl: cannot read {path}: {exc.strerror or exc}") from None
    try:
        return int(text.strip())
    except ValueError:
        raise SourceError(f"rapl: {path} holds {text.strip()[:40]!r}, not an integer") from None


def _component(zone_dir: Path, name: str) -> str | None:
    """`package-N` as the kernel names it; `dram-N` for a DRAM zone of package N."""
    if name.startswith("package-"):
        return name
    if name == "dram":
        parts = zone_dir.name.split(":")  # intel-rapl:<package>[:<subzone>]
        package = parts[1] if len(parts) > 1 else "0"
        return f"dram-{package}"
    return None


def discover(root: Path) -> list[tuple[str, Path]]:
    """(component, zone dir) of every package and DRAM zone under `root`, sorted."""
    found: dict[str, tuple[str, Path]] = {}
    for zone_dir in sorted({*root.glob("intel-rapl:*"), *root.glob("intel-rapl:*/intel-rapl:*")}):
        if zone_dir.name in found or not (zone_dir / "energy_uj").exists():
            continue
        try:
            name = (zone_dir / "name").read_text().strip()
        except OSError:
            continue
        component = _component(zone_dir, name)
        if component is not None:
            found[zone_dir.name] = (component, zone_dir)
    return sorted(found.values())


class RaplReader:
    """Cumulative package and DRAM energy of this node's CPUs (a `PowerReader`)."""

    name = "rapl"

    def __init__(self, settings: RaplSettings) -> None:
        self.root = settings.root
        self._zones: list[_Zone] = []
        self._problem: str | None = None
        for component, zone_dir in discover(self.root):
            try:
                max_range = _read_int(zone_dir / "max_energy_range_uj")
            except SourceError as exc:
                self._problem = str(exc)
                continue
            self._zones.append(_Zone(component, zone_dir / "energy_uj", max_range))
        log.info("rapl zones", root=str(self.root), zones=[z.component for z in self._zones])

    def describe(self) -> str:
        if not self._zones:
            why = f" ({self._problem})" if self._problem else ""
            return f"RAPL: no package or dram zones under {self.root}{why}"
        return "RAPL: " + ", ".join(z.component for z in self._zones)

    def read(self) -> list[PowerSample]:
        """One counter per zone, in joules, wrap-around undone; `SourceError` if one fails."""
        samples = []
        for zone in self._zones:
            raw = _read_int(zone.path)
            at = time.monotonic()
            samples.append(
                PowerSample(
                    source=PowerSource.RAPL,
                    component=zone.component,
                    at=at,
                    energy_j=zone.advance(raw) / 1e6,
                )
            )
        return samples

    def close(self) -> None:
        """Nothing held open: each read opens the sysfs files anew."""
