"""A real BMC for tests: OpenIPMI's `ipmi_sim` on loopback, serving power sensors in Watts.

Each sensor is a full SDR threshold sensor (unit Watts, M=10: 10 W per raw count) whose
raw value `ipmi_sim` polls from a file; `set_watts()` rewrites the file and waits until the
BMC serves the new value. `ipmi_sim` has no DCMI. Import `ipmi_sim` (module-scoped fixture)
or build an `IpmiSim` yourself:

    from tests.ipmi_sim import IpmiSim, ipmi_sim  # noqa: F401
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

WATTS_PER_COUNT = 10  # the sensors' M: a reading is a multiple of 10 W, at most 2550 W
POLL_MS = 100  # how often ipmi_sim rereads a sensor file
DEFAULT_SENSORS = {
    "SysPower": 420.0,
    "PSU1 Input": 220.0,
    "PSU2 Input": 210.0,
    "PSU1 Output": 200.0,  # not read by default (a PSU's output is not what the node draws)
}


def need_ipmi_sim() -> None:
    """Skip the test, with the reason, when the OpenIPMI simulator or ipmitool is missing."""
    for tool, pkg in (("ipmi_sim", "openipmi"), ("sdrcomp", "openipmi"), ("ipmitool", "ipmitool")):
        if shutil.which(tool) is None:
            pytest.skip(
                f"{tool} is not installed (Debian {pkg}; scripts/system-deps.sh installs it)"
            )


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
    in that order."""

    def __init__(
        self,
        workdir: Path,
        sensors: dict[str, float] | None = None,
        user: str = "ipmiusr",
        password: str = "s3cret-pw",
    ) -> None:
        self.workdir = workdir
        self.user = user
        self.password = password
        self.host = "127.0.0.1"
        self.port = 0
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
  user 2 true "{self.user}" "{self.password}" admin 10 {auths}
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

    def start(self, timeout: float = 10.0, *, same_port: bool = False) -> None:
        """Start on a free port (or, `same_port`, the one it had: a BMC coming back);
        ready when `ipmitool` reads the first sensor."""
        need_ipmi_sim()
        if not same_port:
            for name, watts in self._initial.items():
                self._write_raw(name, watts)
        for _attempt in range(3):
            if not (same_port and self.port):
                self.port = free_udp_port()
            self._write_config()
            log = (self.workdir / "ipmi_sim.log").open("wb")
            self._proc = subprocess.Popen(
                ["ipmi_sim", "-c", "lan.conf", "-f", "sim.emu", "-s", "state", "-n"],
                cwd=self.workdir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
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
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None

    def ipmitool(self, *args: str, timeout: float = 5.0) -> subprocess.CompletedProcess[str]:
        """Run ipmitool against this BMC over RMCP+ (cipher suite 3, which ipmi_sim has)."""
        lan = ["-I", "lanplus", "-C", "3", "-N", "1", "-R", "1", "-H", self.host]
        return subprocess.run(
            ["ipmitool", *lan, "-p", str(self.port), "-U", self.user, "-E", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "IPMI_PASSWORD": self.password},
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
