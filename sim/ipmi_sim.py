"""A simulated BMC: OpenIPMI's `ipmi_sim` on loopback, serving power sensors in Watts and,
given a `Machine`, chassis power over a process it runs (the node's "machine").

`nodeward up` runs one per BMC-run node (`launch.sim_bmc`); the tests build theirs through
`tests/ipmi_sim.py`, which adds pytest's skips and fixtures.

Each sensor is a full SDR threshold sensor (unit Watts, M=10: 10 W per raw count) whose raw
value `ipmi_sim` polls from a file; `set_watts()` rewrites the file and waits until the BMC
serves the new value. `ipmi_sim` has no DCMI.

Chassis power: `IpmiSim(workdir, machine=Machine(argv))` adds to lan.conf the VM serial
interface (`serial 15 127.0.0.1 <tcp port> codec VM`, without which chassis control answers
0xcc), `startcmd` (a `machine.sh` that records its pid and execs `argv`, where `{vm}`
becomes that interface's `127.0.0.1:<port>`), `startnow`, `poweroff_wait` and `kill_wait`.

What ipmi_sim 1.0.13 (Debian openipmi 2.0.33) does to the machine, measured with
`poweroff_wait 2`, `kill_wait 2` (a "linked" machine is connected to the VM interface and
has claimed power off (0x01) and graceful shutdown (0x20); `launch.sim_node --vm` is):
- the power is on exactly while the startcmd process exists: chassis status says off only
  once the process is gone (a machine ignoring SIGTERM reads on until SIGKILLed).
  `startnow true` starts it with the simulator. The startcmd runs as
  `/bin/sh -c "exec <startcmd>"` (so `VAR=x cmd` does not work: hence `machine.sh`), a
  child of ipmi_sim in its process group, with its environment.
- `power on`: starts the startcmd (cc 0); when already on, nothing happens (still cc 0,
  no second process).
- `power off` (hard): unlinked machine: SIGTERM within about a second (0.1 to 1.0 s
  measured), then SIGKILL about `kill_wait` s later if it is still there. Linked machine:
  VM command 0x03 (power off) at once; if it is still there SIGTERM after about
  `poweroff_wait` (1.4 s measured for 2), SIGKILL about `kill_wait` later (2 s). When
  already off: cc 0, nothing.
- `soft` (graceful): linked machine: VM command 0x09 and nothing more: no SIGTERM, no
  deadline; a machine that ignores it stays on (measured for 4 s and more). Unlinked
  machine, a link without the 0x20 capability, or power already off: completion code 0xcc
  ("Invalid data field in request") and nothing happens.
- `cycle`: a hard power off as above, then the startcmd again within about a second after
  the process is gone (0.4 to 1.0 s measured; a new pid; for a machine that ignores
  everything, after the SIGKILL). When off, it powers on.
- stopping ipmi_sim (SIGTERM or SIGKILL) leaves the machine running, orphaned: `stop()`
  ends it too (found by `NODEWARD_IPMI_SIM=<workdir>` in its environment), unless the
  machine `dies_with_bmc`.

A hung machine (`hang()`: SIGSTOP, as a host whose OS no longer runs) hears nothing: not the
VM link's requests, not SIGTERM; only the SIGKILL of a hard power off ends it.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

WATTS_PER_COUNT = 10  # the sensors' M: a reading is a multiple of 10 W, at most 2550 W
POLL_MS = 100  # how often ipmi_sim rereads a sensor file
DEFAULT_SENSORS: Mapping[str, float] = {
    "SysPower": 420.0,
    "PSU1 Input": 220.0,
    "PSU2 Input": 210.0,
    "PSU1 Output": 200.0,  # not read by default (a PSU's output is not what the node draws)
}
TOOLS = (("ipmi_sim", "openipmi"), ("sdrcomp", "openipmi"), ("ipmitool", "ipmitool"))
"""What a simulated BMC takes: each program and its Debian package."""
MARK = "NODEWARD_IPMI_SIM"  # in the environment of an ipmi_sim and its machine: its workdir


class IpmiSimUnavailable(RuntimeError):
    """A program the simulated BMC needs is not installed."""


def missing_tool() -> str | None:
    """Why no simulated BMC can run here (one line), or None when every program is there."""
    for tool, package in TOOLS:
        if shutil.which(tool) is None:
            return f"{tool} is not installed (Debian {package}; scripts/system-deps.sh installs it)"
    return None


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_tcp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Machine:
    """The process a BMC with chassis power runs (its `startcmd`): `argv`, where `{vm}`
    becomes the VM serial interface's `127.0.0.1:<port>`, run in `cwd` (None: the BMC's
    workdir) with `env` added. `dies_with_bmc`: SIGKILLed when its ipmi_sim ends, as a
    machine without power (`nodeward up`'s, so that nothing outlives it)."""

    argv: Sequence[str]
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: Path | None = None
    startnow: bool = True
    poweroff_wait: int = 2
    kill_wait: int = 2
    dies_with_bmc: bool = False


class MachineState(StrEnum):
    """A BMC-run machine as its process is: running, hung (stopped), or off (no process)."""

    RUNNING = "running"
    HUNG = "hung"
    OFF = "off"


def marked(mark: str) -> list[int]:
    """The live (not zombie) processes whose environment holds `mark` (`NAME=value`)."""
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _holds(p, mark)]


def _holds(proc: Path, mark: str) -> bool:
    """Whether process `proc` (`/proc/<pid>`) lives (not a zombie) with `mark` in its
    environment."""
    try:
        if mark.encode() + b"\0" not in (proc / "environ").read_bytes() + b"\0":
            return False
    except OSError:
        return False
    return _state(int(proc.name)) not in ("Z", None)


def _state(pid: int) -> str | None:
    """The process's state letter (`R`, `S`, `T` stopped, `Z`, ...), None if it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return None


def _sdr(number: int, name: str) -> str:
    return f"""sdr type 1
	sensor_owner_id		0x20
	sensor_owner_lun	0
	channel_number		0
	sensor_number		{number}
	entity_id		system_board
	entity_instance		{number}
	sensor_type		Other_Units_Based_Sensor
	init_scanning		true
	init_sensor_type	true
	default_sensor_scan_on	true
	event_reading_type_code	1
	analog_data_format	unsigned
	rate_unit		none
	modifier_unit		none
	percentage		false
	base_unit		Watts
	modifier_unit_code	unspecified
	linearization		linear
	m			{WATTS_PER_COUNT}
	tolerance		0
	b			0
	accuracy		1
	accuracy_exp		0
	sensor_direction	input
	r_exp			0
	b_exp			0
	sensor_maximum		255
	sensor_minimum		0
	id_string		"{name}"
endsdr
"""


class IpmiSim:
    """One `ipmi_sim` BMC on 127.0.0.1:`port` (UDP) in `workdir`, user `user`/`password`
    (admin). `sensors` maps sensor names to their initial watts; sensor numbers start at 2
    in that order. `dies_with_parent`: ipmi_sim gets SIGTERM when the thread that started
    it ends (`setpriv --pdeathsig`, where installed), as `nodeward up`'s other children."""

    def __init__(
        self,
        workdir: Path,
        sensors: Mapping[str, float] | None = None,
        user: str = "ipmiusr",
        password: str = "s3cret-pw",  # noqa: S107 - the simulator's own
        machine: Machine | None = None,
        *,
        dies_with_parent: bool = False,
    ) -> None:
        self.workdir = workdir
        self.machine = machine
        self.vm_port = 0  # the VM serial interface (TCP), with a machine
        self.user = user
        self.password = password
        self.host = "127.0.0.1"
        self.port = 0
        self.dies_with_parent = dies_with_parent
        self.numbers = {name: 2 + i for i, name in enumerate(sensors or DEFAULT_SENSORS)}
        self._initial = dict(sensors or DEFAULT_SENSORS)
        self._proc: subprocess.Popen[bytes] | None = None

    def _file(self, sensor: str) -> Path:
        return self.workdir / f"sensor{self.numbers[sensor]}.val"

    def _write_config(self) -> None:
        d = self.workdir
        auths = "none md2 md5 straight"
        (d / "lan.conf").write_text(
            f"""name "nwsim"
set_working_mc 0x20
  startlan 1
    addr {self.host} {self.port}
    priv_limit admin
    allowed_auths_callback {auths}
    allowed_auths_user {auths}
    allowed_auths_operator {auths}
    allowed_auths_admin {auths}
    guid a123456789abcdefa123456789abcdef
  endlan
{self._power_config()}  user 2 true "{self.user}" "{self.password}" admin 10 {auths}
"""
        )
        emu = [
            "mc_setbmc 0x20",
            "mc_add 0x20 0 no-device-sdrs 0x23 9 8 0x9f 0x1291 0xf02 persist_sdr",
            "sel_enable 0x20 1000 0x0a",
        ]
        for name, number in self.numbers.items():
            emu.append(
                f'sensor_add 0x20 0 {number} 0x0b 0x01 poll {POLL_MS} file "{self._file(name)}"'
            )
        emu.append("mc_enable 0x20")
        (d / "sim.emu").write_text("\n".join(emu) + "\n")
        (d / "power.sdrs").write_text("".join(_sdr(n, name) for name, n in self.numbers.items()))
        sdr_dir = d / "state" / "ipmi_sim" / "nwsim"
        sdr_dir.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["sdrcomp", "-o", str(sdr_dir / "sdr.20.main"), str(d / "power.sdrs")],
            check=True,
            capture_output=True,
        )

    @property
    def vm(self) -> str:
        """The VM serial interface's address, `127.0.0.1:<port>`."""
        return f"{self.host}:{self.vm_port}"

    @property
    def address(self) -> str:
        """The BMC's `host:port`, as a node's `nodeward.io/bmc-address` annotation names it."""
        return f"{self.host}:{self.port}"

    @property
    def mark(self) -> str:
        """What the environment of this BMC's processes (and its machine's) holds."""
        return f"{MARK}={self.workdir.resolve()}"

    @property
    def pid_file(self) -> Path:
        """Where `machine.sh` writes the machine's pid as it starts."""
        return self.workdir / "machine.pid"

    def _power_config(self) -> str:
        m = self.machine
        if m is None:
            return ""
        argv = [a.replace("{vm}", self.vm) for a in m.argv]
        setpriv = shutil.which("setpriv") if m.dies_with_bmc else None
        if setpriv:  # PR_SET_PDEATHSIG survives the exec: no power, no machine
            argv = [setpriv, "--pdeathsig", "KILL", "--", *argv]
        lines = [
            "#!/bin/sh",
            "# the machine ipmi_sim powers: its pid (exec keeps it), then its command",
            f"echo $$ > {shlex.quote(str(self.pid_file))}",
            *([f"cd {shlex.quote(str(m.cwd))} || exit 1"] if m.cwd is not None else []),
            *(f"export {k}={shlex.quote(v)}" for k, v in m.env.items()),
            f"exec {shlex.join(argv)}",
        ]
        script = self.workdir / "machine.sh"
        script.write_text("\n".join(lines) + "\n")
        script.chmod(0o755)
        return (
            f"  serial 15 {self.host} {self.vm_port} codec VM\n"
            f'  startcmd "{script}"\n'
            f"  startnow {'true' if m.startnow else 'false'}\n"
            f"  poweroff_wait {m.poweroff_wait}\n"
            f"  kill_wait {m.kill_wait}\n"
        )

    def start(self, timeout: float = 10.0, *, same_port: bool = False) -> None:
        """Start on a free port (or, `same_port`, the one it had: a BMC coming back); ready
        when `ipmitool` reads the first sensor. Raises `IpmiSimUnavailable` when a program
        is missing, `RuntimeError` when it does not answer."""
        missing = missing_tool()
        if missing is not None:
            raise IpmiSimUnavailable(missing)
        if not same_port:
            for name, watts in self._initial.items():
                self._write_raw(name, watts)
        argv = ["ipmi_sim", "-c", "lan.conf", "-f", "sim.emu", "-s", "state", "-n"]
        setpriv = shutil.which("setpriv") if self.dies_with_parent else None
        if setpriv:  # no preexec_fn in a threaded process
            argv = [setpriv, "--pdeathsig", "TERM", "--", *argv]
        for _attempt in range(3):
            if not (same_port and self.port):
                self.port = free_udp_port()
                self.vm_port = free_tcp_port()
            self._write_config()
            log = (self.workdir / "ipmi_sim.log").open("wb")
            self._proc = subprocess.Popen(
                argv,
                cwd=self.workdir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, MARK: str(self.workdir.resolve())},  # its machine's too
            )
            log.close()
            deadline = time.monotonic() + timeout
            first = next(iter(self.numbers))
            while time.monotonic() < deadline and self._proc.poll() is None:
                if self.raw_reading(first) is not None:
                    return
                time.sleep(0.05)
            self.stop()  # port taken meanwhile, or too slow: try another port
        log_text = (self.workdir / "ipmi_sim.log").read_text(errors="replace")[-500:]
        raise RuntimeError(f"ipmi_sim did not answer on 127.0.0.1:{self.port}: {log_text}")

    def kill(self) -> None:
        """SIGKILL the BMC (it goes away without a word); `start(same_port=True)` brings it back."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self._proc = None

    def stop(self) -> None:
        """Stop the BMC and whatever machine it started (SIGTERM, then SIGKILL after 5 s)."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None
        if self.machine is not None:
            self._end_marked()

    def _end_marked(self) -> None:
        """End what this BMC started and outlives it (its machine): SIGTERM (and SIGCONT, so
        a hung one hears it), then SIGKILL."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in marked(self.mark):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
                    if sig == signal.SIGTERM:
                        os.kill(pid, signal.SIGCONT)
            deadline = time.monotonic() + 5
            while marked(self.mark) and time.monotonic() < deadline:
                time.sleep(0.02)
            if not marked(self.mark):
                return

    @property
    def pid(self) -> int | None:
        """The ipmi_sim process (None when stopped): SIGSTOP it for a BMC that never answers."""
        return self._proc.pid if self._proc is not None else None

    def machine_pid(self) -> int | None:
        """The machine's pid while it runs (power on), else None."""
        try:
            pid = int(self.pid_file.read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if _holds(Path(f"/proc/{pid}"), self.mark) else None

    def machine_state(self) -> MachineState:
        """Whether the machine runs, is hung (stopped), or is off."""
        pid = self.machine_pid()
        if pid is None:
            return MachineState.OFF
        return MachineState.HUNG if _state(pid) in ("T", "t") else MachineState.RUNNING

    def hang(self, timeout: float = 5.0) -> int:
        """Hang the machine as a host whose OS stopped: SIGSTOP, returned once the process
        is stopped. Returns its pid; raises `ProcessLookupError` when it is off."""
        pid = self.machine_pid()
        if pid is None:
            raise ProcessLookupError("the machine is off")
        os.kill(pid, signal.SIGSTOP)
        deadline = time.monotonic() + timeout
        while _state(pid) not in ("T", "t", None) and time.monotonic() < deadline:
            time.sleep(0.005)  # the signal is delivered asynchronously
        return pid

    def wait_machine(
        self, *, running: bool, other_than: int | None = None, timeout: float = 15.0
    ) -> int | None:
        """Wait until a machine runs (one other than `other_than`: it started again) and
        return its pid, or, `running=False`, until none runs (None)."""
        deadline = time.monotonic() + timeout
        while True:
            pid = self.machine_pid()
            if (pid is not None and pid != other_than) if running else pid is None:
                return pid
            if time.monotonic() > deadline:
                want = "a new machine running" if running else f"machine {pid} gone"
                raise AssertionError(f"ipmi_sim: no {want} within {timeout:g}s")
            time.sleep(0.02)

    def power_status(self) -> str | None:
        """`on` or `off` as `ipmitool chassis power status` reads it (None: no answer)."""
        try:
            done = self.ipmitool("chassis", "power", "status", timeout=5)
        except subprocess.TimeoutExpired:
            return None
        words = done.stdout.split()
        return words[-1] if done.returncode == 0 and words else None

    def ipmitool(self, *args: str, timeout: float = 5.0) -> subprocess.CompletedProcess[str]:
        """Run ipmitool against this BMC over RMCP+ (cipher suite 3, which ipmi_sim has)."""
        lan = ["-I", "lanplus", "-C", "3", "-N", "1", "-R", "1", "-H", self.host]
        return subprocess.run(
            ["ipmitool", *lan, "-p", str(self.port), "-U", self.user, "-E", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "IPMI_PASSWORD": self.password},
            check=False,
        )

    def raw_reading(self, sensor: str) -> int | None:
        """The sensor's raw reading as the BMC serves it now (None: no answer)."""
        try:
            done = self.ipmitool("raw", "0x04", "0x2d", hex(self.numbers[sensor]), timeout=3)
        except subprocess.TimeoutExpired:
            return None
        parts = done.stdout.split()
        return int(parts[0], 16) if done.returncode == 0 and parts else None

    def _write_raw(self, sensor: str, watts: float) -> int:
        raw = round(watts / WATTS_PER_COUNT)
        if not 0 <= raw <= 255:
            raise ValueError(f"{watts} W is outside the sensor's 0..2550 W")
        path = self._file(sensor)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(f"{raw}\n")
        tmp.replace(path)
        return raw

    def set_watts(self, watts: float, sensor: str = "SysPower", timeout: float = 5.0) -> float:
        """Set a sensor to `watts` (rounded to 10 W) and wait until the BMC serves it;
        returns the watts it now reads."""
        raw = self._write_raw(sensor, watts)
        deadline = time.monotonic() + timeout
        while self.raw_reading(sensor) != raw:
            if time.monotonic() > deadline:
                raise AssertionError(f"ipmi_sim did not pick up {watts} W on {sensor!r}")
            time.sleep(POLL_MS / 1000 / 2)
        return float(raw * WATTS_PER_COUNT)
