"""`nodeward agent energy` flags and their environment equivalents."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents.energy.settings import EnergySettings
from launch.cli import main
from nodeward.cli.agent_options import EnergyFlags, apply_energy_flags
from nodeward.config import load_settings, section


def energy(settings: object) -> EnergySettings:
    result: EnergySettings = section(settings, "agents", "energy", EnergySettings)  # type: ignore[arg-type]
    return result


def test_flags_set_the_energy_section_and_beat_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NODEWARD_AGENTS__ENERGY__IPMI__HOST", "10.0.0.9")
    monkeypatch.setenv("NODEWARD_AGENTS__ENERGY__IPMI__USER", "envuser")
    settings = load_settings()
    flags = EnergyFlags(
        node="n1",
        ipmi_host="127.0.0.1",
        ipmi_port=9623,
        ipmi_password="s3cret",
        interval_s=2,
        carbon_g_per_kwh=50,
    )
    apply_energy_flags(settings, flags)
    got = energy(settings)
    assert got.node == "n1"
    assert (got.ipmi.host, got.ipmi.port, got.ipmi.user) == ("127.0.0.1", 9623, "envuser")
    assert got.ipmi.secret() == "s3cret"
    assert "s3cret" not in repr(got) and "s3cret" not in got.model_dump_json()
    assert got.interval.total_seconds() == 2
    assert (got.carbon.provider, got.carbon.static_g_per_kwh) == ("static", 50)


def test_every_flag_has_an_env_equivalent(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    secret = tmp_path / "bmc.pw"
    secret.write_text("fromfile\n")
    env = {
        "NODE": "n2",
        "IPMI__HOST": "bmc.local",
        "IPMI__PORT": "6230",
        "IPMI__USER": "admin",
        "IPMI__PASSWORD_FILE": str(secret),
        "INTERVAL": "5s",
        "CARBON__PROVIDER": "static",
        "CARBON__STATIC_G_PER_KWH": "21",
    }
    for key, value in env.items():
        monkeypatch.setenv(f"NODEWARD_AGENTS__ENERGY__{key}", value)
    got = energy(load_settings())
    assert (got.node, got.ipmi.host, got.ipmi.port, got.ipmi.user) == (
        "n2",
        "bmc.local",
        6230,
        "admin",
    )
    assert got.ipmi.secret() == "fromfile"
    assert got.interval.total_seconds() == 5 and got.carbon.static_g_per_kwh == 21


def test_energy_flags_on_another_agent_and_bad_values_are_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(["agent", "gpu", "--ipmi-host", "h"]) == 1
    assert "--ipmi-host: only for `nodeward agent energy`" in capsys.readouterr().err
    assert main(["agent", "energy", "--ipmi-password-file", str(tmp_path / "nope")]) == 1
    assert "is not a readable file" in capsys.readouterr().err
    assert main(["agent", "energy", "--interval", "0"]) == 2
    err = capsys.readouterr().err
    assert "--interval" in err and len(err.strip().splitlines()) == 1
