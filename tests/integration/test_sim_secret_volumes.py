"""The sim's kubelets project Secret volumes onto their nodes' filesystems and keep them fresh.

Sources: `pkg/volume/secret/secret.go` (`SetUpAt`, `MakePayload`: every key or the `items`,
`defaultMode`/`mode`, `optional`), `pkg/volume/util/atomic_writer.go` (the `..<timestamp>`
directory, the `..data` symlink renamed over, one symlink per top-level path),
`pkg/kubelet/kubelet_pods.go` (`makeMounts`: a subPath bind at
`volume-subpaths/<volume>/<container>/<index>`, never updated; `makeEnvironmentVariables`:
env resolved at container creation, never updated), the secret manager's NotFound
(`secret "x" not found`) and the volume manager's `FailedMount` event.
"""

from __future__ import annotations

import base64
import os
import stat
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sim.cluster import SimCluster
from sim.cluster.seed import NodeSeed, Seed
from sim.cluster.volumes import read_env, volume_path
from tests.conftest import wait_for
from tests.integration.simkube import sim_http

NS = "team-krb"
NODE = "node-a"
PODS = f"/api/v1/namespaces/{NS}/pods"
SECRETS = f"/api/v1/namespaces/{NS}/secrets"


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[SimCluster]:
    """A one-node sim whose nodes have filesystems under `tmp_path/nodes`."""
    seed = Seed(namespaces=[NS], nodes=[NodeSeed(name=NODE)])
    async with SimCluster(seed, archive_root=tmp_path / "nodes", bookmark_interval=0.2) as sim:
        yield sim


def _secret(name: str, **data: bytes) -> dict[str, Any]:
    encoded = {k: base64.b64encode(v).decode() for k, v in data.items()}
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "data": encoded}


def _pod(
    name: str, volumes: list[dict[str, Any]], node: str = NODE, **container: Any
) -> dict[str, Any]:
    main = {"name": "main", "image": "busybox:1.36", **container}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"nodeName": node, "containers": [main], "volumes": volumes},
    }


async def _create(http: httpx.AsyncClient, path: str, body: dict[str, Any]) -> dict[str, Any]:
    made = await http.post(path, json=body)
    assert made.status_code == 201, made.text
    return dict(made.json())


async def _phase(http: httpx.AsyncClient, name: str, phase: str) -> dict[str, Any]:
    async def reached() -> dict[str, Any] | None:
        pod = (await http.get(f"{PODS}/{name}")).json()
        return pod if pod["status"].get("phase") == phase else None

    return dict(await wait_for(reached, timeout=10, what=f"pod {name} {phase}"))


async def _waiting(http: httpx.AsyncClient, name: str, reason: str) -> dict[str, Any]:
    async def waits() -> dict[str, Any] | None:
        pod = (await http.get(f"{PODS}/{name}")).json()
        states = [c["state"] for c in pod["status"].get("containerStatuses") or []]
        return (
            pod if any((s.get("waiting") or {}).get("reason") == reason for s in states) else None
        )

    return dict(await wait_for(waits, timeout=10, what=f"pod {name} waiting {reason}"))


def _bytes(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


async def test_a_renewed_secret_reaches_the_volume_not_the_subpath_nor_the_env(
    cluster: SimCluster,
) -> None:
    volumes = [
        {"name": "whole", "secret": {"secretName": "krb"}},
        {
            "name": "picked",
            "secret": {
                "secretName": "krb",
                "defaultMode": 0o440,
                "items": [
                    {"key": "ccache", "path": "tickets/current", "mode": 0o400},
                    {"key": "conf", "path": "krb5.conf"},
                ],
            },
        },
    ]
    mounts = [
        {"name": "whole", "mountPath": "/etc/krb"},
        {"name": "picked", "mountPath": "/etc/picked"},
        {"name": "whole", "mountPath": "/tmp/krb5cc", "subPath": "ccache"},
    ]
    env = [
        {"name": "TICKET", "valueFrom": {"secretKeyRef": {"name": "krb", "key": "ccache"}}},
        {"name": "PLAIN", "value": "yes"},
    ]
    env_from = [{"secretRef": {"name": "krb"}, "prefix": "KRB_"}]
    async with sim_http(cluster) as http:
        await _create(http, SECRETS, _secret("krb", ccache=b"ticket-1", conf=b"[libdefaults]"))
        body = _pod("user-1", volumes, volumeMounts=mounts, env=env, envFrom=env_from)
        await _create(http, PODS, body)
        pod = await _phase(http, "user-1", "Running")
        kubelets = cluster.kubelets

        # the whole Secret, as the AtomicWriter lays it out
        whole = kubelets.mount_source(pod, "main", "/etc/krb")
        assert whole == volume_path(
            cluster.archive_root or Path(), NODE, pod["metadata"]["uid"], "whole"
        )
        assert str(whole).endswith(
            f"{NODE}/var/lib/kubelet/pods/{pod['metadata']['uid']}"
            "/volumes/kubernetes.io~secret/whole"
        )
        first = os.readlink(whole / "..data")
        assert first.startswith("..20") and (whole / first).is_dir()
        assert stat.S_IMODE((whole / first).stat().st_mode) == 0o755
        assert os.readlink(whole / "ccache") == "..data/ccache"
        assert sorted(p.name for p in whole.iterdir() if not p.name.startswith("..")) == [
            "ccache",
            "conf",
        ]
        assert kubelets.mount_source(pod, "main", "/etc/krb/ccache").read_bytes() == b"ticket-1"
        assert stat.S_IMODE((whole / "ccache").stat().st_mode) == 0o644

        # items: mapped paths, their modes, the volume's defaultMode
        ticket = kubelets.mount_source(pod, "main", "/etc/picked/tickets/current")
        assert ticket.read_bytes() == b"ticket-1"
        assert stat.S_IMODE(ticket.stat().st_mode) == 0o400
        conf = kubelets.mount_source(pod, "main", "/etc/picked/krb5.conf")
        assert stat.S_IMODE(conf.stat().st_mode) == 0o440
        assert not (ticket.parent.parent / "ccache").exists()

        # subPath: a bind of the file taken at container start
        sub = kubelets.mount_source(pod, "main", "/tmp/krb5cc")
        assert sub.parts[-4:] == ("volume-subpaths", "whole", "main", "2")
        assert sub.read_bytes() == b"ticket-1"

        # env: resolved at container start
        expected = {"KRB_ccache": "ticket-1", "KRB_conf": "[libdefaults]", "TICKET": "ticket-1"}
        assert kubelets.env(pod, "main") == expected | {"PLAIN": "yes"}
        assert read_env(cluster.archive_root or Path(), pod, "main") == expected | {"PLAIN": "yes"}

        # the ticket is renewed through the API
        renewed = (await http.get(f"{SECRETS}/krb")).json()
        renewed["data"]["ccache"] = base64.b64encode(b"ticket-2").decode()
        put = await http.put(f"{SECRETS}/krb", json=renewed)
        assert put.status_code == 200, put.text
        await wait_for(
            lambda: _bytes(whole / "ccache") == b"ticket-2",
            timeout=10,
            what="the renewed ticket in the volume",
        )
        await wait_for(
            lambda: _bytes(ticket) == b"ticket-2", timeout=10, what="the renewed ticket in items"
        )
        second = os.readlink(whole / "..data")
        assert second != first and not (whole / first).exists()
        assert stat.S_IMODE(ticket.stat().st_mode) == 0o400
        assert sub.read_bytes() == b"ticket-1"
        assert kubelets.env(pod, "main")["TICKET"] == "ticket-1"
        assert read_env(cluster.archive_root or Path(), pod, "main")["TICKET"] == "ticket-1"

        # a key removed from the Secret leaves the volume; a write changing no data writes nothing
        del renewed["data"]["conf"]
        renewed["metadata"] = put.json()["metadata"]
        put = await http.put(f"{SECRETS}/krb", json=renewed)
        assert put.status_code == 200, put.text
        await wait_for(lambda: not os.path.lexists(whole / "conf"), timeout=10, what="conf removed")
        third = os.readlink(whole / "..data")
        patched = await http.patch(
            f"{SECRETS}/krb",
            json={"metadata": {"labels": {"renewed": "yes"}}},
            headers={"Content-Type": "application/merge-patch+json"},
        )
        assert patched.status_code == 200, patched.text
        # the kubelet's turn of the loop for the label has come when a later request is answered
        await http.get(f"{SECRETS}/krb")
        assert os.readlink(whole / "..data") == third  # same data: nothing written
        renewed = patched.json()
        renewed["data"]["ccache"] = base64.b64encode(b"ticket-3").decode()
        assert (await http.put(f"{SECRETS}/krb", json=renewed)).status_code == 200
        await wait_for(lambda: _bytes(whole / "ccache") == b"ticket-3", timeout=10, what="ticket-3")
        assert os.readlink(whole / "..data") != third
        assert [p.name for p in whole.iterdir() if p.name.startswith("..20")] == [
            os.readlink(whole / "..data")
        ]


async def test_a_missing_secret_keeps_the_pod_creating_until_it_is_made(
    cluster: SimCluster,
) -> None:
    volumes = [{"name": "creds", "secret": {"secretName": "absent"}}]
    mounts = [{"name": "creds", "mountPath": "/creds"}]
    async with sim_http(cluster) as http:
        await _create(http, PODS, _pod("waits", volumes, volumeMounts=mounts))
        pod = await _waiting(http, "waits", "ContainerCreating")
        assert pod["status"]["phase"] == "Pending"
        assert "podIP" not in pod["status"]
        ready = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
        assert ready["Ready"] == "False" and ready["PodReadyToStartContainers"] == "False"

        async def failed_mount() -> list[dict[str, Any]]:
            events = (await http.get(f"/api/v1/namespaces/{NS}/events")).json()["items"]
            return [e for e in events if e.get("reason") == "FailedMount"]

        events = await wait_for(failed_mount, timeout=10, what="the FailedMount event")
        assert events[0]["message"] == (
            'MountVolume.SetUp failed for volume "creds" : secret "absent" not found'
        )
        assert events[0]["type"] == "Warning"
        assert events[0]["involvedObject"]["name"] == "waits"
        assert events[0]["source"] == {"component": "kubelet", "host": NODE}
        assert not cluster.kubelets.mount_source(pod, "main", "/creds").exists()

        # the kubelet retries: the Secret made, the pod starts
        await _create(http, SECRETS, _secret("absent", token=b"t1"))
        pod = await _phase(http, "waits", "Running")
    path = cluster.kubelets.mount_source(pod, "main", "/creds/token")
    assert path.read_bytes() == b"t1"


async def test_a_missing_key_or_an_optional_secret(cluster: SimCluster) -> None:
    volumes = [
        {"name": "opt", "secret": {"secretName": "nowhere", "optional": True}},
        {"name": "keyed", "secret": {"secretName": "s", "items": [{"key": "no", "path": "x"}]}},
    ]
    mounts = [{"name": "opt", "mountPath": "/opt"}, {"name": "keyed", "mountPath": "/k"}]
    async with sim_http(cluster) as http:
        await _create(http, SECRETS, _secret("s", yes=b"1"))
        await _create(http, PODS, _pod("keyed", volumes, volumeMounts=mounts))
        await _waiting(http, "keyed", "ContainerCreating")

        async def failed_mount() -> list[str]:
            events = (await http.get(f"/api/v1/namespaces/{NS}/events")).json()["items"]
            return [e["message"] for e in events if e.get("reason") == "FailedMount"]

        messages = await wait_for(failed_mount, timeout=10, what="the FailedMount event")
        assert messages == [
            'MountVolume.SetUp failed for volume "keyed" : references non-existent secret key: no'
        ]
        # the optional volume, its Secret missing, is mounted empty
        pod = (await http.get(f"{PODS}/keyed")).json()
        opt = cluster.kubelets.mount_source(pod, "main", "/opt")
        assert [p.name for p in opt.iterdir() if not p.name.startswith("..")] == []
        assert os.readlink(opt / "..data").startswith("..20")


async def test_env_from_a_missing_secret_is_a_config_error(cluster: SimCluster) -> None:
    env = [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "gone", "key": "t"}}}]
    opt = [
        {"name": "O", "valueFrom": {"secretKeyRef": {"name": "s", "key": "no", "optional": True}}}
    ]
    async with sim_http(cluster) as http:
        await _create(http, PODS, _pod("env-1", [], env=env))
        pod = await _waiting(http, "env-1", "CreateContainerConfigError")
        waiting = pod["status"]["containerStatuses"][0]["state"]["waiting"]
        assert waiting["message"] == 'secret "gone" not found'
        assert pod["status"]["phase"] == "Pending"
        await _create(http, SECRETS, _secret("s", t=b"1"))
        keyed = [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]
        await _create(http, PODS, _pod("env-2", [], env=keyed))
        pod = await _waiting(http, "env-2", "CreateContainerConfigError")
        waiting = pod["status"]["containerStatuses"][0]["state"]["waiting"]
        assert waiting["message"] == f"couldn't find key k in Secret {NS}/s"
        await _create(http, PODS, _pod("env-3", [], env=opt))
        pod = await _phase(http, "env-3", "Running")
        assert cluster.kubelets.env(pod, "main") == {}
        # the missing Secret made: the first pod starts with it
        await _create(http, SECRETS, _secret("gone", t=b"late"))
        pod = await _phase(http, "env-1", "Running")
        assert cluster.kubelets.env(pod, "main") == {"T": "late"}


async def test_a_deleted_pod_leaves_no_directory_on_its_node(cluster: SimCluster) -> None:
    volumes = [{"name": "creds", "secret": {"secretName": "c"}}]
    mounts = [
        {"name": "creds", "mountPath": "/creds"},
        {"name": "creds", "mountPath": "/one", "subPath": "a"},
    ]
    async with sim_http(cluster) as http:
        await _create(http, SECRETS, _secret("c", a=b"1"))
        await _create(http, PODS, _pod("bye", volumes, volumeMounts=mounts, env=[]))
        pod = await _phase(http, "bye", "Running")
        volume = cluster.kubelets.mount_source(pod, "main", "/creds")
        pod_dir = volume.parents[2]
        assert (volume / "a").read_bytes() == b"1" and pod_dir.name == pod["metadata"]["uid"]
        deleted = await http.delete(f"{PODS}/bye")
        assert deleted.status_code == 200, deleted.text
        assert volume.exists()  # terminating: still mounted

        async def gone() -> bool:
            return (await http.get(f"{PODS}/bye")).status_code == 404 and not pod_dir.exists()

        await wait_for(gone, timeout=10, what="the pod and its directory gone")
    assert pod_dir.parent.is_dir()


async def test_without_node_filesystems_the_kubelet_still_checks_and_resolves(
    sim: SimCluster,
) -> None:
    volumes = [{"name": "creds", "secret": {"secretName": "nope"}}]
    env = [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "here", "key": "t"}}}]
    async with sim_http(sim) as http:
        await http.post(
            "/api/v1/namespaces",
            json={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}},
        )
        await _create(http, PODS, _pod("no-fs", volumes, node="gpu-h100-01"))
        await _waiting(http, "no-fs", "ContainerCreating")
        await _create(http, SECRETS, _secret("here", t=b"v"))
        await _create(http, PODS, _pod("env", [], node="gpu-h100-01", env=env))
        pod = await _phase(http, "env", "Running")
    assert sim.kubelets.env(pod, "main") == {"T": "v"}
    with pytest.raises(ValueError, match="no archive_root"):
        sim.kubelets.mount_source(pod, "main", "/creds")


async def test_a_projected_volume_of_secrets(cluster: SimCluster) -> None:
    volumes = [
        {
            "name": "bundle",
            "projected": {
                "defaultMode": 0o400,
                "sources": [
                    {"secret": {"name": "a", "items": [{"key": "k", "path": "a/k"}]}},
                    {"secret": {"name": "b"}},
                    {"secret": {"name": "c", "optional": True}},
                    {"serviceAccountToken": {"path": "token"}},  # not projected by the sim
                ],
            },
        }
    ]
    mounts = [{"name": "bundle", "mountPath": "/bundle"}]
    async with sim_http(cluster) as http:
        await _create(http, SECRETS, _secret("a", k=b"from-a"))
        await _create(http, SECRETS, _secret("b", j=b"from-b"))
        await _create(http, PODS, _pod("proj", volumes, volumeMounts=mounts))
        pod = await _phase(http, "proj", "Running")
        bundle = cluster.kubelets.mount_source(pod, "main", "/bundle")
        assert bundle.parent.name == "kubernetes.io~projected"
        assert (bundle / "a" / "k").read_bytes() == b"from-a"
        assert os.readlink(bundle / "a") == "..data/a"
        assert stat.S_IMODE((bundle / "j").stat().st_mode) == 0o400
        b = (await http.get(f"{SECRETS}/b")).json()
        b["data"]["j"] = base64.b64encode(b"renewed-b").decode()
        assert (await http.put(f"{SECRETS}/b", json=b)).status_code == 200
        await wait_for(lambda: _bytes(bundle / "j") == b"renewed-b", timeout=10, what="b renewed")
        assert (bundle / "a" / "k").read_bytes() == b"from-a"
