"""GPU energy through NVML, on the simulated driver with a driven clock."""

from __future__ import annotations

import pynvml
import pytest

from agents.sources.nvml_energy import NvmlEnergyReader
from agents.sources.power import PowerSample, SourceError
from schemas.energy import PowerSource
from sim.nvml import SimNvml
from tests.helpers.timing import median_us


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def by_gpu(samples: list[PowerSample]) -> dict[str, PowerSample]:
    return {s.component: s for s in samples}


def energy(samples: list[PowerSample], gpu: str) -> float:
    value = by_gpu(samples)[gpu].energy_j
    assert value is not None
    return value


def test_energy_integrates_power_over_time_not_reads() -> None:
    clock = Clock()
    sim = SimNvml.build("n1", count=2, clock=clock)
    sim.set_power(0, 300.0)
    reader = NvmlEnergyReader(sim)
    assert reader.describe() == "NVML: energy counter on gpu-0, gpu-1"
    start = reader.read()
    assert energy(start, "gpu-0") == 0.0
    assert energy(reader.read(), "gpu-0") == 0.0  # reading again adds nothing
    clock.now += 10
    after = reader.read()
    assert energy(after, "gpu-0") == pytest.approx(3000.0)  # 300 W x 10 s
    assert energy(after, "gpu-1") == pytest.approx(2500.0)  # the default 250 W
    sim.set_load(0, 100)  # full load: the H100's 700 W limit
    clock.now += 2
    assert energy(reader.read(), "gpu-0") == pytest.approx(3000.0 + 1400.0)
    sim.set_load(0, 0)  # idle: 70 W
    clock.now += 1
    assert energy(reader.read(), "gpu-0") == pytest.approx(4400.0 + 70.0)
    assert all(s.source is PowerSource.NVML and s.watts is None for s in after)


def test_power_follows_load() -> None:
    sim = SimNvml.build("n1", product="NVIDIA-A100-SXM4-80GB", count=1)
    handle = sim.gpus[0].handle
    sim.nvmlInit()
    sim.set_load(0, 50)
    assert sim.nvmlDeviceGetPowerUsage(handle) == 227_500  # 55 + 0.5 x (400 - 55) W
    assert sim.nvmlDeviceGetUtilizationRates(handle).gpu == 50
    with pytest.raises(ValueError, match=r"0\.\.100"):
        sim.set_load(0, 120)


def test_power_is_the_fallback_where_there_is_no_counter() -> None:
    sim = SimNvml.build("n1", count=3)
    sim.gpus[1].energy_supported = False
    sim.set_power(1, 412.5)
    reader = NvmlEnergyReader(sim)
    assert reader.describe() == "NVML: energy counter on gpu-0, gpu-2; power only on gpu-1"
    samples = by_gpu(reader.read())
    assert samples["gpu-1"].watts == 412.5 and samples["gpu-1"].energy_j is None
    assert samples["gpu-0"].energy_j is not None and samples["gpu-0"].watts is None


def test_counter_lost_later_falls_back_to_power() -> None:
    sim = SimNvml.build("n1", count=1)
    reader = NvmlEnergyReader(sim)
    sim.gpus[0].energy_supported = False
    assert by_gpu(reader.read())["gpu-0"].watts == 250.0
    assert reader.describe() == "NVML: power only on gpu-0"


def test_lost_gpu_is_one_line_naming_it() -> None:
    sim = SimNvml.build("n1", count=4)
    reader = NvmlEnergyReader(sim)
    sim.inject_fault(2, "fallen-off-bus")
    with pytest.raises(SourceError) as err:
        reader.read()
    message = str(err.value)
    assert message.startswith("nvml: gpu-2: ") and "\n" not in message
    assert "gpu-0" not in message
    sim.recover(2)
    assert len(reader.read()) == 4


def test_close_releases_its_nvml_init() -> None:
    sim = SimNvml.build("n1", count=1)
    reader = NvmlEnergyReader(sim)
    reader.close()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        sim.nvmlDeviceGetCount()
    reader.close()  # twice is harmless


def test_read_cost_with_eight_gpus() -> None:
    """One read of 8 simulated GPUs (the reader's own overhead) stays far below 1 ms."""
    reader = NvmlEnergyReader(SimNvml.build("n1", count=8))
    median = median_us(reader.read, 500)
    print(f"NvmlEnergyReader.read median {median:.1f} us for 8 sim GPUs")
    assert median < 5000


def test_a_node_without_the_nvidia_driver_has_no_nvml_source() -> None:
    """Real pynvml here: without the driver library the reader refuses at once, so the
    agent leaves NVML out (one line at start) instead of a degraded source every interval."""
    import pynvml

    from agents.sources.nvml_energy import NoNvml, NvmlEnergyReader

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        if exc.value != pynvml.NVML_ERROR_LIBRARY_NOT_FOUND:
            pytest.skip(f"NVML is present but failing here ({exc})")
    else:
        pynvml.nvmlShutdown()
        pytest.skip("this machine has the NVIDIA driver")
    with pytest.raises(NoNvml, match="no NVIDIA driver library"):
        NvmlEnergyReader(pynvml)
