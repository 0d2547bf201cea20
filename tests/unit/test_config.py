"""Configuration: YAML sections, environment overrides, durations, one-line errors."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from nodeward.config import ConfigError, Section, load_settings, section
from nodeward.durations import Duration, format_duration, parse_duration
from nodeward.logs import configure_logging


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90s", 90),
        ("15m", 900),
        ("24h", 86400),
        ("1h30m", 5400),
        ("500ms", 0.5),
        ("2d", 172800),
        ("45", 45),
        (3, 3),
    ],
)
def test_durations_parse(text: str | int, seconds: float) -> None:
    assert parse_duration(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize("bad", ["", "5x", "m5", "1h 30", "-5", "1.2.3s", True, None, [1]])
def test_bad_durations_are_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(bad)


def test_durations_format_back() -> None:
    assert [format_duration(timedelta(seconds=s)) for s in (90, 900, 86400, 0.5)] == [
        "90s",
        "15m",
        "1d",
        "0.5s",
    ]


def test_yaml_then_env_then_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "nodeward.yaml"
    cfg.write_text(
        "bus:\n  url: nats://from-yaml:4222\n  publish_timeout: 3s\n"
        "daemon:\n  port: 9400\n"
        "services:\n  cordon:\n    dry_run: true\n    cooldown: 15m\n"
    )
    monkeypatch.setenv("NODEWARD_BUS__URL", "nats://from-env:4222")
    monkeypatch.setenv("NODEWARD_SERVICES__CORDON__COOLDOWN", "30m")
    settings = load_settings(cfg)
    assert settings.bus.url == "nats://from-env:4222"  # env beats the file
    assert settings.bus.publish_timeout == timedelta(seconds=3)  # the file beats the default
    assert settings.daemon.port == 9400
    assert settings.bus.connect_timeout == timedelta(seconds=2)  # default

    class Cordon(Section):
        dry_run: bool = False
        cooldown: Duration = timedelta(minutes=5)

    cordon = section(settings, "services", "cordon", Cordon)
    assert cordon.dry_run is True
    assert cordon.cooldown == timedelta(minutes=30)


def test_unknown_keys_and_bad_values_are_one_line(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("bus:\n  urll: nats://x\n  publish_timeout: soon\n")
    with pytest.raises(ConfigError) as err:
        load_settings(cfg)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"invalid configuration in {cfg}:")
    assert "bus.publish_timeout" in message and "bus.urll" in message


def test_unreadable_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config"):
        load_settings(tmp_path / "missing.yaml")
    broken = tmp_path / "broken.yaml"
    broken.write_text("bus: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_settings(broken)
    listing = tmp_path / "list.yaml"
    listing.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_settings(listing)


def test_bad_service_section_names_the_section() -> None:
    class Cordon(Section):
        dry_run: bool = False

    settings = load_settings(services={"cordon": {"dry_run": "perhaps"}})
    with pytest.raises(ConfigError, match=r"invalid services\.cordon configuration: dry_run"):
        section(settings, "services", "cordon", Cordon)


def test_secrets_never_reach_the_logs(capsys: pytest.CaptureFixture[str]) -> None:
    import io

    import structlog

    out = io.StringIO()
    configure_logging("info", "json", stream=out)
    structlog.get_logger().info(
        "connecting", password="hunter2", refresh_token="rt-123", user="alice"
    )
    line = out.getvalue()
    assert "hunter2" not in line and "rt-123" not in line
    assert '"user": "alice"' in line
    configure_logging("info", "console")
