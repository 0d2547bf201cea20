"""DCMI power reading at the message level: responses encoded with python-ipmi's own DCMI
structures, answered by a stand-in `ipmitool` (ipmi_sim has no DCMI), decoded through the
reader's whole path (python-ipmi's ipmitool interface, the probe, `read()`)."""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path

import pytest
from pydantic import SecretStr
from pyipmi.msgs import decode_message, encode_message
from pyipmi.msgs.dcmi import GetPowerReadingReq, GetPowerReadingRsp

from agents.sources.ipmi import IpmiReader, IpmiSettings, component_for, watts_from_dcmi
from agents.sources.power import SourceError
from schemas.energy import PowerSource


def power_reading(current: int, *, active: bool = True) -> bytes:
    """A Get Power Reading response (completion code first), encoded by python-ipmi."""
    rsp = GetPowerReadingRsp()
    rsp.completion_code = 0
    rsp.current_power = current
    rsp.minimum_power = 80
    rsp.maximum_power = 900
    rsp.average_power = 400
    rsp.timestamp = 1_700_000_000
    rsp.period = 1000
    rsp.reading_state = 0x40 if active else 0
    return bytes(encode_message(rsp))


def fake_ipmitool(d: Path, dcmi_response: bytes, log: Path) -> Path:
    """An `ipmitool` that answers `raw` DCMI Get Power Reading (netfn 0x2c cmd 0x02) the
    way ipmitool prints a response (data bytes in hex, no completion code) and refuses any
    other command with completion code 0xc1, as a BMC without that command does."""
    script = d / "ipmitool"
    script.write_text(
        f"""#!{sys.executable}
import sys
args = sys.argv[1:]
open({str(log)!r}, "a").write(" ".join(args) + "\\n")
raw = args[args.index("raw") + 1:]
netfn, cmd = int(raw[0], 16), int(raw[1], 16)
if (netfn, cmd) == (0x2C, 0x02) and raw[2] == "0xdc":
    print(" " + " ".join("%02x" % b for b in bytes.fromhex({dcmi_response[1:].hex()!r})))
    sys.exit(0)
print("Unable to send RAW command (channel=0x0 netfn=0x%x lun=0x0 cmd=0x%x rsp=0xc1):"
      " Invalid command" % (netfn, cmd))
sys.exit(1)
"""
    )
    script.chmod(0o755)
    return script


def lan_settings() -> IpmiSettings:
    return IpmiSettings(
        host="bmc.example",
        user="admin",
        password=SecretStr("pw"),
        timeout=timedelta(seconds=5),
    )


def test_python_ipmi_round_trips_the_power_reading() -> None:
    rsp = GetPowerReadingRsp()
    decode_message(rsp, power_reading(437))
    assert rsp.current_power == 437
    assert watts_from_dcmi(rsp) == 437.0


def test_inactive_measurement_is_refused() -> None:
    rsp = GetPowerReadingRsp()
    decode_message(rsp, power_reading(437, active=False))
    with pytest.raises(SourceError, match="not active"):
        watts_from_dcmi(rsp)


def test_reader_uses_dcmi_when_the_bmc_has_it(tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    r = IpmiReader(lan_settings(), ipmitool=str(fake_ipmitool(tmp_path, power_reading(512), log)))
    [sample] = r.read()
    assert (sample.source, sample.component, sample.watts) == (PowerSource.DCMI, "system", 512.0)
    assert r.describe() == "BMC bmc.example:623: DCMI power reading"
    # the request on the wire is python-ipmi's own Get Power Reading, mode 1
    req = GetPowerReadingReq()
    req.mode = 1
    expected = " ".join(f"0x{b:02x}" for b in (0x2C, 0x02, *encode_message(req)))
    assert log.read_text().splitlines()[-1].endswith(f"raw {expected}")


def test_inactive_dcmi_falls_back_to_the_sdr(tmp_path: Path) -> None:
    """A BMC that has the command but does not measure: the probe tries the SDR
    repository, which this one refuses too, and says both."""
    log = tmp_path / "calls.log"
    fake = fake_ipmitool(tmp_path, power_reading(0, active=False), log)
    with pytest.raises(SourceError) as e:
        IpmiReader(lan_settings(), ipmitool=str(fake)).read()
    assert str(e.value) == (
        "ipmi: BMC bmc.example:623: no DCMI power reading and the SDR repository is"
        " unreadable (completion code 0xc1)"
    )


def test_a_truncated_dcmi_answer_is_a_source_error(tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    fake = fake_ipmitool(tmp_path, power_reading(512)[:5], log)
    with pytest.raises(SourceError) as e:
        IpmiReader(lan_settings(), ipmitool=str(fake)).read()
    assert str(e.value).startswith("ipmi: BMC bmc.example:623: bad answer to DCMI Get Power")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    ("name", "component"),
    [
        ("SysPower", "system"),
        ("System Power", "system"),
        ("Total_Power", "system"),
        ("Pwr Consumption", "system"),
        ("PSU1 Input", "psu-1"),
        ("PS2 Input Power", "psu-2"),
        ("PSU 3 Power In", "psu-3"),
        ("CPU Power", "cpu-power"),
    ],
)
def test_sensor_names_map_to_components(name: str, component: str) -> None:
    assert component_for(name) == component
