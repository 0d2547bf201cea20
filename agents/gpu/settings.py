"""`agents.gpu` in the config file: intervals, the NVML watchdog, XID correlation, limits."""

from __future__ import annotations

import os
import socket
from datetime import timedelta
from pathlib import Path
from typing import Literal

from agents.gpu.amd_health import AmdLimits
from agents.gpu.health import Limits
from agents.sources.podresources import DEFAULT_SOCKET
from nodeward.config import Section
from nodeward.durations import Duration


class GpuAgentSettings(Section):
    """`agents.gpu`: intervals, the NVML watchdog, XID correlation and counter limits."""

    node: str | None = None
    backend: Literal["nvml", "amdsmi", "auto"] = "auto"
    """The GPU library: NVML (NVIDIA), AMD SMI (AMD), or `auto`: whichever sees GPUs."""
    heartbeat_interval: Duration = timedelta(seconds=30)
    telemetry_interval: Duration = timedelta(seconds=15)
    poll_interval: Duration = timedelta(seconds=10)
    call_timeout: Duration = timedelta(seconds=5)
    init_timeout: Duration = timedelta(seconds=60)
    """Start-up calls (init, device count, event set): without persistence mode the driver
    sets every GPU up on first open, which takes seconds, so `call_timeout` is too short."""
    xid_window: Duration = timedelta(seconds=10)
    xid_hold: Duration = timedelta(minutes=30)
    ecc_corrected_limit: int = 10_000
    retired_pages_limit: int = 60
    nvlink_error_limit: int = 100
    pcie_replay_limit: int = 1_000
    amd_bad_page_limit: int = 128
    amd_reset_limit: int = 3
    pod_resources_socket: Path = DEFAULT_SOCKET
    pod_resources_timeout: Duration = timedelta(seconds=5)
    kernel_log: Literal["auto", "kmsg", "file", "off"] = "auto"
    """The second XID detector: `kmsg` reads `kmsg_path`, `file` tails `kernel_log_file`,
    `auto` reads kmsg where it opens and else tails the file where one is given, `off`."""
    kmsg_path: Path = Path("/dev/kmsg")
    kernel_log_file: Path | None = None
    """A text log holding the kernel's lines (e.g. /var/log/kern.log, a journal export)."""
    kernel_log_interval: Duration = timedelta(milliseconds=200)
    detector_window: Duration = timedelta(seconds=30)
    """An XID the other detector reports within this of the first sighting confirms it."""
    confirm_wait: Duration = timedelta(seconds=1)
    """How long `gpu.xid` waits for the other detector's confirmation before it is published
    (the health change never waits)."""

    def node_name(self) -> str:
        return self.node or os.environ.get("NODE_NAME") or socket.gethostname()

    def limits(self) -> Limits:
        return Limits(
            ecc_corrected_volatile=self.ecc_corrected_limit,
            retired_pages=self.retired_pages_limit,
            nvlink_errors=self.nvlink_error_limit,
            pcie_replays=self.pcie_replay_limit,
        )

    def amd_limits(self) -> AmdLimits:
        return AmdLimits(
            ecc_corrected=self.ecc_corrected_limit,
            bad_pages=self.amd_bad_page_limit,
            resets=self.amd_reset_limit,
        )
