"""`nodeward up`'s identity peers: a seeded LDAP directory for the directory service, and the
admission webhook's certificate and its registration with the sim cluster.

- Where Debian's slapd is installed, `up` runs one on loopback (`sim.ldap`), seeded with the
  demo's users (each the owner of one team namespace of the seed) and their groups and
  e-groups, and points `services.directory` at it over StartTLS with a bind account whose
  password is a file, as the chart mounts it; otherwise one line says why, and the directory
  service runs idle.
- The admission webhook listens on loopback with a certificate made in the state dir
  (`services.admission.service`); once it is ready its MutatingWebhookConfiguration is
  created in the sim cluster with that CA as `caBundle`, and the sim calls it over HTTPS as
  kube-apiserver would (`register_webhook`).
- `show_mounted_credentials` tells the demo's credential story: a notebook created with no
  credential volume comes up with its owner's ticket mounted and its uid set, and a renewal
  reaches the file inside the pod's volume.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import structlog

from nodeward.config import Settings
from nodeward.kube.client import KubeClient
from nodeward.kube.errors import Conflict, NotFound
from schemas.directory import OWNER, OWNER_UID
from sim.cluster import volumes
from sim.ldap import Group, Slapd, User, missing

Obj = dict[str, Any]

ADMISSION = "admission"
DIRECTORY = "directory"
WEBHOOKS_PATH = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"

USERS = (
    User("alice", 21001, 21001, "alice@nodeward.sim", "Alice Martin", "atlas"),
    User("bob", 21002, 21002, "bob@nodeward.sim", "Bob Keller", "cms"),
    User("carol", 21003, 21003, "carol@nodeward.sim", "Carol Rossi", "alice"),
    User("dave", 21004, 21004, "dave@nodeward.sim", "Dave Novak", "lhcb"),
    User("erin", 21005, 21005, "erin@nodeward.sim", "Erin Dubois", "atlas"),
)
"""The demo's users; each owns the team namespace the seed names them in."""
GROUPS = (
    *(Group(u.login, int(u.uid), (u.login,)) for u in USERS),
    Group("gpu-users", 22000, tuple(u.login for u in USERS)),
)
EGROUPS = (
    Group("atlas-ml", 23001, ("alice", "erin")),
    Group("cms-ml", 23002, ("bob",)),
)


async def register_webhook(client: KubeClient, configuration: dict[str, Any]) -> None:
    """Create (or replace) the webhook's MutatingWebhookConfiguration in the cluster."""
    name = configuration["metadata"]["name"]
    try:
        await client.request("POST", WEBHOOKS_PATH, body=configuration)
    except Conflict:
        current = await client.request("GET", f"{WEBHOOKS_PATH}/{name}")
        body = {**configuration, "metadata": {**current["metadata"], **configuration["metadata"]}}
        await client.request("PUT", f"{WEBHOOKS_PATH}/{name}", body=body)


@contextlib.asynccontextmanager
async def directory(state_dir: Path, settings: Settings) -> AsyncIterator[Slapd | None]:
    """A seeded slapd the directory service is pointed at, for the life of the block; None
    (one warning saying why) where slapd is not installed or does not start."""
    log = structlog.get_logger().bind(component="up")
    why = missing()
    if why is not None:
        log.warning("up.no_ldap", why=f"{why}: the directory service runs idle")
        yield None
        return
    slapd = Slapd(state_dir / "ldap", dies_with_parent=True)
    try:
        await asyncio.to_thread(slapd.start)
        await asyncio.to_thread(slapd.add_users, USERS)
        await asyncio.to_thread(slapd.add_groups, GROUPS)
        await asyncio.to_thread(slapd.add_groups, EGROUPS, egroups=True)
    except Exception as exc:  # noqa: BLE001 - the demo goes on without a directory
        log.warning(
            "up.no_ldap", why=f"slapd did not start: {exc}: the directory service runs idle"
        )
        await asyncio.to_thread(slapd.stop)
        yield None
        return
    settings.services.setdefault(DIRECTORY, {}).update(
        url=slapd.url,
        starttls=True,
        ca_file=str(slapd.ca_file),
        bind_dn=slapd.bind_dn,
        bind_password_file=str(slapd.password_file),
        user_base=slapd.people,
        group_base=slapd.groups,
        experiment_group_base=slapd.egroups,
        interval="30s",
    )
    log.info("up.ldap", url=slapd.url, users=len(USERS))
    try:
        yield slapd
    finally:
        await asyncio.to_thread(slapd.stop)


NOTEBOOK_NAMESPACE = "ml-nlp"
NOTEBOOK = "bob-kerberos"
NOTEBOOK_IMAGE = "kubeflownotebookswg/jupyter-scipy:v1.8.0"
CREDENTIAL = "nodeward.io/credential"
ROOT = "/var/run/secrets/nodeward.io"
"""Where the webhook mounts credentials (`services.admission` `mount_root`'s default)."""
FILES = {"kerberos": "krb5cc", "oauth2": "access_token"}
"""The file of each credential kind the webhook mounts (`services.admission.policy`)."""

Say = Callable[[str, str], None]
"""`say(label, detail)`: one story line."""


def _notebook(namespace: str, name: str) -> tuple[Obj, Obj]:
    """A Notebook with no credential volume, and the StatefulSet Kubeflow's notebook
    controller makes of it (`generateStatefulSet`: one replica, `statefulset` and
    `notebook-name` labels, the Notebook's pod template)."""
    pod_spec = {"containers": [{"name": name, "image": NOTEBOOK_IMAGE}]}
    notebook = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "Notebook",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": name}},
        "spec": {"template": {"spec": pod_spec}},
    }
    labels = {"statefulset": name, "notebook-name": name}
    statefulset = {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": 1,
            "serviceName": "",
            "selector": {"matchLabels": {"statefulset": name}},
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }
    return notebook, statefulset


async def until(what: Callable[[], Awaitable[Any]], timeout: float, every: float = 0.5) -> Any:
    """`what()`'s first truthy answer, polled; None past `timeout`."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        found = await what()
        if found or asyncio.get_running_loop().time() > deadline:
            return found or None
        await asyncio.sleep(every)


def _read(path: Path) -> bytes:
    """The file's bytes, none while it is not there."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return b""


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:8]


async def show_mounted_credentials(
    client: KubeClient, nc: Any, nodes_root: Path, say: Say, *, timeout: float = 120.0
) -> None:
    """Create a notebook with no credential volume in the demo owner's namespace, tell what
    the webhook gave its pod (volumes, variables, uid), then tell each renewal of a mounted
    credential once it has reached the file inside the pod's volume."""
    ns, name = NOTEBOOK_NAMESPACE, NOTEBOOK
    ns_path = f"/api/v1/namespaces/{ns}"

    async def owner_known() -> Obj | None:
        found: Obj = await client.request("GET", ns_path)
        return found if OWNER_UID in (found["metadata"].get("labels") or {}) else None

    async def kerberos_ready() -> bool:
        listing = await client.request(
            "GET", f"{ns_path}/secrets", query={"labelSelector": f"{CREDENTIAL}=kerberos"}
        )
        return bool(listing.get("items"))

    try:
        await client.request("GET", ns_path)
    except NotFound:
        structlog.get_logger().info("up.no_credential_demo", why=f"no namespace {ns} in the seed")
        return
    namespace = await until(owner_known, 60.0)
    await until(kerberos_ready, 60.0)  # the KDC writes bob's ticket soon after the start
    notebook, statefulset = _notebook(ns, name)
    made = await client.request(
        "POST", f"/apis/kubeflow.org/v1/namespaces/{ns}/notebooks", body=notebook
    )
    statefulset["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "kubeflow.org/v1",
            "kind": "Notebook",
            "name": name,
            "uid": made["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    await client.request("POST", f"/apis/apps/v1/namespaces/{ns}/statefulsets", body=statefulset)

    async def running() -> Obj | None:
        try:
            pod: Obj = await client.request("GET", f"{ns_path}/pods/{name}-0")
        except NotFound:
            return None
        return pod if (pod.get("status") or {}).get("phase") == "Running" else None

    pod = await until(running, timeout)
    if pod is None:
        say("ADMIT", f"{ns}/{name}-0 did not start within {timeout:.0f} s")
        return
    container = pod["spec"]["containers"][0]
    mounts = {
        m["name"]: m["mountPath"]
        for m in container.get("volumeMounts") or []
        if m["mountPath"].startswith(f"{ROOT}/")
    }
    secrets = {
        v["name"]: v["secret"]["secretName"] for v in pod["spec"]["volumes"] if v["name"] in mounts
    }
    env = {e["name"]: e.get("value", "") for e in container.get("env") or []}
    context = pod["spec"].get("securityContext") or {}
    who = "runs with no uid set (no owner in the directory)"
    if namespace is not None and "runAsUser" in context:
        login = namespace["metadata"]["labels"].get(OWNER, "?")
        who = (
            f"runs as {login} (uid {context['runAsUser']}, gid {context.get('runAsGroup')}, "
            "from LDAP)"
        )
    shown = ", ".join(sorted(secrets.values())) or "nothing"
    say("ADMIT", f"{ns}/{name}-0 created with no credential volume: {shown} mounted under {ROOT}/")
    variables = " ".join(f"{k}={v}" for k, v in sorted(env.items()) if k == "KRB5CCNAME")
    say("ADMIT", f"{ns}/{name}-0 {who}" + (f"; {variables}" if variables else ""))
    if not mounts:
        return
    by_secret = {secret: mounts[volume] for volume, secret in secrets.items()}
    renewed: asyncio.Queue[str] = asyncio.Queue()

    async def on_renewed(msg: Any) -> None:
        secret = msg.subject.rsplit(".", 1)[-1]
        if secret in by_secret:
            renewed.put_nowait(secret)

    sub = await nc.subscribe(f"credentials.renewed.{ns}.*", cb=on_renewed)
    try:
        told: set[str] = set()
        while told != set(by_secret):
            secret = await renewed.get()
            stored: Obj = await client.request("GET", f"{ns_path}/secrets/{secret}")
            kind = (stored["metadata"].get("labels") or {}).get(CREDENTIAL, "")
            key = FILES.get(kind)
            if key is None:
                continue
            path = f"{by_secret[secret]}/{key}"
            on_node = volumes.mount_source(nodes_root, pod, container["name"], path)

            async def arrived(s: str = secret, k: str = key, f: Path = on_node) -> bytes | None:
                now: Obj = await client.request("GET", f"{ns_path}/secrets/{s}")
                want = base64.b64decode((now.get("data") or {}).get(k, ""))
                have = await asyncio.to_thread(_read, f)
                return have if want and have == want else None

            found = await until(arrived, 60.0)
            if found is None:
                say("MOUNT", f"{ns}/{name}-0: renewed {secret} has not reached {path}")
                continue
            told.add(secret)
            say(
                "MOUNT",
                f"{ns}/{name}-0: {secret} ({kind}) renewed, and the pod reads the new one at "
                f"{path} (sha256 {_digest(found)}), no restart",
            )
    finally:
        await sub.unsubscribe()
