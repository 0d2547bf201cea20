"""docker-compose.yml and the Dockerfile: parsed, and every command is a real `nodeward` command.

`docker compose` is not installed on the test machines, so the file is checked as data: its
services, images and commands, each command parsed by the nodeward CLI itself (unknown
commands or options fail here as they would in the container).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
import yaml

from launch.cli import app

ROOT = Path(__file__).resolve().parents[2]


def _compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return data


def _parse(args: list[str]) -> list[str]:
    """Parse `nodeward ARGS` as the CLI would, without running it; the command path."""
    # typer vendors click (typer._click since 0.29): use the objects typer hands back.
    command: Any = typer.main.get_command(app)
    ctx = command.make_context("nodeward", list(args), resilient_parsing=False)
    path = ["nodeward"]
    while hasattr(command, "resolve_command"):  # a group: descend into the subcommand
        # The subcommand's name: `_protected_args` (click >= 8.2) or `protected_args`.
        protected = vars(ctx).get("_protected_args", vars(ctx).get("protected_args", []))
        rest = [*protected, *ctx.args]
        name, sub, rest = command.resolve_command(ctx, rest)
        assert sub is not None and name is not None
        path.append(name)
        ctx = sub.make_context(name, rest, parent=ctx)
        command = sub
    return path


def test_compose_runs_nats_and_the_fleet_from_one_image() -> None:
    services = _compose()["services"]
    assert {"nats", "fleet", "tail"} <= set(services)
    nats = services["nats"]
    assert nats["image"].startswith("nats:")
    assert "-js" in nats["command"]
    built = [s for s in services.values() if "build" in s]
    assert len(built) == 1 and built[0]["build"] == "."
    image = built[0]["image"]
    nodeward = [s for name, s in services.items() if name != "nats"]
    assert all(s["image"] == image for s in nodeward), "every nodeward container: one image"
    for service in nodeward:
        assert "nats://nats:4222" in service["command"]
        assert "entrypoint" not in service  # the image's: nodeward


def test_every_compose_command_is_a_real_cli_command() -> None:
    services = _compose()["services"]
    paths = {name: _parse(s["command"]) for name, s in services.items() if name != "nats"}
    assert paths == {"fleet": ["nodeward", "up"], "tail": ["nodeward", "tail"]}


def test_a_wrong_command_would_be_caught() -> None:
    try:
        _parse(["up", "--no-such-option"])
    except Exception as exc:  # noqa: BLE001 - click's UsageError, whichever click typer ships
        assert "UsageError" in {c.__name__ for c in type(exc).__mro__}
        assert "--no-such-option" in str(exc)
        return
    raise AssertionError("an unknown option parsed")


def test_dockerfile_runs_nodeward_as_a_non_root_user() -> None:
    lines = [ln.strip() for ln in (ROOT / "Dockerfile").read_text().splitlines()]
    final = lines[max(i for i, ln in enumerate(lines) if ln.startswith("FROM ")) :]
    user = [ln.split()[1] for ln in final if ln.startswith("USER ")]
    assert user and user[-1].split(":")[0] not in ("0", "root")
    assert 'ENTRYPOINT ["nodeward"]' in final
