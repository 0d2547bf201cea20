"""SimAmdSmi follows amdsmi: its calls, dicts, enums and errors; the AMD source reads it."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from agents.gpu.backends import AmdSmiBackend, NvmlBackend, select
from agents.sources import amdsmi as source
from nodeward.config import ConfigError
from nodeward.watchdog import Lane
from sim.amdsmi import (
    AMDSMI_STATUS_INVAL,
    AMDSMI_STATUS_NO_DATA,
    AMDSMI_STATUS_NOT_FOUND,
    AMDSMI_STATUS_NOT_INIT,
    AMDSMI_STATUS_NOT_SUPPORTED,
    AmdSmiEvtNotificationType,
    AmdSmiGpuBlock,
    AmdSmiLibraryException,
    AmdSmiParameterException,
    AmdSmiRetCode,
    AmdSmiTemperatureMetric,
    AmdSmiTemperatureType,
    SimAmdSmi,
    amdsmi_processor_handle,
)


@pytest.fixture
def smi() -> SimAmdSmi:
    s = SimAmdSmi.build("mi300x-node", count=2)
    s.amdsmi_init()
    return s


@pytest.fixture
def lane() -> Any:
    one = Lane("test")
    yield one
    one.close()


def code_of(exc: pytest.ExceptionInfo[AmdSmiLibraryException]) -> int:
    return exc.value.get_error_code()


def test_calls_before_init_raise_not_init_as_amdsmi_does() -> None:
    s = SimAmdSmi.build("n", count=1)
    with pytest.raises(AmdSmiLibraryException) as exc:
        s.amdsmi_get_processor_handles()
    assert code_of(exc) == AMDSMI_STATUS_NOT_INIT == AmdSmiRetCode.STATUS_NOT_INIT
    assert str(exc.value) == "Error code:\n\t32 | AMDSMI_STATUS_NOT_INIT - Device not initialized"
    with pytest.raises(AmdSmiLibraryException):
        s.amdsmi_shut_down()


def test_identity_dicts_have_amdsmis_keys(smi: SimAmdSmi) -> None:
    handles = smi.amdsmi_get_processor_handles()
    assert len(handles) == 2 and all(isinstance(h, amdsmi_processor_handle) for h in handles)
    asic = smi.amdsmi_get_gpu_asic_info(handles[0])
    assert set(asic) == {
        "market_name",
        "vendor_id",
        "vendor_name",
        "subvendor_id",
        "device_id",
        "rev_id",
        "asic_serial",
        "oam_id",
        "num_compute_units",
        "target_graphics_version",
    }
    assert asic["device_id"] == "0x74a1" and asic["vendor_id"] == "0x1002"
    assert asic["target_graphics_version"] == "gfx942"
    board = smi.amdsmi_get_gpu_board_info(handles[0])
    assert set(board) == {
        "model_number",
        "product_serial",
        "fru_id",
        "product_name",
        "manufacturer_name",
    }
    bdf = smi.amdsmi_get_gpu_device_bdf(handles[1])
    assert bdf == "0000:26:00.0"
    assert smi.amdsmi_get_gpu_device_uuid(handles[0]) != smi.amdsmi_get_gpu_device_uuid(handles[1])


def test_parameters_are_checked_like_amdsmi(smi: SimAmdSmi) -> None:
    h = smi.amdsmi_get_processor_handles()[0]
    with pytest.raises(AmdSmiParameterException):
        smi.amdsmi_get_gpu_asic_info("gpu0")
    with pytest.raises(AmdSmiParameterException):
        smi.amdsmi_get_gpu_ecc_count(h, 1)  # type: ignore[arg-type]  # an int, not the enum
    with pytest.raises(AmdSmiLibraryException) as exc:
        smi.amdsmi_get_gpu_asic_info(amdsmi_processor_handle(0xDEAD))
    assert code_of(exc) == AMDSMI_STATUS_INVAL


def test_unsupported_reads_raise_not_supported(smi: SimAmdSmi) -> None:
    h = smi.amdsmi_get_processor_handles()[0]
    with pytest.raises(AmdSmiLibraryException) as exc:  # MI300 has no edge sensor
        smi.amdsmi_get_temp_metric(h, AmdSmiTemperatureType.EDGE, AmdSmiTemperatureMetric.CURRENT)
    assert code_of(exc) == AMDSMI_STATUS_NOT_SUPPORTED
    assert not smi.amdsmi_get_gpu_ecc_enabled(h) & AmdSmiGpuBlock.ATHUB
    with pytest.raises(AmdSmiLibraryException) as exc:
        smi.amdsmi_get_gpu_ecc_count(h, AmdSmiGpuBlock.ATHUB)
    assert code_of(exc) == AMDSMI_STATUS_NOT_SUPPORTED
    assert smi.amdsmi_get_power_info(h)["average_socket_power"] == "N/A"


def test_uncorrectable_ecc_counts_per_block_and_a_pending_bad_page(smi: SimAmdSmi) -> None:
    h = smi.amdsmi_get_processor_handles()[1]
    smi.inject_fault(1, "ecc-uncorrectable")
    assert smi.amdsmi_get_gpu_total_ecc_count(h) == {
        "correctable_count": 0,
        "uncorrectable_count": 1,
        "deferred_count": 0,
    }
    assert smi.amdsmi_get_gpu_ecc_count(h, AmdSmiGpuBlock.UMC)["uncorrectable_count"] == 1
    assert smi.amdsmi_get_gpu_ecc_count(h, AmdSmiGpuBlock.GFX)["uncorrectable_count"] == 0
    pages = smi.amdsmi_get_gpu_bad_page_info(h)
    assert [set(p) for p in pages] == [{"value", "page_address", "page_size", "status"}]
    assert pages[0]["status"] == 1  # AMDSMI_MEM_PAGE_STATUS_PENDING
    other = smi.amdsmi_get_processor_handles()[0]
    assert smi.amdsmi_get_gpu_total_ecc_count(other)["uncorrectable_count"] == 0
    smi.recover(1)
    assert smi.amdsmi_get_gpu_total_ecc_count(h)["uncorrectable_count"] == 0
    assert smi.amdsmi_get_gpu_bad_page_info(h)[0]["status"] == 0  # retired at the reset


def test_event_reader_reads_every_registered_gpu_and_times_out_with_no_data(
    smi: SimAmdSmi,
) -> None:
    h0, h1 = smi.amdsmi_get_processor_handles()
    types = [AmdSmiEvtNotificationType.RING_HANG, AmdSmiEvtNotificationType.GPU_POST_RESET]
    reader = smi.AmdSmiEventReader(h0, types)
    smi.AmdSmiEventReader(h1, [AmdSmiEvtNotificationType.GPU_PRE_RESET])
    with pytest.raises(AmdSmiLibraryException) as exc:
        reader.read(50)
    assert code_of(exc) == AMDSMI_STATUS_NO_DATA
    smi.inject_fault(0, "ring-hang")  # RING_HANG (subscribed) then PRE_RESET (not, on gpu 0)
    smi.inject_fault(1, "gpu-reset")  # PRE_RESET (subscribed on gpu 1) then POST_RESET (not)
    events = reader.read(50)
    assert events == [
        {"processor_handle": h0.value, "event": "RING_HANG", "message": "gfx_0.0.0"},
        {"processor_handle": h1.value, "event": "GPU_PRE_RESET", "message": "1"},
    ]
    reader.stop()
    with pytest.raises(AmdSmiLibraryException):
        reader.stop()


def test_fallen_off_the_bus_is_lost_and_other_errors_are_not(smi: SimAmdSmi, lane: Lane) -> None:
    ident = source.identify(smi, lane, 0)
    smi.inject_fault(0, "fallen-off-bus")
    with pytest.raises(AmdSmiLibraryException) as exc:
        source.sample_health(smi, lane, ident)
    assert code_of(exc) == AMDSMI_STATUS_NOT_FOUND and source.is_lost(exc.value)
    assert not source.is_lost(AmdSmiLibraryException(AMDSMI_STATUS_NOT_SUPPORTED))
    with pytest.raises(ValueError, match="no XIDs"):
        smi.inject_xid(0, 79)


def test_source_reads_health_and_telemetry(smi: SimAmdSmi, lane: Lane) -> None:
    ident = source.identify(smi, lane, 1)
    assert ident.name == "AMD Instinct MI300X" and ident.pci_bus_id == "0000:26:00.0"
    smi.inject_fault(1, "ecc-uncorrectable")
    smi.inject_fault(1, "thermal")
    s = source.sample_health(smi, lane, ident)
    assert s.ecc_total == {"correctable": 0, "uncorrectable": 1, "deferred": 0}
    assert s.ecc_blocks == {"UMC": {"correctable": 0, "uncorrectable": 1, "deferred": 0}}
    assert s.bad_pages == {"reserved": 0, "pending": 1, "unreservable": 0}
    assert (s.temperature_c, s.slowdown_c, s.shutdown_c) == (103, 100, 105)
    assert s.errors == {}
    smi.set_load(1, 100)
    t = source.sample_telemetry(smi, lane, ident)
    assert t.utilization_gpu_pct == 100 and t.power_w == 750
    assert t.memory_total_bytes == 196592 * 1024 * 1024


def test_wait_events_delivers_keyed_by_handle(smi: SimAmdSmi, lane: Lane) -> None:
    backend = AmdSmiBackend(smi)
    ident = backend.identify(lane, 1)
    readers: list[Any] = []
    backend.register_events(lane, ident, readers)
    got: list[source.AmdEvent] = []
    stop = threading.Event()
    thread = threading.Thread(
        target=backend.wait_events, args=(readers, got.append, print, stop, 20)
    )
    thread.start()
    smi.inject_fault(1, "ring-hang")
    try:
        for _ in range(200):
            if len(got) >= 2:
                break
            stop.wait(0.01)
    finally:
        stop.set()
        thread.join()
    assert [e.event for e in got] == ["RING_HANG", "GPU_PRE_RESET"]
    assert {e.device_key for e in got} == {backend.device_key(ident.handle)}
    backend.close_events(readers)


def test_select_refuses_an_unknown_backend_and_auto_falls_back_to_nvml() -> None:
    with pytest.raises(ConfigError, match="unknown GPU backend"):
        select("rocm")
    try:
        import amdsmi  # type: ignore[import-not-found]  # noqa: F401
    except ImportError:
        with pytest.raises(ConfigError, match="amdsmi package"):
            select("amdsmi")
    assert isinstance(select("nvml"), NvmlBackend)


def test_auto_picks_the_library_that_sees_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    from agents.gpu import backends
    from sim.nvml import SimNvml

    amd_node = SimAmdSmi.build("mi300x-node", count=8)
    monkeypatch.setattr(backends, "pynvml", SimNvml("mi300x-node", []))  # NVML: no GPU
    monkeypatch.setattr(backends, "_import", lambda name: amd_node if name == "amdsmi" else None)
    chosen = select("auto")
    assert isinstance(chosen, AmdSmiBackend) and chosen.lib is amd_node
    with pytest.raises(AmdSmiLibraryException):  # the probe shut the library down again
        amd_node.amdsmi_get_processor_handles()
    monkeypatch.setattr(backends, "_import", lambda name: None)  # no amdsmi installed
    assert isinstance(select("auto"), NvmlBackend)
    nvidia_node = SimNvml.build("h100-node", count=2)
    monkeypatch.setattr(backends, "pynvml", nvidia_node)
    monkeypatch.setattr(backends, "_import", lambda name: amd_node)
    picked = select("auto")
    assert isinstance(picked, NvmlBackend) and picked.lib is nvidia_node


def test_older_amdsmis_no_bad_pages_string_reads_as_none(
    smi: SimAmdSmi, lane: Lane, monkeypatch: pytest.MonkeyPatch
) -> None:
    ident = source.identify(smi, lane, 0)
    monkeypatch.setattr(smi, "amdsmi_get_gpu_bad_page_info", lambda h: "No bad pages found.")
    s = source.sample_health(smi, lane, ident)
    assert s.bad_pages == {"reserved": 0, "pending": 0, "unreservable": 0}
