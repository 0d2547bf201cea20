"""A fake `/dev/kmsg` for a simulated node: the driver's XID lines, as the kernel logs them.

`SimKmsg` appends records in `/dev/kmsg`'s form (`priority,sequence,timestamp_us,flags;msg`
and dictionary lines) to a regular file, which the GPU agent reads as its kernel log
(`agents.gpu.kernel_log: kmsg`, `kmsg_path: <file>`). The lines follow what the driver
prints (see `agents.sources.kmsg`), in the form of the driver generation asked for: the
`NVRM: GPU at PCI:...: GPU-<uuid>` line once per GPU before its first XID, then
`NVRM: Xid (PCI:dddd:bb:dd): <xid>, ...`, and for XID 79 the `GPU has fallen off the bus.`
line after it.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from sim.nvml import SimNvml

# Driver generations and the process part of their XID lines.
STYLES = ("r470", "r535", "r550")
_TEXT = {
    79: "GPU has fallen off the bus.",
    13: "Graphics SM Warp Exception on (GPC 1, TPC 3, SM 0): Out Of Range Address",
    31: "MMU Fault: ENGINE GRAPHICS GPC1 GPCCLIENT_T1_3 faulted @ 0x7e9f_4f200000. "
    "Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ",
    48: "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer "
    "at partition 1, subpartition 0.",
    94: "Contained: CE User Channel (0x9). RST: No, D-RST: No",
    95: "Uncontained: FBHUB. RST: Yes, D-RST: No",
    154: "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
}
_LEVEL_ERR = 3  # pr_err, facility kern


class SimKmsg:
    """The kernel log of one simulated node, written to `path` (thread-safe)."""

    def __init__(self, path: Path, sim: SimNvml) -> None:
        self.path = path
        self.sim = sim
        self._lock = threading.Lock()
        self._sequence = 0
        self._named: set[int] = set()
        self._start = time.monotonic()
        path.touch()

    def _bus(self, index: int) -> str:
        if not 0 <= index < len(self.sim.gpus):
            raise ValueError(
                f"node {self.sim.node} has no GPU {index} (it has {len(self.sim.gpus)})"
            )
        # NVML's "00000000:18:00.0" is the kernel's "0000:18:00"
        domain, bus, device = self.sim.gpus[index].pci_bus_id.split(".", 1)[0].split(":")
        return f"{int(domain, 16):04x}:{int(bus, 16):02x}:{int(device, 16):02x}"

    def write(self, message: str, *, dictionary: dict[str, str] | None = None) -> None:
        """Append one record (newlines in `message` escaped as the kernel does)."""
        with self._lock:
            self._sequence += 1
            us = int((time.monotonic() - self._start) * 1e6)
            text = message.replace("\\", "\\x5c").replace("\n", "\\x0a")
            record = f"{_LEVEL_ERR},{self._sequence},{us},-;{text}\n"
            record += "".join(f" {k}={v}\n" for k, v in (dictionary or {}).items())
            with self.path.open("a") as f:
                f.write(record)

    def xid(
        self,
        index: int,
        xid: int,
        *,
        style: str = "r550",
        pid: int | None = 4242,
        process: str = "python3",
        gpu_instance_id: int | None = None,
    ) -> str:
        """Log XID `xid` on GPU `index` as driver generation `style` prints it; returns the line."""
        if style not in STYLES:
            raise ValueError(f"unknown driver style {style!r}; known: {', '.join(STYLES)}")
        bus = self._bus(index)
        gpu = self.sim.gpus[index]
        if index not in self._named:
            self.write(f"NVRM: GPU at PCI:{bus}: {gpu.uuid}")
            self._named.add(index)
        where = f"PCI:{bus}" + (
            f" GPU-I:{gpu_instance_id:02d}" if gpu_instance_id is not None else ""
        )
        pid_text = str(pid) if pid is not None else "'<unknown>'"
        name = process if pid is not None else "<unknown>"
        text = _TEXT.get(xid, f"Xid {xid} reported by the simulated driver")
        if style == "r470":
            line = f"NVRM: Xid ({where}): {xid}, pid={pid_text}, {text}"
        elif style == "r535":
            line = f"NVRM: Xid ({where}): {xid}, pid={pid_text}, name={name}, {text}"
        else:
            line = f"NVRM: Xid ({where}): {xid}, pid={pid_text}, name={name}, Ch 00000008, {text}"
        self.write(line, dictionary={"SUBSYSTEM": "pci", "DEVICE": f"+pci:{bus}.0"})
        if xid == 79:
            self.write(f"NVRM: GPU {bus}.0: GPU has fallen off the bus.")
        return line
