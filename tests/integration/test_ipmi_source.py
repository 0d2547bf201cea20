"""The IPMI power source against a real BMC (`ipmi_sim` over RMCP+/RMCP) and broken ones."""

from __future__ import annotations

import socket
import statistics
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from pydantic import SecretStr

from agents.sources.ipmi import DEVICE_PATHS, IpmiReader, IpmiSettings
from agents.sources.power import SourceError
from schemas.energy import PowerSource
from tests.ipmi_sim import IpmiSim, free_udp_port, ipmi_sim, need_ipmi_sim  # noqa: F401

pytestmark = [pytest.mark.peer("ipmi_sim"), pytest.mark.xdist_group("ipmi_sim")]


def settings_for(sim: IpmiSim, **over: object) -> IpmiSettings:
    values: dict[str, object] = {
        "host": sim.host,
        "port": sim.port,
        "user": sim.user,
        "password": SecretStr(sim.password),
        "timeout": timedelta(seconds=2),
    }
    values.update(over)
    return IpmiSettings.model_validate(values)


@pytest.fixture
def reader(ipmi_sim: IpmiSim) -> Iterator[IpmiReader]:  # noqa: F811
    r = IpmiReader(settings_for(ipmi_sim))
    yield r
    r.close()


def by_component(reader: IpmiReader) -> dict[str, float]:
    samples = reader.read()
    assert all(s.source is PowerSource.IPMI_SDR for s in samples)
    return {s.component: s.watts for s in samples if s.watts is not None}


def test_reads_the_power_sensors_over_rmcp_plus(ipmi_sim: IpmiSim, reader: IpmiReader) -> None:  # noqa: F811
    ipmi_sim.set_watts(420)
    watts = by_component(reader)
    assert watts["system"] == pytest.approx(420, abs=10)
    assert watts["psu-1"] == pytest.approx(220, abs=10)
    assert watts["psu-2"] == pytest.approx(210, abs=10)
    assert set(watts) == {"system", "psu-1", "psu-2"}  # not the PSU's output
    # ipmi_sim has no DCMI: the probe fell back to the SDR sensors and says which
    assert reader.describe() == (
        f"BMC 127.0.0.1:{ipmi_sim.port}: SDR sensors: 'SysPower' (W) as system,"
        " 'PSU1 Input' (W) as psu-1, 'PSU2 Input' (W) as psu-2"
    )


def test_a_changed_sensor_shows_on_the_next_read(ipmi_sim: IpmiSim, reader: IpmiReader) -> None:  # noqa: F811
    ipmi_sim.set_watts(420)
    assert by_component(reader)["system"] == pytest.approx(420, abs=10)
    served = ipmi_sim.set_watts(1230)
    assert by_component(reader)["system"] == served == 1230
    ipmi_sim.set_watts(420)


def test_sensors_setting_narrows_by_name_and_names_a_missing_one(ipmi_sim: IpmiSim) -> None:  # noqa: F811
    one = IpmiReader(settings_for(ipmi_sim, sensors=["psu2 input"]))
    assert set(by_component(one)) == {"psu-2"}
    assert one.describe().endswith("SDR sensors: 'PSU2 Input' (W) as psu-2")
    named = IpmiReader(settings_for(ipmi_sim, sensors=["PSU1 Output", "SysPower"]))
    assert by_component(named) == {"system": 420, "psu-1": 200}
    missing = IpmiReader(settings_for(ipmi_sim, sensors=["PSU9 Input"]))
    with pytest.raises(SourceError) as e:
        missing.read()
    assert "no Watts sensor named 'psu9 input'" in str(e.value)
    assert "'SysPower'" in str(e.value)


def test_rmcp_only_interface_and_password_file(ipmi_sim: IpmiSim, tmp_path: Path) -> None:  # noqa: F811
    secret = tmp_path / "pw"
    secret.write_text(ipmi_sim.password + "\n")
    r = IpmiReader(settings_for(ipmi_sim, interface="lan", password=None, password_file=secret))
    assert by_component(r)["system"] == pytest.approx(420, abs=10)


@pytest.mark.parametrize(
    ("over", "says"),
    [
        ({"password": SecretStr("not-the-password")}, "user 'ipmiusr': RAKP 2 HMAC is invalid"),
        (
            {"interface": "lan", "password": SecretStr("not-the-password")},
            "user 'ipmiusr': Activate Session command failed",
        ),
        (
            {"user": "nobody"},
            "user 'nobody': RAKP 2 message indicates an error : unauthorized name",
        ),
    ],
    ids=["rmcp+-password", "rmcp-password", "unknown-user"],
)
def test_refused_credentials_are_one_clear_line_without_a_hang(
    ipmi_sim: IpmiSim,  # noqa: F811
    over: dict[str, object],
    says: str,
) -> None:
    r = IpmiReader(settings_for(ipmi_sim, **over))
    started = time.monotonic()
    with pytest.raises(SourceError) as e:
        r.read()
    assert time.monotonic() - started < 2 * 2 + 1  # two cipher suites at most, 2s each
    msg = str(e.value)
    assert msg == f"ipmi: BMC 127.0.0.1:{ipmi_sim.port}: authentication failed for {says}"
    assert "not-the-password" not in msg


def test_unreadable_password_file_and_missing_ipmitool(tmp_path: Path) -> None:
    s = _settings(623).model_copy(update={"password": None, "password_file": tmp_path / "nope"})
    with pytest.raises(SourceError) as e:
        IpmiReader(s).read()
    assert str(e.value) == (
        f"ipmi: BMC 127.0.0.1:623: cannot read the password file {tmp_path / 'nope'}:"
        " No such file or directory"
    )
    with pytest.raises(SourceError) as e:
        IpmiReader(_settings(623), ipmitool=str(tmp_path / "ipmitool")).read()
    assert str(e.value) == (
        f"ipmi: BMC 127.0.0.1:623: {tmp_path / 'ipmitool'} not found (install the ipmitool package)"
    )


def test_the_password_is_not_on_the_command_line(ipmi_sim: IpmiSim) -> None:  # noqa: F811
    r = IpmiReader(settings_for(ipmi_sim), ipmitool=str(_argv_recorder(ipmi_sim.workdir)))
    by_component(r)
    argv = (ipmi_sim.workdir / "argv.log").read_text()
    assert "-E" in argv
    assert ipmi_sim.password not in argv


def _argv_recorder(d: Path) -> Path:
    """An `ipmitool` that records its arguments, then runs the real one."""
    script = d / "ipmitool-rec"
    script.write_text(f'#!/bin/sh\necho "$@" >> {d / "argv.log"}\nexec ipmitool "$@"\n')
    script.chmod(0o755)
    return script


def _settings(port: int, timeout_s: float = 1.0) -> IpmiSettings:
    return IpmiSettings(
        host="127.0.0.1",
        port=port,
        user="u",
        password=SecretStr("p"),
        timeout=timedelta(seconds=timeout_s),
    )


def _fails_fast(settings: IpmiSettings) -> str:
    need_ipmi_sim()
    r = IpmiReader(settings)
    started = time.monotonic()
    with pytest.raises(SourceError) as e:
        r.read()
    elapsed = time.monotonic() - started
    budget = settings.timeout.total_seconds()
    assert elapsed < 2 * budget + 1, f"took {elapsed:.1f}s"  # one try per cipher suite at most
    assert "\n" not in str(e.value)
    return str(e.value)


def test_unreachable_port_fails_within_the_timeout() -> None:
    port = free_udp_port()
    msg = _fails_fast(_settings(port))
    assert msg == f"ipmi: BMC 127.0.0.1:{port}: no answer to DCMI Get Power Reading within 1s"


class _UdpPeer:
    """A UDP 'BMC' on loopback that answers every datagram with `reply` (None: silence)."""

    def __init__(self, reply: bytes | None) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.1)
        self.port = int(self.sock.getsockname()[1])
        self.reply = reply
        self.received = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                _, addr = self.sock.recvfrom(4096)
            except TimeoutError:
                continue
            self.received += 1
            if self.reply is not None:
                self.sock.sendto(self.reply, addr)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.sock.close()


@pytest.mark.parametrize(
    ("reply", "timeout_s", "says"),
    [
        # an RMCP header, then junk; 3s lets ipmitool give up by itself and say why
        (b"\x06\x00\xff\x07garbage-garbage-garbage", 3.0, "cannot reach or open a session"),
        (b"\x00" * 3, 1.0, "within 1s"),
        (None, 1.0, "no answer to DCMI Get Power Reading within 1s"),  # never answers
    ],
    ids=["rmcp-junk", "short-junk", "silent"],
)
def test_garbage_or_silent_bmc_is_a_source_error_not_a_stall(
    reply: bytes | None, timeout_s: float, says: str
) -> None:
    peer = _UdpPeer(reply)
    try:
        msg = _fails_fast(_settings(peer.port, timeout_s))
    finally:
        peer.close()
    assert peer.received > 0
    assert msg.startswith(f"ipmi: BMC 127.0.0.1:{peer.port}: ")
    assert says in msg


def test_missing_dev_ipmi0_says_what_is_needed() -> None:
    if any(p.exists() for p in DEVICE_PATHS):
        pytest.skip("this machine has an in-band IPMI device")
    with pytest.raises(SourceError) as e:
        IpmiReader(IpmiSettings()).read()
    msg = str(e.value)
    assert "/dev/ipmi0 is missing" in msg
    assert "ipmi_devintf" in msg
    assert "\n" not in msg


def test_read_latency(ipmi_sim: IpmiSim, reader: IpmiReader) -> None:  # noqa: F811
    """20 reads of the three sensors; the median is printed for the report (-s)."""
    reader.probe()
    took = []
    for _ in range(20):
        t = time.perf_counter()
        reader.read()
        took.append(time.perf_counter() - t)
    median = statistics.median(took)
    print(f"ipmi read of 3 SDR sensors: median {median * 1000:.1f} ms over 20 reads")
    assert median < 2.0


def test_the_energy_agent_says_at_start_which_power_source_it_chose(
    ipmi_sim: IpmiSim,  # noqa: F811
    nats_url: str,
    tmp_path: Path,
) -> None:
    """At the default log level, `nodeward agent energy` says once which BMC reading it uses
    (ipmi_sim has no DCMI: the SDR sensors), and never the password."""
    import os
    import signal
    import subprocess
    import sys
    import threading

    secret = tmp_path / "bmc.pw"
    secret.write_text(ipmi_sim.password + "\n")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "launch",
            "agent",
            "energy",
            "--nats",
            nats_url,
            "--node",
            "bmc-start-facts",
            "--ipmi-host",
            ipmi_sim.host,
            "--ipmi-port",
            str(ipmi_sim.port),
            "--ipmi-user",
            ipmi_sim.user,
            "--ipmi-password-file",
            str(secret),
            "--interval",
            "1",
            "--carbon-intensity",
            "50",
        ],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "NODEWARD_AGENTS__ENERGY__CGROUP_ROOT": str(tmp_path / "cg")},
    )
    lines: list[str] = []
    give_up = threading.Timer(30, proc.kill)  # the line never comes: fail, do not hang
    give_up.start()
    try:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if "energy agent started" in line:
                break
    finally:
        give_up.cancel()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
    started = next((line for line in lines if "energy agent started" in line), "")
    assert f"BMC 127.0.0.1:{ipmi_sim.port}: SDR sensors: 'SysPower' (W) as system" in started
    assert ipmi_sim.password not in "".join(lines)
