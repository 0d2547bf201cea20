"""A real BMC for tests: OpenIPMI's `ipmi_sim` on loopback (`sim.ipmi_sim`, which `nodeward
up` runs too, says what it does to the machine, as measured), serving power sensors in Watts,
and, given a `Machine`, chassis power over a process it runs; here with pytest's skip when a
program is missing, its fixtures and a dummy machine.

Import `ipmi_sim` (module-scoped fixture) or build an `IpmiSim` yourself:

    from tests.ipmi_sim import IpmiSim, ipmi_sim  # noqa: F401

The `power_bmc` fixture starts one with chassis power and stops it (and its machine) after
the test: `bmc = power_bmc(dummy_machine(tmp_path / "boot"))`, or any argv, e.g.
`python -m launch.sim_node --node N --kubeconfig K --vm {vm}`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sim import ipmi_sim as _sim
from sim.ipmi_sim import (  # noqa: F401 - the tests' names for them
    DEFAULT_SENSORS,
    MARK,
    POLL_MS,
    WATTS_PER_COUNT,
    free_tcp_port,
    free_udp_port,
)
from sim.ipmi_sim import marked as _marked  # noqa: F401

REPO = Path(__file__).resolve().parents[1]


def need_ipmi_sim() -> None:
    """Skip the test, with the reason, when the OpenIPMI simulator or ipmitool is missing."""
    for tool, pkg in _sim.TOOLS:
        if shutil.which(tool) is None:
            pytest.skip(
                f"{tool} is not installed (Debian {pkg}; scripts/system-deps.sh installs it)"
            )


@dataclass(frozen=True)
class Machine(_sim.Machine):
    """`sim.ipmi_sim.Machine`, run in the repository by default (`python -m tests...`)."""

    cwd: Path | None = REPO


class IpmiSim(_sim.IpmiSim):
    """`sim.ipmi_sim.IpmiSim` that skips the test when a program is missing."""

    def start(self, timeout: float = 10.0, *, same_port: bool = False) -> None:
        need_ipmi_sim()
        super().start(timeout, same_port=same_port)


@pytest.fixture(scope="module")
def ipmi_sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[IpmiSim]:
    """One `ipmi_sim` per test module with `DEFAULT_SENSORS` (SysPower 420 W, PSU1/PSU2
    inputs, PSU1 output)."""
    need_ipmi_sim()
    sim = IpmiSim(tmp_path_factory.mktemp("ipmi_sim"))
    sim.start()
    try:
        yield sim
    finally:
        sim.stop()


@pytest.fixture
def power_bmc(tmp_path: Path) -> Iterator[Callable[..., IpmiSim]]:
    """`power_bmc(machine, **IpmiSim options)`: an `ipmi_sim` with chassis power over
    `machine`, started (its machine with it unless `startnow=False`), stopped with its
    machine after the test."""
    need_ipmi_sim()
    made: list[IpmiSim] = []

    def start(machine: Machine, **options: Any) -> IpmiSim:
        workdir = tmp_path / f"bmc-{len(made)}"
        workdir.mkdir()
        sim = IpmiSim(workdir, machine=machine, **options)
        made.append(sim)
        sim.start()
        return sim

    try:
        yield start
    finally:
        for sim in made:
            sim.stop()


# -- a machine for power tests ----------------------------------------------------------------


def dummy_machine(boot_file: Path, *, link: bool = True, hung: bool = False) -> Machine:
    """A machine that writes `<pid> <boot uuid>` to `boot_file` once up (and linked to the
    BMC's VM interface, `link`), and stops on SIGTERM, a VM power off, or a VM graceful
    shutdown (ignored if `hung`)."""
    argv = [sys.executable, "-m", "tests.ipmi_sim", "--boot-file", str(boot_file)]
    return Machine([*argv, *(["--vm", "{vm}"] if link else []), *(["--hung"] if hung else [])])


def read_boot(boot_file: Path) -> tuple[int, str] | None:
    """The dummy machine's last boot: (pid, boot uuid), None before the first."""
    try:
        pid, boot = boot_file.read_text().split()
    except (OSError, ValueError):
        return None
    return int(pid), boot


def wait_boot(
    boot_file: Path, *, other_than: tuple[int, str] | None = None, timeout: float = 15.0
) -> tuple[int, str]:
    """Wait for a boot of the dummy machine other than `other_than`; returns it."""
    deadline = time.monotonic() + timeout
    while (boot := read_boot(boot_file)) is None or boot == other_than:
        if time.monotonic() > deadline:
            raise AssertionError(f"the machine did not boot (again) within {timeout:g}s")
        time.sleep(0.02)
    return boot


async def _dummy(args: argparse.Namespace) -> int:
    from launch.sim_node import VmLink, obey_bmc
    from nodeward.logs import get_logger

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    task = None
    if args.vm:
        host, _, port = args.vm.rpartition(":")
        link = await VmLink.connect(host, int(port))
        log = get_logger(component="dummy-machine")
        task = asyncio.create_task(obey_bmc(link, stop, hung=args.hung, log=log))
    tmp = args.boot_file.with_suffix(".tmp")
    tmp.write_text(f"{os.getpid()} {uuid.uuid4()}\n")
    tmp.replace(args.boot_file)
    await stop.wait()
    if task is not None:
        task.cancel()
    return 0


if __name__ == "__main__":
    cli = argparse.ArgumentParser(
        prog="python -m tests.ipmi_sim", description=dummy_machine.__doc__
    )
    cli.add_argument("--boot-file", type=Path, required=True)
    cli.add_argument("--vm", default=None)
    cli.add_argument("--hung", action="store_true")
    sys.exit(asyncio.run(_dummy(cli.parse_args())))
