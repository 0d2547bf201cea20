"""`agents.energy` in the config file: the energy agent and each of its sources.

Env overrides follow the config rule, e.g. `NODEWARD_AGENTS__ENERGY__IPMI__HOST`.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from pydantic import Field, model_validator

from agents.energy.tuning import CpufreqSettings
from agents.sources.carbon import CarbonSettings
from agents.sources.ipmi import IpmiSettings
from agents.sources.rapl import RaplSettings
from nodeward.config import Section
from nodeward.durations import Duration
from schemas.state.energy import TOTALS


class NvmlEnergySettings(Section):
    enabled: bool = True


class PowerCap(Section):
    watts: float = Field(gt=0)
    hysteresis: float = Field(
        default=0.05, ge=0, lt=1, description="clear below watts x (1 - hysteresis)"
    )


class PowerCapSettings(Section):
    node: PowerCap | None = None
    racks: dict[str, PowerCap] = Field(default_factory=dict, description="rack name -> cap")
    rack_label: str = "topology.kubernetes.io/rack"
    rack: str | None = None
    """this node's rack; None: read the node's `rack_label` once"""


class EnergySettings(Section):
    """`agents.energy`."""

    node: str | None = None
    """None: NODE_NAME, else the host name"""
    interval: Duration = timedelta(seconds=60)
    sample_every: Duration = timedelta(seconds=1)
    """how often power sources are read"""
    read_timeout: Duration = timedelta(seconds=3)
    """a source read that takes longer is reported degraded (the loop goes on)"""
    max_gap: Duration | None = None
    """readings further apart are not integrated (the time is reported as uncovered), nor are
    readings with a failed read between them; None: two sampling periods plus read_timeout (a slow
    read is not a gap)"""
    bucket: str = TOTALS.name
    """KV bucket of the cumulative totals"""
    ipmi: IpmiSettings = IpmiSettings()
    rapl: RaplSettings = RaplSettings()
    nvml: NvmlEnergySettings = NvmlEnergySettings()
    carbon: CarbonSettings = CarbonSettings()
    caps: PowerCapSettings = PowerCapSettings()
    cpufreq: CpufreqSettings = CpufreqSettings()
    pod_resources_socket: Path = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
    cgroup_root: Path = Path("/sys/fs/cgroup")

    def max_gap_s(self) -> float:
        """Segments longer than this are a gap in the readings, not integrated."""
        gap = self.max_gap or 2 * self.sample_every + self.read_timeout
        return gap.total_seconds()

    @model_validator(mode="after")
    def _sampling_fits(self) -> EnergySettings:
        if self.sample_every > self.interval:
            raise ValueError("sample_every must not be longer than interval")
        return self
