"""The upgrade path (docs/deploying.md, "Upgrading from chart 0.1"): the previous release's
chart and values (commit PREVIOUS, the last one before the chart stopped bundling NATS)
rendered, then today's templates with those values and the documented upgrade values; nothing
stateful is renamed: ServiceAccounts, workloads and their selectors (immutable), the Secrets
holding generated credentials, each user's durable consumers and KV buckets, the config."""

from __future__ import annotations

import io
import json
import re
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.helm_chart import (
    ROOT,
    auth_conf,
    by_kind,
    named,
    new_nkey,
    parse_manifests,
    refusal,
    render,
)

PREVIOUS = "7cd2670"
RELEASE = "nw"
NODES = {"gpu-node-01": new_nkey()[1], "dgx.rack7": new_nkey()[1]}
USER_VALUES: dict[str, Any] = {
    # What an operator of the previous chart typically set on top of its values.yaml.
    "agents": {"nodeKeys": NODES},
    "services": {
        "falco": {"enabled": True},
        "recovery": {"enabled": True},
        "checkpoint": {"enabled": True},
    },
    "image": {"tag": "test"},
}
UPGRADE_VALUES: dict[str, Any] = {
    # docs/deploying.md, "Upgrading from chart 0.1": the same users and passwords (kept by
    # lookup), the same NATS (kept out of the release, same Service) reached as before.
    "natsAuth": {"mode": "passwords", "passwords": {"generate": True}},
    "console": {"generateToken": True},
    "services": {"falco": {"ingest": {"generateToken": True}}},
    "bus": {"url": f"nats://{RELEASE}-nats.nodeward.svc:4222"},
    "networkPolicies": {
        "natsEgress": {
            "to": [
                {
                    "podSelector": {
                        "matchLabels": {
                            "app.kubernetes.io/name": "nats",
                            "app.kubernetes.io/instance": RELEASE,
                        }
                    }
                }
            ],
            "ports": [4222],
        }
    },
}


def _git(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def previous_chart(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The previous release's chart, as it was (without its NATS dependency entry, which
    cannot be fetched offline; the subchart's own objects are not what is compared)."""
    if _git("cat-file", "-e", f"{PREVIOUS}^{{commit}}").returncode != 0:
        pytest.skip(f"commit {PREVIOUS} is not in this clone (shallow?): git fetch --unshallow")
    archive = _git("archive", "--format=tar", PREVIOUS, "deploy/helm/nodeward")
    assert archive.returncode == 0, archive.stderr
    dest = tmp_path_factory.mktemp("previous")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(dest, filter="data")
    chart = dest / "deploy" / "helm" / "nodeward"
    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    meta.pop("dependencies", None)
    (chart / "Chart.yaml").write_text(yaml.safe_dump(meta))
    return chart


@pytest.fixture(scope="module")
def previous_values(previous_chart: Path) -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load((previous_chart / "values.yaml").read_text())
    assert values["nats"]["enabled"] is True  # it bundled NATS
    return values


@pytest.fixture(scope="module")
def before(previous_chart: Path, tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return render(tmp_path_factory.mktemp("before"), USER_VALUES, RELEASE, chart=previous_chart)


def _today(
    tmp: Path, previous_values: dict[str, Any], upgrade: dict[str, Any]
) -> list[dict[str, Any]]:
    """Today's templates with the previous values.yaml, the user's values and `upgrade`, in
    that order (as `helm upgrade -f old-values.yaml -f mine.yaml -f upgrade.yaml`)."""
    files = []
    for i, values in enumerate((previous_values, USER_VALUES, upgrade)):
        path = tmp / f"{i}.yaml"
        path.write_text(yaml.safe_dump(values))
        files += ["-f", str(path)]
    from tests.integration.helm_chart import CHART, helm

    done = helm("template", RELEASE, str(CHART), "-n", "nodeward", *files)
    assert done.returncode == 0, done.stderr
    return parse_manifests(done.stdout)


@pytest.fixture(scope="module")
def after(
    previous_values: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> list[dict[str, Any]]:
    return _today(tmp_path_factory.mktemp("after"), previous_values, UPGRADE_VALUES)


def _names(docs: list[dict[str, Any]], kind: str) -> set[str]:
    return {d["metadata"]["name"] for d in by_kind(docs, kind)}


def test_service_accounts_are_kept(
    before: list[dict[str, Any]], after: list[dict[str, Any]]
) -> None:
    old = _names(before, "ServiceAccount")
    assert {f"{RELEASE}-cordon", f"{RELEASE}-agent", f"{RELEASE}-recovery"} <= old
    assert old <= _names(after, "ServiceAccount")


def test_workloads_keep_their_names_and_selectors(
    before: list[dict[str, Any]], after: list[dict[str, Any]]
) -> None:
    """A selector cannot change in place: `helm upgrade` would fail on it."""
    for kind in ("Deployment", "DaemonSet"):
        for old in by_kind(before, kind):
            new = named(after, kind, old["metadata"]["name"])
            assert new["spec"]["selector"] == old["spec"]["selector"]
    assert _names(before, "Service") <= _names(after, "Service") | {
        f"{RELEASE}-nats",  # the NATS subchart's, not rendered in this test either way
    }
    assert named(after, "Job", f"{RELEASE}-provision")


def test_secrets_holding_generated_credentials_keep_their_names_and_keys(
    before: list[dict[str, Any]], after: list[dict[str, Any]]
) -> None:
    held = [
        s
        for s in by_kind(before, "Secret")
        if re.fullmatch(rf"{RELEASE}-nats-[a-z]+", s["metadata"]["name"])
        and s["metadata"]["name"] != f"{RELEASE}-nats-auth"
    ]
    assert len(held) >= 10  # every service on here, admin, operator, console
    for old in held:
        new = named(after, "Secret", old["metadata"]["name"])
        assert new["stringData"]["user"] == old["stringData"]["user"]
        assert set(new["stringData"]) == set(old["stringData"]) == {"user", "password"}
        assert new["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    for name in (f"{RELEASE}-console-token", f"{RELEASE}-falco-ingest"):
        assert set(named(before, "Secret", name)["data"]) == set(
            named(after, "Secret", name)["data"]
        )
    # The pods read their passwords from the same Secrets and keys.
    for deployment in by_kind(before, "Deployment"):
        name = deployment["metadata"]["name"]
        old_refs = _secret_refs(deployment)
        assert old_refs <= _secret_refs(named(after, "Deployment", name)), name


def _secret_refs(workload: dict[str, Any]) -> set[tuple[str, str]]:
    refs = set()
    for container in workload["spec"]["template"]["spec"]["containers"]:
        for env in container.get("env", []):
            ref = env.get("valueFrom", {}).get("secretKeyRef")
            if ref and env["name"] == "NODEWARD_BUS__PASSWORD":
                refs.add((ref["name"], ref["key"]))
    return refs


_DURABLE = re.compile(r"^\$JS\.API\.CONSUMER\.DURABLE\.CREATE\.([^.]+)\.([^.]+)$")
_BUCKET = re.compile(r"^\$KV\.([^.]+)\.>$")


def _state(docs: list[dict[str, Any]]) -> dict[str, set[str]]:
    """Per NATS user (name, or the node's nkey), its durable consumers and KV buckets."""
    text = auth_conf(docs, RELEASE)
    match = re.search(r"users = (\[.*\])\s*\}\s*$", text, re.S)
    assert match, text
    out: dict[str, set[str]] = {}
    for user in json.loads(match.group(1)):
        who = user.get("user") or user["nkey"]
        found = set()
        for subject in user["permissions"]["publish"]["allow"]:
            if m := _DURABLE.match(subject):
                found.add(f"durable {m.group(1)}/{m.group(2)}")
            if m := _BUCKET.match(subject):
                found.add(f"bucket {m.group(1)}")
        out[who] = found
    return out


def _old_auth(before: list[dict[str, Any]]) -> list[dict[str, Any]]:
    (secret,) = [
        s for s in by_kind(before, "Secret") if s["metadata"]["name"] == "nodeward-nats-auth"
    ]
    return [{**secret, "metadata": {**secret["metadata"], "name": f"{RELEASE}-nats-auth"}}]


def test_every_durable_consumer_and_bucket_is_kept_for_its_user(
    before: list[dict[str, Any]], after: list[dict[str, Any]]
) -> None:
    old, new = _state(_old_auth(before)), _state(after)
    assert set(old) <= set(new)
    assert (
        "durable GPU/cordon" in old["nodeward-cordon"] and "bucket cordon" in old["nodeward-cordon"]
    )
    for user, held in old.items():
        missing = held - new[user]
        assert not missing, f"{user} loses {sorted(missing)}"


def test_the_config_says_the_same(
    before: list[dict[str, Any]], after: list[dict[str, Any]]
) -> None:
    def config(docs: list[dict[str, Any]]) -> dict[str, Any]:
        return dict(
            yaml.safe_load(named(docs, "ConfigMap", f"{RELEASE}-config")["data"]["config.yaml"])
        )

    old, new = config(before), config(after)
    assert new == old  # partitions, stream replicas, the culler's dry run: nothing else added


def test_the_server_secret_follows_the_release_now(
    before: list[dict[str, Any]], after: list[dict[str, Any]]
) -> None:
    """The one rename, documented: the include file's Secret (the NATS pods mount it)."""
    assert "nodeward-nats-auth" in _names(before, "Secret")
    assert f"{RELEASE}-nats-auth" in _names(after, "Secret")
    assert "nodeward-nats-auth" not in _names(after, "Secret")


def test_without_the_upgrade_values_the_upgrade_is_refused_saying_what_to_give(
    previous_values: dict[str, Any], tmp_path: Path
) -> None:
    """The previous values alone meet the new default (callout) and are refused in one line,
    never rendered with credentials made up."""
    merged_values = {**previous_values, **USER_VALUES}
    merged_values["services"] = {**previous_values["services"], **USER_VALUES["services"]}
    # The previous values.yaml said bus.url "" (the bundled NATS): the first thing to give.
    assert "bus.url: empty" in refusal(tmp_path / "url", merged_values, release=RELEASE)
    merged_values["bus"] = UPGRADE_VALUES["bus"]
    error = refusal(tmp_path / "auth", merged_values, release=RELEASE)
    # Then whichever the chart meets first of what it will not make up.
    assert any(
        what in error
        for what in ("natsAuth.callout", "console: no viewers' token", "services.falco.ingest: no")
    ), error
