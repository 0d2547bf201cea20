"""`nodeward up` renews seeded credentials at its local peers: an OAuth2 Secret at the local
provider (the token in the Secret changes and still authenticates) and, where the KDC
packages are installed, a Kerberos ticket cache; the story tells each renewal without the
credential, and the credentials KV records it for `nodeward status`."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import shutil
import subprocess
import urllib.error
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import nats
import pytest

from services.credentials.state import CREDENTIALS, CredentialRecord
from tests.e2e.platform import running_up
from tests.e2e.test_cli import wait_until

pytestmark = pytest.mark.timeout(180)

NAMESPACE, SECRET = "ml-vision", "alice-oauth"  # the seed signs it in, due 20 s after start

KERBEROS_SEED = """
namespaces: [ml-nlp, nodeward]
nodes:
- {name: gpu-a}
secrets:
- {name: bob-krb5, namespace: ml-nlp, annotations: {sim.nodeward.io/kerberos-principal: bob,
   sim.nodeward.io/kerberos-ticket-life: 20s}}
"""


def _get(kubeconfig: Path, namespace: str, kind: str, name: str) -> dict[str, Any]:
    """The object as `kubectl get KIND NAME -o json` shows it."""
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl is installed by `make test` (scripts/system-deps.sh)"
    got = subprocess.run(
        [
            kubectl,
            "--kubeconfig",
            str(kubeconfig),
            "-n",
            namespace,
            "get",
            kind,
            name,
            "-o",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert got.returncode == 0, got.stderr
    found: dict[str, Any] = json.loads(got.stdout)
    return found


def _secret(kubeconfig: Path, namespace: str = NAMESPACE, name: str = SECRET) -> dict[str, Any]:
    """The Secret as `kubectl get secret -o json` shows it, its data decoded."""
    secret = _get(kubeconfig, namespace, "secret", name)
    secret["raw"] = {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}
    secret["decoded"] = {k: v.decode(errors="replace") for k, v in secret["raw"].items()}
    return secret


def _authenticates(provider: str, access_token: str) -> bool:
    """What a workload does with the mounted token: call an API that checks it."""
    whoami = provider.removesuffix("/token") + "/whoami"
    request = urllib.request.Request(whoami, headers={"Authorization": f"Bearer {access_token}"})
    try:
        with urllib.request.urlopen(request, timeout=5) as reply:
            return bool(reply.status == 200)
    except urllib.error.HTTPError:
        return False


async def _record(
    nats_url: str, namespace: str = NAMESPACE, name: str = SECRET
) -> CredentialRecord | None:
    nc = await nats.connect(nats_url)
    try:
        kv = await nc.jetstream().key_value(CREDENTIALS.name)
        entry = await kv.get(CREDENTIALS.key(namespace, name))
        return CREDENTIALS.load(entry.value) if entry.value else None
    finally:
        await nc.close()


def test_up_renews_a_seeded_oauth2_secret_and_tells_it(tmp_path: Path) -> None:
    with running_up(tmp_path, "--nodes", "2", "--scenario", "none") as up:
        kubeconfig = Path(up.endpoints["kubeconfig"])
        provider = up.endpoints["oauth2_token_url"]
        assert provider and provider.startswith("http://127.0.0.1:")
        signed_in = _secret(kubeconfig)["decoded"]
        assert signed_in["token_endpoint"] == provider
        assert _authenticates(provider, signed_in["access_token"])

        renewed: dict[str, Any] = {}

        def rotated() -> bool:
            secret = _secret(kubeconfig)
            renewed.update(secret)
            return secret["decoded"]["access_token"] != signed_in["access_token"]

        wait_until(rotated, timeout=90, what="the Secret's access token to be renewed")
        new = renewed["decoded"]
        assert new["refresh_token"] != signed_in["refresh_token"]  # rotated with it
        assert renewed["metadata"]["annotations"]["nodeward.io/credential-status"] == "ok"
        assert datetime.fromisoformat(new["expires_at"].replace("Z", "+00:00")) > datetime.now(UTC)
        assert _authenticates(provider, new["access_token"])

        out = up.output.out

        def told() -> bool:
            return any(
                line.startswith("DECISION ")
                and f"renew secret/{NAMESPACE}/{SECRET}: applied" in line
                for line in out
            )

        wait_until(told, timeout=15, what=f"the renewal in the story: {out[-10:]}")
        record = asyncio.run(_record(up.endpoints["nats_url"]))
        assert record is not None, "no record of the renewal in KV credentials"
        assert record.status == "ok" and record.renewals >= 1
        assert record.principal == "kubeflow-notebooks"
        assert record.renewed_at is not None and record.expires_at is not None
        assert record.expires_at > record.renewed_at
        printed = "".join(out) + "".join(up.output.err)
        tokens = [signed_in[k] for k in ("access_token", "refresh_token")]
        tokens += [new[k] for k in ("access_token", "refresh_token")]
        assert not [t for t in tokens if t in printed], "a token on the terminal"


def test_up_renews_a_seeded_kerberos_ticket_where_a_kdc_is_installed(tmp_path: Path) -> None:
    from launch.sim_credentials import kerberos_missing

    lacking = kerberos_missing()
    if lacking:
        pytest.skip(f"no local KDC here: missing {'; '.join(lacking)}")
    seed = tmp_path / "seed.yaml"
    seed.write_text(KERBEROS_SEED)
    with running_up(tmp_path, "--seed", str(seed), "--scenario", "none") as up:
        kubeconfig = Path(up.endpoints["kubeconfig"])
        first: dict[str, Any] = {}

        def ticket() -> bool:  # the KDC starts in the background, then writes the ticket
            secret = _secret(kubeconfig, "ml-nlp", "bob-krb5")
            first.update(secret)
            return "krb5cc" in secret["raw"]

        wait_until(ticket, timeout=60, what="bob-krb5's first ticket")
        assert first["metadata"]["labels"]["nodeward.io/credential"] == "kerberos"
        renewed: dict[str, Any] = {}

        def changed() -> bool:
            secret = _secret(kubeconfig, "ml-nlp", "bob-krb5")
            renewed.update(secret)
            return secret["raw"]["krb5cc"] != first["raw"]["krb5cc"]

        wait_until(changed, timeout=60, what="bob-krb5's ticket to be renewed")
        annotations = renewed["metadata"]["annotations"]
        assert annotations["nodeward.io/credential-status"] == "ok"
        assert annotations["nodeward.io/credential-renewable-until"]
        out = up.output.out

        def told() -> bool:
            return any(
                line.startswith("DECISION ") and "renew secret/ml-nlp/bob-krb5: applied" in line
                for line in out
            )

        wait_until(told, timeout=15, what=f"the renewal in the story: {out[-10:]}")
        record = asyncio.run(_record(up.endpoints["nats_url"], "ml-nlp", "bob-krb5"))
        assert record is not None and record.status == "ok" and record.renewals >= 1
        assert record.principal == "bob@NODEWARD.SIM"
        assert record.renewable_until is not None
        printed = "".join(out) + "".join(up.output.err)
        caches = [first["data"]["krb5cc"], renewed["data"]["krb5cc"]]  # base64, as kubectl shows
        tickets = [c[-80:] for c in caches]  # the end holds the encrypted ticket, unique to each
        assert not [t for t in tickets if t in printed], "a ticket cache on the terminal"


def test_up_without_a_kdc_says_so_in_one_line_and_leaves_the_kerberos_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmp_path / "no-k5test"  # a machine without k5test: importing it fails
    fake.mkdir()
    (fake / "k5test.py").write_text("raise ImportError('k5test is not installed here')\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(fake), os.environ.get("PYTHONPATH", "")]))
    with running_up(tmp_path, "--nodes", "1", "--scenario", "none", "--quiet") as up:
        skipped = [line for line in up.output.err if "kerberos.skipped" in line]
        assert len(skipped) == 1, up.output.err
        assert "missing k5test" in skipped[0]
        untouched = _secret(Path(up.endpoints["kubeconfig"]), "ml-nlp", "bob-krb5")
        assert "krb5cc" not in untouched["raw"]
        assert "nodeward.io/credential" not in (untouched["metadata"].get("labels") or {})
        assert up.endpoints["oauth2_token_url"]  # OAuth2 runs all the same


def test_up_mounts_the_owners_credentials_into_a_new_notebook_and_renewals_reach_it(
    tmp_path: Path,
) -> None:
    """The demo's credential story: a notebook created with no credential volume in bob's
    namespace comes up with his credentials mounted (the admission webhook, called by the sim
    cluster over TLS) and runs as bob (uid from the directory's LDAP, where slapd is
    installed); his OAuth2 token's renewal then reaches the file in the pod's volume."""
    from sim.ldap import missing

    with running_up(tmp_path, "--nodes", "2", "--scenario", "none") as up:
        out = up.output.out

        def said(label: str, text: str) -> str | None:
            return next((ln for ln in out if ln.startswith(label) and text in ln), None)

        wait_until(
            lambda: said("ADMIT ", "created with no credential volume"),
            timeout=90,
            what=f"the notebook admitted: {out[-10:]}",
        )
        mounted = said("ADMIT ", "created with no credential volume")
        assert mounted is not None and "bob-oauth" in mounted
        if missing() is None:
            wait_until(lambda: said("ADMIT ", "runs as bob (uid 21002"), timeout=5, what="uid")
        pod = _get(Path(up.endpoints["kubeconfig"]), "ml-nlp", "pod", "bob-kerberos-0")
        volumes = {v["secret"]["secretName"] for v in pod["spec"]["volumes"] if "secret" in v}
        assert "bob-oauth" in volumes
        env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
        assert env["OAUTH2_TOKEN_FILE"] == "/var/run/secrets/nodeward.io/bob-oauth/access_token"
        wait_until(
            lambda: said("MOUNT ", "bob-oauth (oauth2) renewed, and the pod reads the new one"),
            timeout=120,
            what=f"bob's renewed token in the pod's volume: {out[-10:]}",
        )
