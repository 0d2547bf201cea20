"""Credentials reach workloads by themselves, end to end on real peers: OpenLDAP's slapd feeds
the directory service, which labels the namespace with its owner; the sim cluster calls the
real admission webhook over TLS (its CA as `caBundle`) on `kubectl` creates; its kubelet
writes the mounted Secret onto the node; the credentials service renews the Kerberos ticket
at the real KDC, and the renewed ticket is the file the pod sees."""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from launch.sim_identity import register_webhook
from nodeward.bus import Bus
from nodeward.config import Settings
from nodeward.daemon import Daemon
from nodeward.kube import Cluster
from nodeward.kube.base import core
from nodeward.kube.client import KubeClient
from schemas.directory import OWNER_UID
from services.admission.service import app as admission_app
from services.admission.service import up_certificate
from services.admission.webhook import WEBHOOK, configuration
from services.credentials.service import build as build_credentials
from services.directory.service import build as build_directory
from sim.cluster import SimCluster
from sim.cluster.seed import NodeSeed, Seed
from sim.cluster.volumes import mount_source
from sim.ldap import Slapd
from tests.conftest import wait_for
from tests.integration.cordon_fixtures import read_stream
from tests.integration.credentials_fixtures import authenticates, kinit
from tests.integration.simkube import fast_admin_client, run_kubectl, service_settings, stop_env

ROOT = "/var/run/secrets/nodeward.io"
BOB_UID, BOB_GID = 10002, 5000  # tests/integration/ldap_peer.py's bob, in physics
BOB_GROUPS = {5000, 5100, 5200}  # physics, gpu-users, admins


@dataclass
class Platform:
    """The sim cluster (nodes with filesystems), slapd, and nodeward's daemons against them."""

    sim: SimCluster
    client: KubeClient
    admin: Cluster
    bus: Bus
    nats_url: str
    slapd: Slapd
    tmp: Path
    ns: str
    daemons: list[Daemon] = field(default_factory=list)

    @property
    def nodes(self) -> Path:
        return self.tmp / "nodes"

    def settings(self, service: str, config: dict[str, Any]) -> Settings:
        name = f"kubeconfig-{service}-{self.ns}"
        kubeconfig = self.sim.write_kubeconfig(self.tmp / name, identity=service)
        return service_settings(self.nats_url, kubeconfig, service, config)

    async def start(self, daemon: Daemon) -> Daemon:
        await daemon.start()
        self.daemons.append(daemon)
        return daemon

    async def directory(self) -> Daemon:
        config = {
            "url": self.slapd.url,
            "starttls": True,
            "ca_file": str(self.slapd.ca_file),
            "bind_dn": self.slapd.bind_dn,
            "bind_password_file": str(self.slapd.password_file),
            "user_base": self.slapd.people,
            "group_base": self.slapd.groups,
            "interval": "30s",
        }
        return await self.start(await build_directory(self.settings("directory", config)))

    async def admission(self, failure_policy: str = "Ignore", *, dry_run: bool = False) -> Daemon:
        """The webhook on loopback, registered with the sim once its cache is in."""
        ca_file, cert, key = up_certificate(self.tmp)
        config = {
            "host": "127.0.0.1",
            "port": 0,
            "tls_cert_file": str(cert),
            "tls_key_file": str(key),
            "failure_policy": failure_policy,
            "dry_run": dry_run,
        }
        built = await admission_app.assemble(self.settings("admission", config))
        daemon = await self.start(built.daemon)
        await wait_for(self.ready(daemon), timeout=20, what="the webhook's cache synced")
        settings = built.service.server.settings
        found = configuration(ca_file.read_bytes(), url=built.service.server.url, settings=settings)
        await register_webhook(self.client, found)
        return daemon

    def ready(self, daemon: Daemon) -> Callable[[], Awaitable[bool]]:
        async def check() -> bool:
            return (await daemon.readiness()).ready

        return check

    async def kubectl(self, *args: str) -> tuple[int, str, str]:
        return await run_kubectl(self.sim, self.tmp, *args)

    async def secret(self, name: str, kind: str, data: dict[str, bytes]) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name, "namespace": self.ns, "labels": {CREDENTIAL: kind}},
            "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
        }
        await self.client.request("POST", core("secrets", namespace=self.ns), body=body)

    async def pod(self, name: str) -> dict[str, Any]:
        found: dict[str, Any] = await self.client.request(
            "GET", core("pods", name, namespace=self.ns)
        )
        return found

    async def running(self, name: str) -> dict[str, Any]:
        async def check() -> dict[str, Any] | None:
            pod = await self.pod(name)
            return pod if pod.get("status", {}).get("phase") == "Running" else None

        found: dict[str, Any] = await wait_for(check, timeout=30, what=f"{name} running")
        return found

    async def mounted_by_dry_run(self, secret: str) -> bool:
        """Whether a server-side dry-run create is given `secret`'s volume: the webhook's
        cache has seen it (nothing is stored)."""
        answer = await self.client.request(
            "POST",
            core("pods", namespace=self.ns),
            query={"dryRun": "All"},
            body=_pod(f"probe-{uuid.uuid4().hex[:6]}"),
        )
        return any(
            (v.get("secret") or {}).get("secretName") == secret
            for v in answer["spec"].get("volumes") or []
        )


CREDENTIAL = "nodeward.io/credential"


def _pod(name: str, **container: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "python:3.12"} | container],
        },
    }


Factory = Callable[[], Awaitable[Platform]]


@pytest.fixture
async def platform(bus: Bus, nats_url: str, tmp_path: Path, slapd: Slapd) -> AsyncIterator[Factory]:
    """`await platform()`: a sim cluster with one node and a namespace owned by bob, opted
    in to the webhook; the daemons are started by each test."""
    made: list[Platform] = []

    async def make() -> Platform:
        ns = f"team-{uuid.uuid4().hex[:6]}"
        seed = Seed(namespaces=["nodeward"], nodes=[NodeSeed(name="node-a", gpu=None)])
        sim = SimCluster(seed, port=0, bookmark_interval=0.2, archive_root=tmp_path / "nodes")
        await sim.start()
        client = fast_admin_client(sim, tmp_path, ns)
        env = Platform(sim, client, Cluster(client), bus, nats_url, slapd, tmp_path, ns)
        made.append(env)
        labels = {"nodeward.io/owner": "bob", "nodeward.io/admission": "enabled"}
        body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": labels}}
        await client.request("POST", core("namespaces"), body=body)
        return env

    yield make
    for env in made:
        await stop_env(env.daemons, env.sim, env.admin)


async def owner_synced(env: Platform) -> None:
    async def check() -> bool:
        labels = (await env.admin.namespaces.get(env.ns))["metadata"].get("labels") or {}
        return labels.get(OWNER_UID) == str(BOB_UID)

    await wait_for(check, timeout=20, what="bob's uid on the namespace, from LDAP")


async def test_kubectl_pod_gets_the_credentials_and_the_owners_identity(
    platform: Factory,
) -> None:
    env = await platform()
    await env.directory()
    await owner_synced(env)
    await env.secret("bob-krb5", "kerberos", {"krb5cc": b"ticket-1", "keytab": b"never-mounted"})
    await env.secret("bob-oauth", "oauth2", {"access_token": b"tok-1", "refresh_token": b"rt"})
    await env.admission()
    await wait_for(lambda: env.mounted_by_dry_run("bob-oauth"), timeout=10, what="cache")
    await wait_for(lambda: env.mounted_by_dry_run("bob-krb5"), timeout=10, what="cache")

    rc, _, err = await env.kubectl(
        "-n", env.ns, "run", "nb", "--image=python:3.12", "--restart=Never", "--", "sleep", "1d"
    )
    assert rc == 0, err
    pod = await env.running("nb")
    # The mutated pod is one the official schemas accept, as stored and served.
    kubernetes_validate.validate(pod, kubernetes_validate.latest_version(), strict=True)
    spec = pod["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    krb = next(
        v for v in volumes.values() if (v.get("secret") or {}).get("secretName") == "bob-krb5"
    )
    assert krb["secret"]["items"] == [{"key": "krb5cc", "path": "krb5cc"}]  # never the keytab
    main = spec["containers"][0]
    env_vars = {e["name"]: e.get("value") for e in main["env"]}
    assert env_vars["KRB5CCNAME"] == f"FILE:{ROOT}/bob-krb5/krb5cc"
    assert env_vars["OAUTH2_TOKEN_FILE"] == f"{ROOT}/bob-oauth/access_token"
    mounts = {m["mountPath"]: m for m in main["volumeMounts"]}
    assert mounts[f"{ROOT}/bob-krb5"]["readOnly"] is True
    context = spec["securityContext"]
    assert (context["runAsUser"], context["runAsGroup"], context["fsGroup"]) == (
        BOB_UID,
        BOB_GID,
        BOB_GID,
    )
    assert set(context["supplementalGroups"]) >= BOB_GROUPS
    # What the container sees, on the node's filesystem as its kubelet wrote it.
    ticket = mount_source(env.nodes, pod, "nb", f"{ROOT}/bob-krb5/krb5cc")
    assert ticket.read_bytes() == b"ticket-1"
    assert not (ticket.parent / "keytab").exists()

    # A credential read by subPath (renewal never reaches it) is refused, saying the fix.
    manifest = _pod("by-subpath")
    manifest["spec"]["volumes"] = [{"name": "k", "secret": {"secretName": "bob-krb5"}}]
    manifest["spec"]["containers"][0]["volumeMounts"] = [
        {"name": "k", "mountPath": "/tmp/krb5cc", "subPath": "krb5cc"}
    ]
    path = env.tmp / "subpath.json"
    path.write_text(json.dumps(manifest))
    rc, _, err = await env.kubectl("-n", env.ns, "create", "-f", str(path))
    assert rc != 0
    assert f'admission webhook "{WEBHOOK}" denied the request' in err, err
    assert "subPath" in err and "bob-krb5" in err, err
    # Another user's uid (root here) is refused.
    rc, _, err = await env.kubectl(
        "-n",
        env.ns,
        "run",
        "as-root",
        "--image=python:3.12",
        "--restart=Never",
        '--overrides={"spec":{"securityContext":{"runAsUser":0}}}',
    )
    assert rc != 0 and "denied the request" in err, err
    # A pod that opted out is left as it is.
    rc, _, err = await env.kubectl(
        "-n", env.ns, "run", "plain", "--image=python:3.12", "--restart=Never",
        "--labels=nodeward.io/admission=disabled",
    )  # fmt: skip
    assert rc == 0, err
    plain = await env.pod("plain")
    assert not any(v["name"].startswith("nodeward-cred") for v in plain["spec"]["volumes"])


@pytest.mark.parametrize("policy", ["Ignore", "Fail"])
async def test_a_webhook_that_is_down_under_its_failure_policy(
    platform: Factory, policy: str
) -> None:
    env = await platform()
    await env.secret("bob-krb5", "kerberos", {"krb5cc": b"ticket-1"})
    daemon = await env.admission(policy)
    await daemon.stop()
    env.daemons.remove(daemon)
    rc, _, err = await env.kubectl(
        "-n", env.ns, "run", "nb", "--image=python:3.12", "--restart=Never"
    )
    if policy == "Ignore":
        assert rc == 0, err  # created, unmutated: an outage never blocks pod creation
        pod = await env.pod("nb")
        assert not any(v["name"].startswith("nodeward-cred") for v in pod["spec"]["volumes"])
    else:
        assert rc != 0
        assert f'failed calling webhook "{WEBHOOK}"' in err, err


async def test_a_renewed_ticket_reaches_the_file_in_the_pods_volume(
    platform: Factory, kdc: Any, tmp_path: Path
) -> None:
    env = await platform()
    original = kinit(kdc, tmp_path / "cc", life="4s", renew="1h")
    await env.secret("bob-krb5", "kerberos", {"krb5cc": original})
    await env.admission()
    await wait_for(lambda: env.mounted_by_dry_run("bob-krb5"), timeout=10, what="cache")
    rc, _, err = await env.kubectl(
        "-n", env.ns, "run", "nb", "--image=python:3.12", "--restart=Never"
    )
    assert rc == 0, err
    pod = await env.running("nb")
    ticket = mount_source(env.nodes, pod, "nb", f"{ROOT}/bob-krb5/krb5cc")
    assert ticket.read_bytes() == original

    uid = uuid.uuid4().hex[:8]
    config = {
        "consumer": f"credentials-{uid}",
        "bucket": f"credentials-{uid}",
        "subjects": [f"credentials.due.{env.ns}.>"],
        "lease": f"credentials-{uid}",
        "scan_interval": "0.3s",
        "republish_after": "3s",
        "retry_delays": [0.3, 0.5, 1.0],
        "jitter": 0.0,
        "krb5_config": kdc.env["KRB5_CONFIG"],
        "verify_service": f"host@{kdc.hostname}",
        "renew_when_left": 0.6,
    }
    await env.start(await build_credentials(env.settings("credentials", config)))

    async def renewed() -> bool:
        events = await read_stream(env.bus, "CREDENTIALS", f"credentials.renewed.{env.ns}.>")
        return bool(events)

    await wait_for(renewed, timeout=30, what="a renewal")

    async def arrived() -> bytes | None:
        stored = await env.admin.secrets.get(env.ns, "bob-krb5")
        want = base64.b64decode(stored["data"]["krb5cc"])
        have = ticket.read_bytes()
        return have if have == want and have != original else None

    inside = await wait_for(arrived, timeout=20, what="the renewed ticket in the pod's volume")
    # The workload authenticates with what it reads there, past the first ticket's life.
    assert authenticates(kdc, inside, tmp_path) == kdc.user_princ


async def test_in_dry_run_pods_are_admitted_as_they_are_and_told_what_would_change(
    platform: Factory,
) -> None:
    env = await platform()
    await env.secret("bob-krb5", "kerberos", {"krb5cc": b"ticket-1"})
    owner = {OWNER_UID: str(BOB_UID), "nodeward.io/owner-gid": str(BOB_GID)}  # as the directory
    await env.admin.namespaces.merge_metadata(env.ns, labels=owner)
    await env.admission(dry_run=True)
    rc, _, err = await env.kubectl(
        "-n", env.ns, "run", "nb", "--image=python:3.12", "--restart=Never"
    )
    assert rc == 0, err
    assert "Warning: nodeward dry run: would set /spec/" in err, err
    pod = await env.pod("nb")
    assert not any(v["name"].startswith("nodeward-cred") for v in pod["spec"]["volumes"])
    rc, _, err = await env.kubectl(
        "-n", env.ns, "run", "as-root", "--image=python:3.12", "--restart=Never",
        '--overrides={"spec":{"securityContext":{"runAsUser":0}}}',
    )  # fmt: skip
    assert rc == 0, err  # admitted, with the refusal it would have made as a warning
    assert "Warning: nodeward dry run: would refuse:" in err, err
