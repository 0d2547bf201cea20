"""Reading the kernel log for the NVIDIA driver's XID reports: `/dev/kmsg`, or a file tail.

Two parts. The parsing is pure: `parse_record` reads one `/dev/kmsg` record
(`priority,sequence,timestamp_us,flags[,...];message`, then dictionary lines that start with a
space; bytes outside printable ASCII arrive escaped as `\\xNN`), and `DriverLineParser` finds
in messages what the driver (`NVRM:`) says about a GPU, in the forms several driver
generations print:

- `NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.` (no process: older drivers)
- `NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.`
- `NVRM: Xid (PCI:0000:b5:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp ...`
  (R525+, open kernel modules), `..., name=python, Ch 00000008, intr 10000000. MMU Fault ...`
  (R535+), and on a MIG GPU `(PCI:0000:01:00 GPU-I:05)` / `(... GPU-I:01 GPU-CI:02)`;
- NVLink5 XIDs 144-150: `NVRM: Xid (PCI:0018:01:00): 149, NETIR_LINK_EVT  Fatal  XC0 i0 Link 09 (...)`;
- `NVRM: GPU at PCI:0000:3b:00: GPU-<uuid>`: the driver names the GPU at a bus address
  (printed once, before its first XID);
- the loss of a GPU without an XID line: `NVRM: GPU 0000:3b:00.0: GPU has fallen off the bus.`
  (R5xx), `NVRM: GPU at PCI:0000:3b:00: GPU has fallen off the bus.` (older), and at probe
  `NVRM: The NVIDIA GPU 0000:3b:00.0 / (PCI ID: 10de:2330) installed in this system has /
  fallen off the bus and is not responding to commands.` (one record, or three lines in a
  syslog file). NVSentinel's syslog monitor reports these as a fatal GPU_FALLEN_OFF_BUS
  (restart the machine); here they count as XID 79, whose catalog action is that reboot, so
  they merge with the XID 79 NVML reports.

The reading is non-blocking I/O: `KmsgReader` (the `/dev/kmsg` device, or a regular file
holding records in its format, as the simulator writes) and `FileTail` (plain syslog lines,
e.g. a journal export); both start at the end, so only what is logged after they open is read,
and both pass on only what the kernel itself logged (`KmsgReader.messages`, `from_kernel`).
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

FALLEN_OFF_BUS_XID = 79

_ESCAPE = re.compile(r"\\x([0-9a-fA-F]{2})")
_ADDR = r"[0-9a-fA-F]{1,8}:[0-9a-fA-F]{2}(?::[0-9a-fA-F]{2})?(?:\.[0-7])?"
# "(PCI:dddd:bb:dd)", sometimes with ".f"; on MIG then " GPU-I:nn" and " GPU-CI:nn";
# the oldest drivers print "(bb:dd)" with no "PCI:" and no domain.
_XID = re.compile(
    rf"NVRM: Xid \((?:PCI:)?(?P<pci>{_ADDR})"
    r"(?: GPU-I:(?P<gi>\d+))?(?: GPU-CI:(?P<ci>\d+))?\): (?P<xid>\d+)\b(?P<rest>.*)",
    re.DOTALL,
)
_PID = re.compile(r"^, pid=(?P<pid>'<unknown>'|\d+)")
_NAME = re.compile(r"^, name=(?P<name>[^,]*)")
_CHANNEL = re.compile(r"^, Ch (?P<ch>[0-9a-fA-F]+)")
_RECOVERY = re.compile(
    r"GPU recovery action changed from 0x[0-9a-fA-F]+ \([^)]*\) to 0x(?P<to>[0-9a-fA-F]+)"
)
_MAP = re.compile(r"NVRM: GPU at PCI:(?P<pci>[0-9a-fA-F:.]+): (?P<uuid>GPU-[0-9a-fA-F-]+)")
_FELL = re.compile(
    rf"NVRM: GPU (?:at PCI:)?(?P<pci>{_ADDR}): "
    r"GPU has fallen off the bus"
)
_PROBE_HEAD = re.compile(r"NVRM: The NVIDIA GPU (?P<pci>[0-9a-fA-F:.]+)")
_PROBE_TAIL = "fallen off the bus and is not responding to commands"


# What may stand before "NVRM:" on a line the kernel wrote: nothing or dmesg's "[ 123.4]"
# / "[Sat Oct 12 18:35:32 2024]"; in a syslog file, a time, the host and the tag "kernel:"
# (then perhaps the kernel's own timestamp). Anything else (`logger "NVRM: Xid ..."` run by
# a user arrives as "host user: NVRM: ...") is not the driver speaking.
_KERNEL_PREFIX = re.compile(
    r"^(?:\[[^\]]*\]"
    r"|(?:[A-Z][a-z]{2} +\d+ [\d:.]+|\d{4}-\d\d-\d\dT\S+) \S+ kernel:(?: \[[^\]]*\])?)?$"
)
KERN_FACILITY = 0


def from_kernel(line: str) -> bool:
    """Whether a text-log line's `NVRM:` message is the kernel's (see `_KERNEL_PREFIX`);
    lines without `NVRM:` pass (a multi-line report's other lines)."""
    at = line.find("NVRM:")
    return at < 0 or _KERNEL_PREFIX.match(line[:at].strip()) is not None


def pci_key(address: str | None) -> tuple[int, int, int] | None:
    """(domain, bus, device) of a PCI address as the kernel (`0000:3b:00`, `0000:3b:00.0`) or
    NVML (`00000000:3B:00.0`) prints it; None when it is not one."""
    if not address:
        return None
    parts = address.strip().removeprefix("PCI:").split(".", 1)[0].split(":")
    if len(parts) == 2:
        parts.insert(0, "0")
    if len(parts) != 3:
        return None
    try:
        domain, bus, device = (int(p, 16) for p in parts)
    except ValueError:
        return None
    return (domain, bus, device)


@dataclass(frozen=True)
class KmsgRecord:
    """One `/dev/kmsg` record."""

    facility: int
    level: int
    sequence: int
    timestamp_us: int
    message: str
    dictionary: dict[str, str] = field(default_factory=dict)


def parse_record(raw: str) -> KmsgRecord | None:
    """One record (`priority,sequence,timestamp_us,flags[,...];message` and dictionary lines);
    None when it is not in that form."""
    head, sep, rest = raw.partition(";")
    if not sep:
        return None
    fields = head.split(",")
    if len(fields) < 3:
        return None
    try:
        priority, sequence, timestamp = (int(f) for f in fields[:3])
    except ValueError:
        return None
    lines = rest.rstrip("\n").split("\n")
    dictionary = {}
    for line in lines[1:]:
        key, eq, value = line.strip().partition("=")
        if eq:
            dictionary[key] = _unescape(value)
    return KmsgRecord(
        facility=priority >> 3,
        level=priority & 7,
        sequence=sequence,
        timestamp_us=timestamp,
        message=_unescape(lines[0]),
        dictionary=dictionary,
    )


def _unescape(text: str) -> str:
    return _ESCAPE.sub(lambda m: chr(int(m[1], 16)), text)


def split_records(buffer: str) -> tuple[list[str], str]:
    """The complete records in `buffer` (a record's dictionary lines start with a space) and
    what is left over: a line cut short, with the record it continues."""
    lines = buffer.split("\n")
    tail = lines.pop()  # after the last newline: incomplete
    records: list[list[str]] = []
    for line in lines:
        if line.startswith(" ") and records:
            records[-1].append(line)
        elif line:
            records.append([line])
    left = tail
    if tail.startswith(" ") and records:
        left = "\n".join(records.pop()) + "\n" + tail
    return ["\n".join(r) + "\n" for r in records], left


@dataclass(frozen=True)
class DriverXid:
    """An XID (or the loss of a GPU, as XID 79) the driver wrote in the kernel log."""

    pci: str
    xid: int
    text: str
    form: str
    """`xid`, `fallen_off_bus` (the `GPU has fallen off the bus.` line) or `probe_fallen`."""
    pid: int | None = None
    process: str | None = None
    channel: str | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    recovery_action: int | None = None
    """XID 154: the recovery action the driver changed to."""
    uuid: str | None = None
    """The GPU's UUID, where the driver named it at this address (`NVRM: GPU at PCI:...`)."""

    @property
    def pci_key(self) -> tuple[int, int, int] | None:
        return pci_key(self.pci)


@dataclass
class DriverLineParser:
    """Finds driver XIDs in kernel-log messages, one message at a time.

    Keeps what it needs across messages: the UUIDs the driver named per bus address, and a
    probe-time loss report (`The NVIDIA GPU ...` then `fallen off the bus ...`) that a syslog
    file splits over lines, for up to `probe_lines` messages.
    """

    probe_lines: int = 4
    loss_lines: int = 16
    """A GPU's loss is reported once: the driver prints XID 79 and then `GPU has fallen off
    the bus.`; a second report of it within this many messages is the same loss."""
    uuids: dict[tuple[int, int, int], str] = field(default_factory=dict)
    _probe: tuple[str, int] | None = None
    _lost: dict[tuple[int, int, int], int] = field(default_factory=dict)
    _count: int = 0

    def feed(self, message: str) -> list[DriverXid]:
        """The XIDs in one message (a `/dev/kmsg` record may hold several lines)."""
        self._count += 1
        found = self._feed(message)
        out = []
        for x in found:
            key = x.pci_key
            if x.xid == FALLEN_OFF_BUS_XID and key is not None:
                last = self._lost.get(key)
                self._lost[key] = self._count
                if last is not None and self._count - last <= self.loss_lines:
                    continue
            out.append(x)
        return out

    def _feed(self, message: str) -> list[DriverXid]:
        if "NVRM" not in message and self._probe is None:
            return []
        text = message.replace("#012", "\n")  # rsyslog's escaped newline
        out: list[DriverXid] = []
        for m in _MAP.finditer(text):
            key = pci_key(m["pci"])
            if key is not None:
                self.uuids[key] = m["uuid"]
        xid = _XID.search(text)
        if xid is not None:
            self._probe = None
            out.append(self._xid(xid, text))
            return out
        fell = _FELL.search(text)
        if fell is not None:
            out.append(self._fallen(fell["pci"], text, "fallen_off_bus"))
        head = _PROBE_HEAD.search(text)
        if head is not None:
            if _PROBE_TAIL in text[head.end() :]:
                out.append(self._fallen(head["pci"], text, "probe_fallen"))
                self._probe = None
            else:
                self._probe = (head["pci"], self.probe_lines)
        elif self._probe is not None:
            pci, left = self._probe
            if _PROBE_TAIL in text:
                out.append(self._fallen(pci, text, "probe_fallen"))
                self._probe = None
            else:
                self._probe = (pci, left - 1) if left > 1 else None
        return out

    def _uuid(self, pci: str) -> str | None:
        key = pci_key(pci)
        return self.uuids.get(key) if key else None

    def _fallen(self, pci: str, text: str, form: str) -> DriverXid:
        return DriverXid(
            pci=pci, xid=FALLEN_OFF_BUS_XID, text=text.strip(), form=form, uuid=self._uuid(pci)
        )

    def _xid(self, m: re.Match[str], text: str) -> DriverXid:
        rest = m["rest"]
        pid: int | None = None
        process: str | None = None
        channel: str | None = None
        if found := _PID.match(rest):
            pid = int(found["pid"]) if found["pid"].isdigit() else None
            rest = rest[found.end() :]
        if found := _NAME.match(rest):
            name = found["name"].strip()
            process = None if name in ("<unknown>", "'<unknown>'", "") else name
            rest = rest[found.end() :]
        if found := _CHANNEL.match(rest):
            channel = found["ch"]
        recovery = _RECOVERY.search(m["rest"])
        return DriverXid(
            pci=m["pci"],
            xid=int(m["xid"]),
            text=text[m.start() :].strip(),
            form="xid",
            pid=pid,
            process=process,
            channel=channel,
            gpu_instance_id=int(m["gi"]) if m["gi"] is not None else None,
            compute_instance_id=int(m["ci"]) if m["ci"] is not None else None,
            recovery_action=int(recovery["to"], 16) if recovery else None,
            uuid=self._uuid(m["pci"]),
        )


# -- reading ------------------------------------------------------------------------------


class KernelLogError(OSError):
    """The kernel log cannot be opened or read."""


@dataclass
class ReadStats:
    records: int = 0
    lost: int = 0
    """Times records were overwritten before they were read (`EPIPE` from `/dev/kmsg`)."""


class KmsgReader:
    """Non-blocking reader of `/dev/kmsg` (one record per read), or of a regular file holding
    records in its format (several per read). Starts at the end of the buffer, or with
    `from_start` at the oldest record it still holds."""

    def __init__(self, path: Path, *, chunk: int = 8192, from_start: bool = False) -> None:
        self.path = path
        self.chunk = chunk
        self.stats = ReadStats()
        self._left = ""
        try:
            self._fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            raise KernelLogError(exc.errno, f"cannot open {path}: {exc.strerror}") from exc
        os.lseek(self._fd, 0, os.SEEK_SET if from_start else os.SEEK_END)
        self.is_device = stat.S_ISCHR(os.fstat(self._fd).st_mode)

    def fileno(self) -> int:
        return self._fd

    def read(self) -> list[KmsgRecord]:
        """Every record logged since the last read (never blocks)."""
        text: list[str] = []
        while True:
            try:
                data = os.read(self._fd, self.chunk)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:  # overwritten before read: go on from the next
                    self.stats.lost += 1
                    continue
                if exc.errno == errno.EINTR:
                    continue
                raise KernelLogError(exc.errno, f"cannot read {self.path}: {exc.strerror}") from exc
            if not data:
                break  # a regular file at its end
            text.append(data.decode("utf-8", errors="replace"))
        raw, self._left = split_records(self._left + "".join(text))
        out = [r for r in (parse_record(x) for x in raw) if r is not None]
        self.stats.records += len(out)
        return out

    def messages(self) -> list[str]:
        """The messages the kernel logged: a process writing to /dev/kmsg gets a user
        facility, never the kernel's, so it cannot pass for the driver."""
        return [r.message for r in self.read() if r.facility == KERN_FACILITY]

    def close(self) -> None:
        os.close(self._fd)


class FileTail:
    """Non-blocking tail of a text log (syslog, a journal export): the lines appended since
    the last read. Follows truncation and rotation (a new file at the path)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.stats = ReadStats()
        self._left = ""
        try:
            self._file = open(path, "rb")  # noqa: SIM115 - kept open across reads
        except OSError as exc:
            raise KernelLogError(exc.errno, f"cannot open {path}: {exc.strerror}") from exc
        self._file.seek(0, os.SEEK_END)
        self._inode = os.fstat(self._file.fileno()).st_ino

    def _reopen_if_rotated(self) -> None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return
        if st.st_ino != self._inode:
            rest = self._file.read()  # what the old file got before it was moved
            self._left += rest.decode("utf-8", errors="replace")
            self._file.close()
            self._file = open(self.path, "rb")  # noqa: SIM115
            self._inode = st.st_ino
        elif st.st_size < self._file.tell():
            self._file.seek(0)
            self._left = ""

    def read(self) -> list[str]:
        self._reopen_if_rotated()
        data = self._file.read()
        text = self._left + data.decode("utf-8", errors="replace")
        lines = text.split("\n")
        self._left = lines.pop()
        self.stats.records += len(lines)
        return [line for line in lines if line]

    def messages(self) -> list[str]:
        """The lines the kernel logged (see `from_kernel`)."""
        return [line for line in self.read() if from_kernel(line)]

    def close(self) -> None:
        self._file.close()


def open_kernel_log(mode: str, kmsg: Path, file: Path | None) -> KmsgReader | FileTail | None:
    """The kernel log to read: `kmsg` (the device, or a file in its record format), `file`
    (a tail of plain lines), `auto` (kmsg where it opens, else the file where one is given),
    or `off` (None). Raises KernelLogError where the chosen one cannot be opened."""
    if mode == "off":
        return None
    if mode == "kmsg":
        return KmsgReader(kmsg)
    if mode == "file":
        if file is None:
            raise KernelLogError(errno.EINVAL, "kernel_log is 'file' but no kernel_log_file given")
        return FileTail(file)
    try:
        return KmsgReader(kmsg)
    except KernelLogError:
        if file is None:
            raise
        return FileTail(file)


def driver_xids(parser: DriverLineParser, messages: Iterable[str]) -> list[DriverXid]:
    return [x for m in messages for x in parser.feed(m)]
