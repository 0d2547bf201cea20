"""Operators' YAML files (config, policy, routes, scenario, owner directory): each problem
is one line naming the file and what is wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodeward.config import ConfigError, read_yaml
from services.cordon.policy import PolicyError, load_policy
from services.notifier.owners import DirectoryError, load_directory
from services.notifier.routing import RoutingError, load_routes
from sim.scenario import ScenarioError, load_scenario


def test_missing_file_is_one_line(tmp_path: Path) -> None:
    gone = tmp_path / "gone.yaml"
    for load, error, what in [
        (read_yaml, ConfigError, "config"),
        (load_policy, PolicyError, "policy"),
        (load_routes, RoutingError, "routes"),
        (load_scenario, ScenarioError, "scenario"),
        (load_directory, DirectoryError, "owner directory"),
    ]:
        with pytest.raises(error) as caught:
            load(gone)
        assert str(caught.value) == f"cannot read {what} {gone}: No such file or directory"


def test_bad_yaml_and_bad_content_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("routes: [unclosed\n")
    with pytest.raises(RoutingError, match=rf"^routes {bad} is not valid YAML: "):
        load_routes(bad)
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("routes: [{name: x, channels: 3}]\n")
    with pytest.raises(RoutingError, match=rf"^invalid routes {wrong}: routes\.0\.channels: "):
        load_routes(wrong)
    steps = tmp_path / "steps.yaml"
    steps.write_text("- {node: n1, gpu: 0, xid: 79, load: 50}\n")
    with pytest.raises(ScenarioError, match=rf"^scenario {steps}: 0: give exactly one of"):
        load_scenario(steps)
    with pytest.raises(PolicyError, match=rf"^invalid policy {wrong}: ") as caught:
        load_policy(wrong)
    assert "\n" not in str(caught.value)


def test_the_shipped_defaults_load() -> None:
    assert load_policy().rules
    assert load_routes().routes
