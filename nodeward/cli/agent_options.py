"""`nodeward agent energy` flags: each one sets a key of `agents.energy` (flags beat env and file).

Every flag has an environment equivalent through the config rule, e.g. `--ipmi-host` is
`NODEWARD_AGENTS__ENERGY__IPMI__HOST` and `--carbon-intensity` is
`NODEWARD_AGENTS__ENERGY__CARBON__STATIC_G_PER_KWH` (with `..._CARBON__PROVIDER=static`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nodeward.config import Settings


@dataclass(frozen=True)
class EnergyFlags:
    node: str | None = None
    ipmi_host: str | None = None
    ipmi_port: int | None = None
    ipmi_user: str | None = None
    ipmi_password: str | None = None
    ipmi_password_file: Path | None = None
    interval_s: float | None = None
    carbon_g_per_kwh: float | None = None

    def given(self) -> list[str]:
        """The flags set, by their option names."""
        return [
            f"--{k.removesuffix('_s').replace('_', '-')}"
            for k, v in vars(self).items()
            if v is not None
        ]

    def overrides(self) -> dict[str, Any]:
        """The `agents.energy` keys these flags set."""
        out: dict[str, Any] = {}
        ipmi = {
            "host": self.ipmi_host,
            "port": self.ipmi_port,
            "user": self.ipmi_user,
            "password": self.ipmi_password,
            "password_file": str(self.ipmi_password_file) if self.ipmi_password_file else None,
        }
        ipmi = {k: v for k, v in ipmi.items() if v is not None}
        if ipmi:
            out["ipmi"] = ipmi
        if self.node is not None:
            out["node"] = self.node
        if self.interval_s is not None:
            out["interval"] = f"{self.interval_s:g}s"
            if self.interval_s < 1:
                out["sample_every"] = f"{self.interval_s:g}s"
        if self.carbon_g_per_kwh is not None:
            out["carbon"] = {"provider": "static", "static_g_per_kwh": self.carbon_g_per_kwh}
        return out


def _merge(into: dict[str, Any], more: dict[str, Any]) -> None:
    for key, value in more.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


def apply_energy_flags(settings: Settings, flags: EnergyFlags) -> None:
    """Write the flags into `settings.agents['energy']` (validated when the agent builds)."""
    section = settings.agents.setdefault("energy", {})
    _merge(section, flags.overrides())
