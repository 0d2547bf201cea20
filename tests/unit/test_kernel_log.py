"""The kernel-log detector's parsing and reading: real driver lines of several generations,
`/dev/kmsg` records, syslog files, and the merge of two detectors' sightings."""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest

from agents.gpu.detectors import KMSG, NVML, IncidentMerger
from agents.sources.kmsg import (
    DriverLineParser,
    FileTail,
    KernelLogError,
    KmsgReader,
    from_kernel,
    open_kernel_log,
    parse_record,
    pci_key,
    split_records,
)

DATA = Path(__file__).parent.parent / "data" / "kernel_log"
LINES = [json.loads(x) for x in (DATA / "driver_xid_lines.jsonl").read_text().splitlines() if x]


@pytest.mark.parametrize("case", LINES, ids=[f"{c['driver']}: {c['xid']}" for c in LINES])
def test_every_driver_generation_line_is_parsed(case: dict[str, Any]) -> None:
    found = DriverLineParser().feed(case["line"])
    assert len(found) == 1, case["line"]
    x = found[0]
    assert x.xid == case["xid"]
    assert x.pci_key == tuple(case["pci"])
    assert x.form == case.get("form", "xid")
    assert x.pid == case.get("pid")
    assert x.process == case.get("process")
    assert x.channel == case.get("channel")
    assert x.gpu_instance_id == case.get("gpu_instance_id")
    assert x.compute_instance_id == case.get("compute_instance_id")
    assert x.recovery_action == case.get("recovery_action")
    assert "NVRM" in x.text


@pytest.mark.parametrize("line", (DATA / "not_xid_lines.txt").read_text().splitlines())
def test_lines_that_are_not_xids_are_not(line: str) -> None:
    assert DriverLineParser().feed(line) == []


def test_pci_addresses_of_kernel_and_nvml_agree() -> None:
    assert pci_key("0000:3b:00") == pci_key("00000000:3B:00.0") == pci_key("PCI:0000:3b:00.0")
    assert pci_key("0018:01:00") == (0x18, 1, 0)
    assert pci_key("3b:00.0") == (0, 0x3B, 0)
    assert pci_key("GPU-123") is None and pci_key(None) is None and pci_key("") is None


def test_kmsg_records_with_dictionary_and_escaped_newlines() -> None:
    raw, left = split_records((DATA / "kmsg_records.txt").read_text())
    assert left == ""
    records = [parse_record(r) for r in raw]
    assert all(r is not None for r in records)
    assert [r.sequence for r in records if r] == list(range(1201, 1209))
    xid = records[3]
    assert xid is not None and xid.level == 4 and xid.facility == 0
    assert xid.timestamp_us == 5123500020
    assert xid.dictionary == {"SUBSYSTEM": "pci", "DEVICE": "+pci:0000:3b:00.0"}
    probe = records[5]
    assert probe is not None and probe.message.count("\n") == 2

    parser = DriverLineParser()
    found = [x for r in records if r for x in parser.feed(r.message)]
    # XID 79 and the driver's "GPU has fallen off the bus." line after it are one loss.
    assert [(x.xid, x.pci, x.form) for x in found] == [
        (79, "0000:3b:00", "xid"),
        (79, "0000:5e:00.0", "probe_fallen"),
        (13, "0000:86:00", "xid"),
    ]
    # The driver named the GPU at 3b before its XID: the XID carries its UUID.
    assert found[0].uuid == "GPU-5d3c1b2a-8f4e-4a7b-9c6d-0e1f2a3b4c5d"
    assert (found[2].gpu_instance_id, found[2].compute_instance_id, found[2].pid) == (2, 0, 4242)


def test_a_loss_long_after_the_last_is_reported_again() -> None:
    parser = DriverLineParser(loss_lines=2)
    line = "NVRM: GPU 0000:29:00.0: GPU has fallen off the bus."
    assert len(parser.feed(line)) == 1
    assert parser.feed(line) == []
    for _ in range(3):
        parser.feed("something else")
    assert len(parser.feed(line)) == 1


def test_records_not_in_kmsg_form_are_refused() -> None:
    assert parse_record("no semicolon here") is None
    assert parse_record("a,b,c,-;text") is None
    assert parse_record("6,1;text") is None


def test_a_split_record_waits_for_its_end() -> None:
    raw, left = split_records("4,1,2,-;NVRM: Xid (PCI:0000:3b:00): 4")
    assert raw == [] and left.startswith("4,1,2")
    raw, left = split_records(left + "8, pid=1, x\n SUBSYSTEM=pci\n")
    assert left == ""
    record = parse_record(raw[0])
    assert record is not None and record.message.endswith("48, pid=1, x")


@pytest.mark.parametrize(
    "line",
    [
        "Nov 30 21:00:01 gpu-node-07 user: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.",
        "Nov 30 21:00:01 gpu-node-07 alice[4242]: NVRM: Xid (PCI:0000:3b:00): 79, x",
        "Nov 30 21:00:01 gpu-node-07 user: [1] NVRM: Xid (PCI:0000:3b:00): 79, x",
        "Nov 30 21:00:01 gpu-node-07 user: kernel: NVRM: Xid (PCI:0000:3b:00): 79, x",
    ],
)
def test_a_users_forged_line_in_a_syslog_file_is_not_the_kernel(line: str) -> None:
    assert not from_kernel(line)


def test_the_kernels_lines_in_every_text_form_are() -> None:
    lines = [c["line"] for c in LINES] + (DATA / "syslog_lines.txt").read_text().splitlines()
    assert all(from_kernel(line) for line in lines)
    assert from_kernel("Sep 27 10:00:01 dgx kernel: NVRM: Xid (PCI:000f:01:00): 43, pid=1234")


def test_kmsg_reader_passes_only_the_kernels_records(tmp_path: Path) -> None:
    path = _written(tmp_path / "kmsg", "")
    reader = KmsgReader(path)
    try:
        _append(
            path,
            "12,1,1,-;NVRM: Xid (PCI:0000:3b:00): 79, forged by a process\n",
            "3,2,2,-;NVRM: Xid (PCI:0000:3b:00): 79, the driver\n",
        )
        assert reader.messages() == ["NVRM: Xid (PCI:0000:3b:00): 79, the driver"]
    finally:
        reader.close()


def test_a_syslog_file_splits_the_probe_loss_over_lines() -> None:
    parser = DriverLineParser()
    found = [
        x
        for line in (DATA / "syslog_lines.txt").read_text().splitlines()
        for x in parser.feed(line)
    ]
    assert [(x.xid, x.pci_key, x.form) for x in found] == [
        (48, (0, 0x3B, 0), "xid"),
        (79, (0, 0x5E, 0), "probe_fallen"),
    ]
    assert found[0].uuid == "GPU-5d3c1b2a-8f4e-4a7b-9c6d-0e1f2a3b4c5d"
    assert found[0].process == "python3" and found[0].channel == "00000008"


def test_a_probe_head_without_its_tail_is_forgotten() -> None:
    parser = DriverLineParser(probe_lines=2)
    assert parser.feed("NVRM: The NVIDIA GPU 0000:5e:00.0") == []
    assert parser.feed("unrelated") == []
    assert parser.feed("unrelated") == []
    assert parser.feed("NVRM: fallen off the bus and is not responding to commands.") == []


def _written(path: Path, text: str) -> Path:
    """`path`, holding `text` (what was logged before the test)."""
    path.write_text(text)
    return path


def _append(path: Path, *texts: str) -> None:
    """`texts` written to the end of `path`, as a logger would."""
    with path.open("a") as f:
        f.writelines(texts)


def test_kmsg_reader_reads_only_what_is_logged_after_it_opens(tmp_path: Path) -> None:
    path = _written(tmp_path / "kmsg", "6,1,1,-;old record\n")
    reader = KmsgReader(path)
    try:
        assert reader.read() == []
        _append(
            path,
            "4,2,2,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\n",
            " SUBSYSTEM=pci\n",
            "4,3,3,-;NVRM: Xid (PCI:0000:3b:00): 4",  # cut short
        )
        records = reader.read()
        assert [r.sequence for r in records] == [2]
        assert records[0].dictionary == {"SUBSYSTEM": "pci"}
        _append(path, "3, pid=1, x\n")
        assert [r.message for r in reader.read()] == ["NVRM: Xid (PCI:0000:3b:00): 43, pid=1, x"]
        assert reader.read() == []
    finally:
        reader.close()


def test_kmsg_reader_can_start_at_the_oldest_record(tmp_path: Path) -> None:
    path = _written(tmp_path / "kmsg", "6,1,1,-;first\n6,2,2,-;second\n")
    reader = KmsgReader(path, from_start=True)
    try:
        assert [r.message for r in reader.read()] == ["first", "second"]
    finally:
        reader.close()


def test_dev_kmsg_itself_opens_and_reads_without_blocking() -> None:
    try:
        reader = KmsgReader(Path("/dev/kmsg"))
    except KernelLogError as exc:
        pytest.skip(f"/dev/kmsg not readable here: {exc}")
    try:
        reader.read()  # whatever the kernel logs meanwhile; it must return, not block
        assert reader.stats.lost >= 0
    finally:
        reader.close()


async def test_dev_kmsg_wakes_the_loop_with_one_record_per_read() -> None:
    """The real device: a harmless marker line (never an NVRM line) written to the host's
    kernel log wakes an `add_reader` callback and comes back as one parsed record."""
    try:
        reader = KmsgReader(Path("/dev/kmsg"))
        writer = os.open("/dev/kmsg", os.O_WRONLY)
    except (KernelLogError, OSError) as exc:
        pytest.skip(f"/dev/kmsg not readable and writable here: {exc}")
    marker = f"nodeward test: kmsg reader check {uuid.uuid4().hex}"
    loop = asyncio.get_running_loop()
    woke = asyncio.Event()
    try:
        assert reader.is_device
        reader.read()
        loop.add_reader(reader.fileno(), woke.set)
        os.write(writer, f"<6>{marker}\n".encode())
        await asyncio.wait_for(woke.wait(), 5)
        records = [r for r in reader.read() if r.message == marker]
        assert len(records) == 1
        assert records[0].level == 6 and records[0].sequence > 0 and records[0].timestamp_us > 0
        # A process's line gets the user facility, whatever it asks: never the kernel's.
        assert records[0].facility == 1
        os.write(writer, f"<3>{marker} again\n".encode())
        await asyncio.sleep(0)
        assert all(marker not in m for m in reader.messages())
        assert reader.read() == [] or all(r.message != marker for r in reader.read())
    finally:
        loop.remove_reader(reader.fileno())
        os.close(writer)
        reader.close()


def test_file_tail_follows_appends_truncation_and_rotation(tmp_path: Path) -> None:
    path = _written(tmp_path / "kern.log", "before\n")
    tail = FileTail(path)
    try:
        assert tail.read() == []
        _append(path, "one\ntw")
        assert tail.read() == ["one"]
        _append(path, "o\n")
        assert tail.read() == ["two"]
        path.write_text("")  # truncated (copytruncate)
        assert tail.read() == []
        path.write_text("three\n")
        assert tail.read() == ["three"]
        _append(path, "last of the old\n")
        os.rename(path, tmp_path / "kern.log.1")
        path.write_text("first of the new\n")
        assert tail.read() == ["last of the old", "first of the new"]
    finally:
        tail.close()


def test_open_kernel_log_falls_back_to_the_file(tmp_path: Path) -> None:
    log = tmp_path / "kern.log"
    log.write_text("")
    missing = tmp_path / "no-kmsg"
    assert open_kernel_log("off", missing, log) is None
    auto = open_kernel_log("auto", missing, log)
    assert isinstance(auto, FileTail)
    auto.close()
    with pytest.raises(KernelLogError):
        open_kernel_log("auto", missing, None)
    with pytest.raises(KernelLogError):
        open_kernel_log("kmsg", missing, log)
    with pytest.raises(KernelLogError, match="no kernel_log_file"):
        open_kernel_log("file", missing, None)


def test_merge_whichever_first_the_other_confirms() -> None:
    m = IncidentMerger(window=30)
    first = m.observe(0, 79, KMSG, at=100.0)
    assert first.new and first.incident.detectors == [KMSG]
    second = m.observe(0, 79, NVML, at=100.2)
    assert not second.new and second.incident is first.incident
    assert first.incident.detectors == [KMSG, NVML] and first.incident.confirmed


def test_merge_keeps_gpus_and_xids_apart() -> None:
    m = IncidentMerger(window=30)
    a = m.observe(0, 79, NVML, at=0)
    assert m.observe(1, 79, KMSG, at=0).incident is not a.incident
    assert m.observe(0, 48, KMSG, at=0).incident is not a.incident
    assert m.observe(0, 79, KMSG, at=0).incident is a.incident


def test_a_repeated_xid_pairs_nth_with_nth() -> None:
    m = IncidentMerger(window=30)
    one = m.observe(0, 13, NVML, at=0).incident
    two = m.observe(0, 13, NVML, at=1).incident
    assert one is not two  # the XID happened twice
    assert m.observe(0, 13, KMSG, at=1.1).incident is one
    assert m.observe(0, 13, KMSG, at=1.2).incident is two
    assert m.observe(0, 13, KMSG, at=1.3).new  # a third time, NVML has not said so yet


def test_a_sighting_after_the_window_is_a_new_incident() -> None:
    m = IncidentMerger(window=30)
    first = m.observe(0, 79, NVML, at=0).incident
    late = m.observe(0, 79, KMSG, at=31)
    assert late.new and late.incident is not first
    m.forget(0)
    assert m.observe(0, 79, NVML, at=32).new


def test_the_story_says_when_the_kernel_log_saw_an_xid_first() -> None:
    from datetime import UTC, datetime

    from launch.story import health_line
    from schemas import make_event
    from schemas.gpu import GpuHealth, HealthReason, HealthState

    def line(detectors: list[str]) -> str | None:
        data = GpuHealth(
            node="gpu-a",
            gpu_index=0,
            gpu_uuid="GPU-0",
            state=HealthState.FAILED,
            previous_state=HealthState.HEALTHY,
            reasons=[HealthReason(code="xid", xid=79, message="fallen off", detectors=detectors)],
            observed_at=datetime.now(UTC),
        )
        return health_line(make_event(data, source="agent/gpu/gpu-a"), "gpu.health.gpu-a.0")

    assert "XID 79 (kernel log): fallen off" in (line(["kmsg"]) or "")
    assert "XID 79: fallen off" in (line(["nvml", "kmsg"]) or "")
    assert "XID 79: fallen off" in (line([]) or "")
