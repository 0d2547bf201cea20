"""Energy per node and per pod over an interval, with the carbon intensity used for CO2e."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import ClassVar, Self

from pydantic import Field, model_validator

from schemas.base import EventData, Model
from schemas.common import K8sName, NonNegFloat, PodEventData
from schemas.examples import alice_notebook, carbon_ch, example
from schemas.tokens import subject


class PowerSource(StrEnum):
    IPMI_SDR = "ipmi_sdr"
    DCMI = "dcmi"
    RAPL = "rapl"
    NVML = "nvml"
    ESTIMATE = "estimate"


class CarbonBasis(StrEnum):
    """Lifecycle (Electricity Maps default) and operational (RTE, UK NESO) must not be mixed."""

    LIFECYCLE = "lifecycle"
    OPERATIONAL = "operational"


class CarbonIntensity(Model):
    g_per_kwh: NonNegFloat
    zone: str
    provider: str = Field(description="electricitymaps, rte-eco2mix, uk-neso, static, ...")
    basis: CarbonBasis
    estimated: bool = False
    observed_at: datetime
    stale: bool = Field(
        default=False, description="the provider failed; this is the last good value, kept"
    )
    age_s: NonNegFloat | None = Field(
        default=None, description="how old the value was when used (set when stale)"
    )


class EnergyReading(Model):
    """Energy of one component from one source over the interval."""

    source: PowerSource
    component: str = Field(description="system, package-0, dram, gpu-3, ...")
    energy_j: NonNegFloat
    avg_power_w: NonNegFloat


class Interval(Model):
    start: datetime
    end: datetime

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.end <= self.start:
            raise ValueError("interval end must be after start")
        return self


class _EnergyEvent(EventData):
    """What the energy agent publishes on stream ENERGY."""

    STREAM: ClassVar[str] = "ENERGY"
    EXAMPLE_SOURCE: ClassVar[str] = "agent/energy/gpu-node-07"


class EnergyNode(_EnergyEvent):
    """A node's measured energy over an interval."""

    TYPE: ClassVar[str] = "energy.node.v1"
    SUBJECT_PATTERN: ClassVar[str] = "energy.node.<node>"

    node: K8sName
    interval: Interval
    readings: list[EnergyReading]
    # Null is left out on the wire (`schemas.cloudevents.encode`), so absent means null.
    energy_j: NonNegFloat | None = Field(
        default=None,
        description="whole-node energy over `covered_s` (not the sum of overlapping "
        "readings); null (or absent) when nothing was read: unknown, not zero",
    )
    avg_power_w: NonNegFloat | None = Field(
        default=None, description="energy_j / covered_s; null (or absent) when nothing was read"
    )
    min_power_w: NonNegFloat | None = Field(
        default=None, description="from this interval's own readings only"
    )
    max_power_w: NonNegFloat | None = None
    covered_s: NonNegFloat | None = Field(
        default=None,
        description="seconds the node's readings span; the rest of the interval fell in a gap "
        "(a source away longer than the agent's max_gap) and its energy is unknown",
    )
    carbon: CarbonIntensity | None = None
    co2e_g: NonNegFloat | None = None
    energy_total_j: NonNegFloat | None = Field(
        default=None, description="cumulative node energy since first seen (kept across restarts)"
    )
    co2e_total_g: NonNegFloat | None = None
    uncovered_total_s: NonNegFloat | None = Field(
        default=None,
        description="cumulative seconds energy_total_j does not cover (intervals' gaps)",
    )
    degraded: list[str] = Field(
        default_factory=list,
        description="sources that could not be read this interval, one line each (source: why)",
    )

    model_config = example(
        {
            "node": "gpu-node-07",
            "interval": {"start": "2026-08-20T14:00:00Z", "end": "2026-08-20T14:01:00Z"},
            "readings": [
                {
                    "source": "ipmi_sdr",
                    "component": "system",
                    "energy_j": 231000.0,
                    "avg_power_w": 3850.0,
                },
                {
                    "source": "rapl",
                    "component": "package-0",
                    "energy_j": 16200.0,
                    "avg_power_w": 270.0,
                },
                {
                    "source": "nvml",
                    "component": "gpu-0",
                    "energy_j": 36744.0,
                    "avg_power_w": 612.4,
                },
            ],
            "energy_j": 231000.0,
            "avg_power_w": 3850.0,
            "carbon": carbon_ch(),
            "co2e_g": 1.3475,
        }
    )

    def nats_subject(self) -> str:
        return subject("energy.node", self.node)

    def about(self) -> str:
        return f"node/{self.node}"


class EnergyPod(_EnergyEvent, PodEventData):
    """Energy attributed to one pod over an interval."""

    TYPE: ClassVar[str] = "energy.pod.v1"
    # The node token lets an agent's NATS user publish only its own node's pods.
    SUBJECT_PATTERN: ClassVar[str] = "energy.pod.<node>.<ns>.<pod>"

    interval: Interval
    cpu_energy_j: NonNegFloat = 0.0
    gpu_energy_j: NonNegFloat = 0.0
    energy_j: NonNegFloat
    gpus: NonNegFloat | None = Field(
        default=None,
        description="GPUs the pod held over the interval (a GPU shared by k pods counts 1/k); "
        "null when not known (an agent before this field)",
    )
    gpu_utilization_pct: float | None = Field(
        default=None,
        ge=0,
        le=100,
        description="mean utilisation of the GPUs (or MIG instances) the pod held over the "
        "interval, as NVML reported it each sample (a GPU shared by pods: the whole GPU's), "
        "weighted by the share of each GPU held; null when not read (no GPU, MIG without GPM, "
        "an agent before this field)",
    )
    attribution: str = Field(
        description="how the node's energy was split, e.g. cpu-time-ratio+gpu-exclusive"
    )
    carbon: CarbonIntensity | None = None
    co2e_g: NonNegFloat | None = None

    model_config = example(
        {
            **alice_notebook(),
            "interval": {"start": "2026-08-20T14:00:00Z", "end": "2026-08-20T14:01:00Z"},
            "cpu_energy_j": 1250.0,
            "gpu_energy_j": 36744.0,
            "energy_j": 37994.0,
            "gpus": 1.0,
            "gpu_utilization_pct": 87.5,
            "attribution": "cpu-time-ratio+gpu-exclusive",
            "carbon": carbon_ch(),
            "co2e_g": 0.2216,
        }
    )
