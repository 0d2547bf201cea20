"""Per-device GPU utilisation for the idleness agent (`NvmlUtilization`) on the simulated NVML:
whole GPUs by utilisation rates, MIG instances by GPM where the GPU has it, else unknown."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from agents.energy.wiring import gpu_device_ids
from agents.sources.gpu_activity import NvmlUtilization
from sim.nvml import SimNvml


class Clock:
    def __init__(self) -> None:
        self.now = 5000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def reader(sim: SimNvml, clock: Clock, **kw: float) -> Iterator[NvmlUtilization]:
    util = NvmlUtilization(sim, clock=clock, **kw)
    yield util
    sim.close()  # releases a hung call, so the lane's thread ends
    util.close()


@pytest.fixture
def h100(clock: Clock) -> Iterator[tuple[SimNvml, NvmlUtilization]]:
    sim = SimNvml.build("h100-node", count=2, clock=clock)
    for util in reader(sim, clock, timeout=0.5):
        yield sim, util


async def test_a_whole_gpu_reads_its_load(h100: tuple[SimNvml, NvmlUtilization]) -> None:
    sim, util = h100
    sim.set_load(0, 0)
    sim.set_load(1, 80)
    got = await util.utilization()
    gpu0, gpu1 = sim.gpus
    assert got[gpu0.uuid].percent == 0.0
    assert got["0"].percent == 0.0  # the same GPU by index
    assert got[gpu1.uuid].percent == 80.0
    assert got["1"].device == gpu1.uuid
    assert "utilisation rate" in got[gpu1.uuid].detail
    sim.set_load(1, 5)
    assert (await util.utilization())[gpu1.uuid].percent == 5.0


async def test_every_id_pod_resources_may_use_is_a_key(clock: Clock) -> None:
    sim = SimNvml.build("mixed", count=2, mig={"3g.40gb": 2}, clock=clock)
    for util in reader(sim, clock):
        got = await util.utilization()
        ids = {i for ids in gpu_device_ids(sim).values() for i in ids}
        assert set(got) == ids


async def test_mig_on_ampere_is_unknown_and_says_why(clock: Clock) -> None:
    sim = SimNvml.build("a100-node", product="NVIDIA-A100-SXM4-80GB", count=1, mig={"1g.10gb": 7})
    for util in reader(sim, clock):
        got = await util.utilization()
        for mig in sim.gpus[0].migs:
            reading = got[mig.uuid]
            assert reading.percent is None
            assert reading.device == mig.uuid
            assert reading.detail == (
                "MIG 1g.10gb on NVIDIA A100-SXM4-80GB: utilisation not measurable without GPM "
                "(Hopper or later)"
            )
        assert got[sim.gpus[0].uuid].percent is None  # whole GPU in MIG mode: not reported
        assert "MIG mode" in got[sim.gpus[0].uuid].detail


async def test_mig_on_hopper_is_measured_with_gpm_between_calls(clock: Clock) -> None:
    sim = SimNvml.build("h100-mig", count=1, mig={"3g.40gb": 2}, clock=clock)
    first, second = sim.gpus[0].migs
    sim.set_mig_load(0, first.gpu_instance_id, 70)
    sim.set_mig_load(0, second.gpu_instance_id, 0)
    for util in reader(sim, clock):
        await util.utilization()  # discovery takes the first GPM samples
        clock.now += 10
        got = await util.utilization()
        assert got[first.uuid].percent == pytest.approx(70)
        assert got[second.uuid].percent == pytest.approx(0)
        assert got[first.uuid].detail == "GPM graphics activity over 10.0s"
        assert got[sim.gpus[0].uuid].percent == pytest.approx(70 * 3 / 7)
        # The samples are kept between calls: the next reading covers the next interval.
        sim.set_mig_load(0, first.gpu_instance_id, 0)
        sim.set_mig_load(0, second.gpu_instance_id, 40)
        clock.now += 10
        got = await util.utilization()
        assert got[first.uuid].percent == pytest.approx(0)
        assert got[second.uuid].percent == pytest.approx(40)


async def test_a_call_too_soon_after_the_last_repeats_the_last_gpm_value(clock: Clock) -> None:
    sim = SimNvml.build("h100-mig2", count=1, mig={"7g.80gb": 1}, clock=clock)
    mig = sim.gpus[0].migs[0]
    sim.set_mig_load(0, mig.gpu_instance_id, 50)
    for util in reader(sim, clock):
        first = await util.utilization()
        assert first[mig.uuid].percent is None  # no interval yet
        assert "GPM" in first[mig.uuid].detail
        clock.now += 10
        assert (await util.utilization())[mig.uuid].percent == pytest.approx(50)
        sim.set_mig_load(0, mig.gpu_instance_id, 0)
        assert (await util.utilization())[mig.uuid].percent == pytest.approx(50)


async def test_a_lost_gpu_is_unknown_and_the_others_still_read(
    h100: tuple[SimNvml, NvmlUtilization],
) -> None:
    sim, util = h100
    sim.set_load(1, 60)
    await util.utilization()
    sim.inject_fault(0, "fallen-off-bus")
    got = await util.utilization()
    lost = got[sim.gpus[0].uuid]
    assert lost.percent is None
    assert "lost" in lost.detail.lower()
    assert got["0"].percent is None
    assert got[sim.gpus[1].uuid].percent == 60.0
    # Found again once it is back (after a reset), by the same IDs.
    again = await util.utilization()  # rediscovery: still lost, still keyed by its UUID
    assert again[sim.gpus[0].uuid].percent is None
    sim.recover(0)
    sim.set_load(0, 20)
    clock = sim.clock
    assert isinstance(clock, Clock)
    clock.now += 301
    assert (await util.utilization())[sim.gpus[0].uuid].percent == 20.0


async def test_a_hung_driver_is_unknown_not_an_exception(
    h100: tuple[SimNvml, NvmlUtilization],
) -> None:
    sim, util = h100
    await util.utilization()
    sim.inject_fault(1, "hang")
    got = await util.utilization()
    assert {r.percent for r in got.values()} == {None}
    assert "did not answer" in got[sim.gpus[0].uuid].detail
    busy = await util.utilization()  # the lane is still stuck: refused at once
    assert {r.percent for r in busy.values()} == {None}
    sim.recover(1)


async def test_no_driver_is_no_devices_not_an_exception() -> None:
    class NoDriver:
        def nvmlInit(self) -> None:
            import pynvml

            raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    util = NvmlUtilization(NoDriver())
    try:
        assert await util.utilization() == {}
    finally:
        util.close()


async def test_rediscovery_keeps_each_instances_gpm_samples(clock: Clock) -> None:
    sim = SimNvml.build("h100-mig3", count=1, mig={"3g.40gb": 2}, clock=clock)
    mig = sim.gpus[0].migs[0]
    sim.set_mig_load(0, mig.gpu_instance_id, 25)
    for util in reader(sim, clock, rediscover_after=60):
        await util.utilization()
        clock.now += 61  # past rediscover_after: the layout is read again
        got = await util.utilization()
        assert got[mig.uuid].percent == pytest.approx(25)  # not restarted from no sample
        assert got[mig.uuid].detail == "GPM graphics activity over 61.0s"
