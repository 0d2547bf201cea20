"""The simulated NVML behaves as pynvml does: names, return types and real error classes."""

from __future__ import annotations

import threading

import pynvml
import pytest

from nodeward.sim.nvml import FAULTS, SimNvml


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

    from nodeward.sim.scenario import ScenarioError, load_scenario

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
