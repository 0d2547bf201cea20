"""`agents.energy` in the config file: the energy agent and each of its sources.

Env overrides follow the config rule, e.g. `NODEWARD_AGENTS__ENERGY__IPMI__HOST`.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, model_validator

from nodeward.config import Section
from nodeward.durations import Duration


class IpmiSettings(Section):
    """The node's BMC: in-band (`/dev/ipmi0`) without a host, else over the LAN."""

    enabled: bool = True
    host: str | None = Field(default=None, description="None: in-band through /dev/ipmi0")
    port: int = Field(default=623, ge=1, le=65535)
    user: str | None = None
    password: SecretStr | None = None
    password_file: Path | None = Field(
        default=None, description="read at start; wins over password"
    )
    interface: Literal["lanplus", "lan"] = Field(
        default="lanplus", description="RMCP+ (IPMI 2.0); `lan` for BMCs with RMCP only"
    )
    timeout: Duration = timedelta(seconds=5)
    sensors: list[str] = Field(
        default_factory=list,
        description="SDR sensor names to read when there is no DCMI; empty: every Watts sensor",
    )

    def secret(self) -> str | None:
        """The password, from `password_file` if set (one line, trailing newline dropped)."""
        if self.password_file is not None:
            return self.password_file.read_text().rstrip("\n")
        return self.password.get_secret_value() if self.password else None


class RaplSettings(Section):
    enabled: bool = True
    root: Path = Field(default=Path("/sys/class/powercap"), description="the powercap sysfs root")


class NvmlEnergySettings(Section):
    enabled: bool = True


class CarbonSettings(Section):
    """Where carbon intensity comes from. Whatever fails, `static_g_per_kwh` is the floor."""

    provider: Literal["static", "electricitymaps", "rte-eco2mix", "uk-neso"] = "static"
    static_g_per_kwh: float = Field(default=0.0, ge=0)
    static_basis: Literal["lifecycle", "operational"] = "operational"
    zone: str = Field(default="FR", description="Electricity Maps zone / label for others")
    url: str | None = Field(default=None, description="override the provider's base URL")
    token: SecretStr | None = Field(default=None, description="Electricity Maps auth-token")
    token_file: Path | None = None
    refresh: Duration = Field(
        default=timedelta(minutes=15), description="how long a reading is reused"
    )
    stale_after: Duration = Field(
        default=timedelta(hours=2),
        description="a failed provider's last value is used (marked stale) this long, then static",
    )
    timeout: Duration = timedelta(seconds=10)


class PowerCap(Section):
    watts: float = Field(gt=0)
    hysteresis: float = Field(
        default=0.05, ge=0, lt=1, description="clear below watts x (1 - hysteresis)"
    )


class PowerCapSettings(Section):
    node: PowerCap | None = None
    racks: dict[str, PowerCap] = Field(default_factory=dict, description="rack name -> cap")
    rack_label: str = "topology.kubernetes.io/rack"
    rack: str | None = Field(
        default=None, description="this node's rack; None: read the node's `rack_label` once"
    )


class EnergySettings(Section):
    """`agents.energy`."""

    node: str | None = Field(default=None, description="None: NODE_NAME, else the host name")
    interval: Duration = timedelta(seconds=60)
    sample_every: Duration = Field(
        default=timedelta(seconds=1), description="how often power sources are read"
    )
    read_timeout: Duration = Field(
        default=timedelta(seconds=3),
        description="a source read that takes longer is reported degraded (the loop goes on)",
    )
    bucket: str = Field(default="energy", description="KV bucket of the cumulative totals")
    ipmi: IpmiSettings = IpmiSettings()
    rapl: RaplSettings = RaplSettings()
    nvml: NvmlEnergySettings = NvmlEnergySettings()
    carbon: CarbonSettings = CarbonSettings()
    caps: PowerCapSettings = PowerCapSettings()
    pod_resources_socket: Path = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
    cgroup_root: Path = Path("/sys/fs/cgroup")

    @model_validator(mode="after")
    def _sampling_fits(self) -> EnergySettings:
        if self.sample_every > self.interval:
            raise ValueError("sample_every must not be longer than interval")
        return self
