"""The simulated NVML behaves as pynvml does: names, return types and real error classes."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pynvml
import pytest

from sim.nvml import FAULTS, SimNvml


@pytest.fixture
def sim() -> SimNvml:
    s = SimNvml.build(
        "n1", product="NVIDIA-A100-SXM4-80GB", count=4, mig={"1g.10gb": 7, "2g.20gb": 3}
    )
    s.nvmlInit()
    return s


def test_calls_before_init_raise_uninitialized() -> None:
    s = SimNvml.build("n0", count=1)
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        s.nvmlDeviceGetCount()


def test_identity_and_structures(sim: SimNvml) -> None:
    assert sim.nvmlDeviceGetCount() == 4
    h = sim.nvmlDeviceGetHandleByIndex(2)
    mem = sim.nvmlDeviceGetMemoryInfo(h)
    assert isinstance(mem, pynvml.c_nvmlMemory_t)
    assert mem.total == mem.used + mem.free
    assert isinstance(sim.nvmlDeviceGetUtilizationRates(h), pynvml.c_nvmlUtilization_t)
    assert sim.nvmlDeviceGetUUID(h).startswith("GPU-")
    assert sim.nvmlDeviceGetName(h) == "NVIDIA A100-SXM4-80GB"
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        sim.nvmlDeviceGetHandleByIndex(9)


def test_mig_layout(sim: SimNvml) -> None:
    h0 = sim.nvmlDeviceGetHandleByIndex(0)
    assert sim.nvmlDeviceGetMigMode(h0) == [pynvml.NVML_DEVICE_MIG_ENABLE] * 2
    mig = sim.nvmlDeviceGetMigDeviceHandleByIndex(h0, 0)
    assert sim.nvmlDeviceGetUUID(mig).startswith("MIG-")
    assert sim.nvmlDeviceGetGpuInstanceId(mig) == 1
    with pytest.raises(pynvml.NVMLError_NotFound):
        sim.nvmlDeviceGetMigDeviceHandleByIndex(h0, 7)
    with pytest.raises(pynvml.NVMLError_NotSupported):  # as NVML does with MIG enabled
        sim.nvmlDeviceGetRemappedRows(h0)
    h3 = sim.nvmlDeviceGetHandleByIndex(3)
    assert sim.nvmlDeviceGetMigMode(h3)[0] == pynvml.NVML_DEVICE_MIG_DISABLE
    assert sim.nvmlDeviceGetRemappedRows(h3) == (0, 0, 0, 0)


def test_fallen_off_the_bus_raises_gpu_is_lost(sim: SimNvml) -> None:
    h = sim.nvmlDeviceGetHandleByIndex(1)
    sim.inject_fault(1, "fallen-off-bus")
    with pytest.raises(pynvml.NVMLError_GpuIsLost):
        sim.nvmlDeviceGetPowerUsage(h)
    sim.recover(1)
    assert sim.nvmlDeviceGetPowerUsage(h) > 0


def test_event_wait_times_out_with_nvml_timeout(sim: SimNvml) -> None:
    es = sim.nvmlEventSetCreate()
    with pytest.raises(pynvml.NVMLError_Timeout):
        sim.nvmlEventSetWait(es, 10)


def test_xid_event_is_delivered_as_registered(sim: SimNvml) -> None:
    es = sim.nvmlEventSetCreate()
    h = sim.nvmlDeviceGetHandleByIndex(0)
    sim.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, es)
    sim.inject_fault(0, "ecc-dbe-burst")  # DBE event not registered: only XID 48 arrives
    data = sim.nvmlEventSetWait(es, 100)
    assert (data.eventType, data.eventData, data.device) == (
        pynvml.nvmlEventTypeXidCriticalError,
        48,
        h,
    )
    assert (
        sim.nvmlDeviceGetTotalEccErrors(
            h, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC
        )
        > 0
    )
    sim.nvmlEventSetFree(es)


def test_hang_blocks_until_recovery(sim: SimNvml) -> None:
    h = sim.nvmlDeviceGetHandleByIndex(0)
    sim.inject_fault(0, "hang")
    done = threading.Event()
    t = threading.Thread(target=lambda: (sim.nvmlDeviceGetPowerUsage(h), done.set()))
    t.start()
    assert not done.wait(0.05)
    sim.recover(0)
    assert done.wait(2)
    t.join()


def test_faults_are_all_applicable(sim: SimNvml) -> None:
    for fault in FAULTS:
        if fault != "hang":
            sim.inject_fault(3, fault)
    with pytest.raises(ValueError, match="unknown fault"):
        sim.inject_fault(3, "melt")
    with pytest.raises(ValueError, match="no GPU 9"):
        sim.inject_xid(9, 79)


def test_scenario_files(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from datetime import timedelta

    from sim.scenario import ScenarioError, load_scenario

    good = tmp_path / "ok.yaml"
    good.write_text(
        "- {after: 1m, node: a, gpu: 0, recover: true}\n- {after: 5s, node: a, gpu: 1, xid: 79}\n"
    )
    steps = load_scenario(good)
    assert [s.after for s in steps] == [timedelta(seconds=5), timedelta(minutes=1)]
    bad = tmp_path / "bad.yaml"
    bad.write_text("- {node: a, gpu: 0, fault: melt}\n")
    with pytest.raises(ScenarioError, match="unknown fault") as info:
        load_scenario(bad)
    assert "\n" not in str(info.value)


# -- utilisation with MIG, and GPM -----------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def gpm_utilization(s: SimNvml, handle: object, take: Callable[[object], None]) -> float:
    """Graphics utilisation between two samples, read exactly as with pynvml."""
    first, second = s.nvmlGpmSampleAlloc(), s.nvmlGpmSampleAlloc()
    take(first)
    assert isinstance(s.clock, Clock)
    s.clock.now += 10
    take(second)
    request = pynvml.c_nvmlGpmMetricsGet_t()
    request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = 2
    request.sample1, request.sample2 = first, second
    request.metrics[0].metricId = pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL
    request.metrics[1].metricId = pynvml.NVML_GPM_METRIC_NVLINK_L0_RX_PER_SEC
    assert s.nvmlGpmMetricsGet(request) is request
    assert request.metrics[1].nvmlReturn == pynvml.NVML_ERROR_NOT_SUPPORTED
    assert request.metrics[0].nvmlReturn == pynvml.NVML_SUCCESS
    s.nvmlGpmSampleFree(first)
    s.nvmlGpmSampleFree(second)
    return float(request.metrics[0].value)


def test_utilisation_rates_are_not_supported_with_mig_as_on_real_gpus(sim: SimNvml) -> None:
    h0 = sim.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        sim.nvmlDeviceGetUtilizationRates(sim.nvmlDeviceGetMigDeviceHandleByIndex(h0, 0))
    with pytest.raises(pynvml.NVMLError_NotSupported):
        sim.nvmlDeviceGetUtilizationRates(h0)
    sim.set_load(3, 80)
    assert sim.nvmlDeviceGetUtilizationRates(sim.nvmlDeviceGetHandleByIndex(3)).gpu == 80


def test_gpm_is_only_on_hopper_and_later(sim: SimNvml) -> None:
    h0 = sim.nvmlDeviceGetHandleByIndex(0)
    assert sim.nvmlDeviceGetArchitecture(h0) == pynvml.NVML_DEVICE_ARCH_AMPERE
    support = sim.nvmlGpmQueryDeviceSupport(h0)
    assert isinstance(support, pynvml.c_nvmlGpmSupport_t)
    assert support.isSupportedDevice == 0
    with pytest.raises(pynvml.NVMLError_NotSupported):
        sim.nvmlGpmMigSampleGet(h0, 1, sim.nvmlGpmSampleAlloc())
    hopper = SimNvml.build("n2", product="NVIDIA-A100-SXM4-80GB", count=1, family="hopper")
    hopper.nvmlInit()
    h = hopper.nvmlDeviceGetHandleByIndex(0)
    assert hopper.nvmlDeviceGetArchitecture(h) == pynvml.NVML_DEVICE_ARCH_HOPPER
    assert hopper.nvmlGpmQueryDeviceSupport(h).isSupportedDevice == 1


def test_gpm_follows_each_mig_instances_load() -> None:
    clock = Clock()
    s = SimNvml.build("n3", count=1, mig={"3g.40gb": 2}, clock=clock)
    s.nvmlInit()
    h = s.nvmlDeviceGetHandleByIndex(0)
    s.set_mig_load(0, 1, 60)
    s.set_mig_load(0, 2, 0)

    def mig(gi: int) -> Callable[[object], None]:
        return lambda sample: s.nvmlGpmMigSampleGet(h, gi, sample)

    assert gpm_utilization(s, h, mig(1)) == pytest.approx(60)
    assert gpm_utilization(s, h, mig(2)) == pytest.approx(0)
    # The whole GPU: each instance weighted by its 3 of 7 slices.
    whole = gpm_utilization(s, h, lambda sample: s.nvmlGpmSampleGet(h, sample))
    assert whole == pytest.approx(60 * 3 / 7)
    # Load changing within the interval: the mean over it (5 s at 60 %, 5 s idle).
    first, second = s.nvmlGpmSampleAlloc(), s.nvmlGpmSampleAlloc()
    s.nvmlGpmMigSampleGet(h, 1, first)
    clock.now += 5
    s.set_mig_load(0, 1, 0)
    clock.now += 5
    s.nvmlGpmMigSampleGet(h, 1, second)
    request = pynvml.c_nvmlGpmMetricsGet_t()
    request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = 1
    request.sample1, request.sample2 = first, second
    request.metrics[0].metricId = pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL
    assert s.nvmlGpmMetricsGet(request).metrics[0].value == pytest.approx(30)


def test_gpm_refuses_what_nvml_refuses() -> None:
    clock = Clock()
    s = SimNvml.build("n4", count=1, mig={"3g.40gb": 1}, clock=clock)
    s.nvmlInit()
    h = s.nvmlDeviceGetHandleByIndex(0)
    sample = s.nvmlGpmSampleAlloc()
    with pytest.raises(pynvml.NVMLError_NotFound):
        s.nvmlGpmMigSampleGet(h, 9, sample)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):  # GPM takes the parent GPU's handle
        s.nvmlGpmMigSampleGet(s.nvmlDeviceGetMigDeviceHandleByIndex(h, 0), 1, sample)
    request = pynvml.c_nvmlGpmMetricsGet_t()
    request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = 1
    request.sample1 = request.sample2 = sample  # never taken
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        s.nvmlGpmMetricsGet(request)
    request.version = 99
    with pytest.raises(pynvml.NVMLError_ArgumentVersionMismatch):
        s.nvmlGpmMetricsGet(request)
    s.nvmlGpmSampleFree(sample)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        s.nvmlGpmSampleFree(sample)
    with pytest.raises(ValueError, match="no GPU instance 5"):
        s.set_mig_load(0, 5, 10)
    with pytest.raises(ValueError, match=r"0\.\.100"):
        s.set_mig_load(0, 1, 101)


def test_compute_processes_per_gpu_and_mig_instance() -> None:
    s = SimNvml.build("n5", count=2, mig={"3g.40gb": 2})
    s.nvmlInit()
    h0, h1 = s.nvmlDeviceGetHandleByIndex(0), s.nvmlDeviceGetHandleByIndex(1)
    assert s.nvmlDeviceGetComputeRunningProcesses(h1) == []
    s.set_processes(1, [(4242, 1024)])
    (proc,) = s.nvmlDeviceGetComputeRunningProcesses(h1)
    assert (proc.pid, proc.usedGpuMemory) == (4242, 1024 * 1024 * 1024)
    s.set_processes(0, [(7, 10)], gpu_instance_id=2)
    first, second = (s.nvmlDeviceGetMigDeviceHandleByIndex(h0, i) for i in (0, 1))
    assert s.nvmlDeviceGetComputeRunningProcesses(first) == []
    assert [p.pid for p in s.nvmlDeviceGetComputeRunningProcesses(second)] == [7]
    assert [p.gpuInstanceId for p in s.nvmlDeviceGetComputeRunningProcesses(h0)] == [2]
    with pytest.raises(ValueError, match="no GPU instance 9"):
        s.set_processes(0, [], gpu_instance_id=9)
