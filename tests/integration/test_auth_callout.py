"""NATS auth callout against a real nats-server (2.15, `auth_callout` in config mode) and the
sim cluster's TokenRequest and TokenReview: every component signs in with its ServiceAccount
token, a node's agent gets exactly its own node's subjects, and a new node needs no change.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import nats
import nkeys
import pytest
from prometheus_client.parser import text_string_to_metric_families

from launch.access import AGENT_GRANTS, GRANTS, READERS
from nodeward.bus import Bus, BusError
from nodeward.bus.connection import connect_nats
from nodeward.bus.server import EmbeddedNats
from nodeward.callout import jwt, xkey
from nodeward.callout.service import build
from nodeward.config import AuthCalloutSettings, BusSettings, ClusterSettings, Settings
from nodeward.daemon import Daemon
from nodeward.nats_auth import (
    agent_inbox,
    callout_authorization,
    permissions_document,
    write_seed,
)
from schemas.tokens import token
from sim.cluster import SimCluster
from tests.conftest import wait_for
from tests.helpers.kube import manifest
from tests.integration.simkube import sim_http

NAMESPACE = "nodeward"  # the sim's namespace of nodeward's ServiceAccounts (nodeward-<name>)


@dataclass
class Env:
    sim: SimCluster
    nats: EmbeddedNats
    callout: Daemon
    tmp: Path

    async def pod(self, name: str, node: str, account: str = "nodeward-agent") -> dict[str, Any]:
        body = manifest(
            "v1",
            "Pod",
            name,
            spec={
                "serviceAccountName": account,
                "nodeName": node,
                "containers": [{"name": "agent", "image": "nodeward:test"}],
            },
        )
        async with sim_http(self.sim) as http:
            made = await http.post(f"/api/v1/namespaces/{NAMESPACE}/pods", json=body)
            assert made.status_code == 201, made.text
            return dict(made.json())

    async def token(
        self,
        account: str,
        pod: dict[str, Any] | None = None,
        *,
        namespace: str = NAMESPACE,
        audience: str = "nats",
    ) -> Path:
        """A projected token as the kubelet writes it: for `audience`, bound to `pod`."""
        spec: dict[str, Any] = {"audiences": [audience], "expirationSeconds": 3600}
        if pod is not None:
            meta = pod["metadata"]
            spec["boundObjectRef"] = {
                "kind": "Pod",
                "apiVersion": "v1",
                "name": meta["name"],
                "uid": meta["uid"],
            }
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
        async with sim_http(self.sim) as http:
            made = await http.post(
                f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token", json=body
            )
        assert made.status_code == 201, made.text
        path = self.tmp / f"token-{account}-{len(list(self.tmp.glob('token-*')))}"
        path.write_text(made.json()["status"]["token"])
        return path

    def bus(self, token_file: Path, **more: Any) -> BusSettings:
        return BusSettings(
            url=self.nats.url,
            token_file=token_file,
            connect_timeout="3s",  # type: ignore[arg-type]
            publish_timeout="3s",  # type: ignore[arg-type]
            **{"publish_retries": 0, "provision": False, **more},
        )


def _config_mode(tmp: Path, *, sealed: bool = False) -> tuple[str, BusSettings, str]:
    """A server with `authorization { auth_callout }` (what `callout_authorization` renders
    and the chart installs): its config, the callout's NATS login, the account users go to.
    `sealed`: the server seals requests to the callout's curve key (`xkey.nk`)."""
    issuer = write_seed(tmp / "issuer.nk", nkeys.PREFIX_BYTE_ACCOUNT)
    user = write_seed(tmp / "callout-user.nk", nkeys.PREFIX_BYTE_USER)
    curve = None
    if sealed:
        seed = xkey.new_seed()
        (tmp / "xkey.nk").write_text(seed)
        curve = xkey.public_key(xkey.decode_seed(seed))
    # a loaded CI machine: give the callout the time a TokenReview may take
    config = callout_authorization(issuer, user, timeout=10, xkey=curve)
    return config, BusSettings(nkey_seed_file=tmp / "callout-user.nk"), "NODEWARD"


def _claims(kind: str, name: str, subject: str, **nats: Any) -> dict[str, Any]:
    return {"sub": subject, "name": name, "nats": {"type": kind, **nats}}


UNLIMITED = {"subs": -1, "data": -1, "payload": -1}


def _operator_mode(tmp: Path) -> tuple[str, BusSettings, str]:
    """A server in operator (JWT) mode, as `nsc` sets one up: an operator, a system
    account, and nodeward's account whose JWT names the callout's user as its external
    authorization (`nsc edit authcallout`); the callout signs in with its .creds and
    signs users with the account's signing key (`auth_callout.account` is the account's
    public key, so the users it makes name it as `issuer_account`)."""
    keys = {
        kind: nkeys.from_seed(bytearray(nkeys.encode_seed(os.urandom(32), prefix)))
        for kind, prefix in (
            ("operator", nkeys.PREFIX_BYTE_OPERATOR),
            ("system", nkeys.PREFIX_BYTE_ACCOUNT),
            ("user", nkeys.PREFIX_BYTE_USER),
            ("sentinel", nkeys.PREFIX_BYTE_USER),
        )
    }
    account = nkeys.from_seed(
        bytearray(nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_ACCOUNT))
    )
    account_public = account.public_key.decode()
    # the account's signing key (`nsc edit account --sk generate`) signs the callout's
    # answers and the users it makes
    signing = write_seed(tmp / "issuer.nk", nkeys.PREFIX_BYTE_ACCOUNT)
    pub = {k: v.public_key.decode() for k, v in keys.items()}
    operator = jwt.encode(
        _claims("operator", "test", pub["operator"], system_account=pub["system"]),
        keys["operator"],
    )
    limits = {"limits": {**UNLIMITED, "conn": -1, "leaf": -1, "imports": -1, "exports": -1}}
    system = jwt.encode(_claims("account", "SYS", pub["system"], **limits), keys["operator"])
    nodeward = jwt.encode(
        _claims(
            "account",
            "NODEWARD",
            account_public,
            limits={
                **limits["limits"],
                "mem_storage": -1,
                "disk_storage": -1,
                "streams": -1,
                "consumer": -1,
            },
            authorization={"auth_users": [pub["user"]]},
            signing_keys=[signing],
        ),
        keys["operator"],
    )
    callout_user = jwt.encode(
        _claims("user", "auth-callout", pub["user"], pub={}, sub={}, **UNLIMITED), account
    )
    # what a token-only client is taken for (nats-server 2.11+), so the account's external
    # authorization (the callout) decides: a bearer user that may do nothing itself
    sentinel = jwt.encode(
        _claims(
            "user",
            "sentinel",
            pub["sentinel"],
            bearer_token=True,
            pub={"deny": [">"]},
            sub={"deny": [">"]},
            **UNLIMITED,
        ),
        account,
    )
    (tmp / "callout.creds").write_text(
        "-----BEGIN NATS USER JWT-----\n"
        f"{callout_user}\n"
        "------END NATS USER JWT------\n\n"
        "-----BEGIN USER NKEY SEED-----\n"
        f"{keys['user'].seed.decode()}\n"
        "------END USER NKEY SEED------\n"
    )
    config = (
        f"operator: {operator}\n"
        f"system_account: {pub['system']}\n"
        "resolver: MEMORY\n"
        f"resolver_preload: {{ {pub['system']}: {system}, {account_public}: {nodeward} }}\n"
        f"default_sentinel: {sentinel}\n"
        "authorization { timeout: 10 }\n"
    )
    return config, BusSettings(creds_file=tmp / "callout.creds"), account_public


MODES = {
    "config": _config_mode,
    "sealed": functools.partial(_config_mode, sealed=True),
    "operator": _operator_mode,
}


@pytest.fixture(params=sorted(MODES))
async def env(
    sim: SimCluster, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[Env]:
    """The server (auth callout in server config, with sealed requests or not, or in
    operator mode on the account's JWT), the callout, and the streams (made by the
    provision Job's token)."""
    config, login, account = MODES[request.param](tmp_path)
    conf = tmp_path / "nats.conf"
    conf.write_text(config)
    permissions = tmp_path / "nats-permissions.json"
    permissions.write_text(json.dumps(permissions_document(GRANTS, AGENT_GRANTS, READERS)))
    nats = await EmbeddedNats(tmp_path / "nats", config_file=conf).start()
    settings = Settings(
        bus=login.model_copy(update={"url": nats.url}),
        cluster=ClusterSettings(
            kubeconfig=sim.write_kubeconfig(tmp_path / "kubeconfig", identity="auth-callout")
        ),
        auth_callout=AuthCalloutSettings(
            issuer_seed_file=tmp_path / "issuer.nk",
            xkey_seed_file=(tmp_path / "xkey.nk") if request.param == "sealed" else None,
            permissions_file=permissions,
            account=account,
            namespace=NAMESPACE,
            release="nodeward",
        ),
    )
    callout = await build(settings)
    await callout.start()

    async def ready() -> bool:
        return (await callout.readiness()).ready

    await wait_for(ready, timeout=15, what="the callout to serve")
    env = Env(sim, nats, callout, tmp_path)
    # the provision Job's ServiceAccount (the chart makes it): the admin user, which
    # creates every stream
    async with sim_http(sim) as http:
        made = await http.post(
            f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts",
            json=manifest("v1", "ServiceAccount", "nodeward-provision"),
        )
        assert made.status_code == 201, made.text
    admin = await Bus.connect(
        env.bus(await env.token("nodeward-provision"), provision=True), source="test/provision"
    )
    await admin.close()
    yield env
    await callout.stop()
    await nats.stop()


class Client:
    """A NATS client signed in with a token file, and the `-ERR` lines the server sent it
    (permission violations)."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.nc: Any = None

    async def connect(self, url: str, token_file: Path, inbox: str | None = None) -> Client:
        async def on_error(exc: Exception) -> None:
            self.errors.append(str(exc))

        self.nc = await nats.connect(
            url,
            token=token_file.read_text,
            inbox_prefix=inbox or "_INBOX",
            error_cb=on_error,
            allow_reconnect=False,
            connect_timeout=5,
        )
        return self

    async def refused(self, subject: str) -> str:
        """Publish to `subject` and return the server's refusal."""
        await self.nc.publish(subject, b"{}")
        await self.nc.flush()
        await wait_for(lambda: self.errors, timeout=10, what=f"the server to refuse {subject}")
        return self.errors[0]


async def _refused(settings: BusSettings) -> str:
    """What a daemon connecting with `settings` is told (it must be refused)."""
    with pytest.raises(BusError) as caught:
        nc, _ = await connect_nats(settings, name="test", wait=False)
        await nc.close()
    return str(caught.value)


async def test_a_nodes_agent_signs_in_with_its_pod_token_and_publishes_only_its_own_node(
    env: Env,
) -> None:
    node, other = "gpu-h100-01", "gpu-h100-02"
    pod = await env.pod("nodeward-agent-a", node)
    token_file = await env.token("nodeward-agent", pod)
    # as a daemon connects: bus.token_file, its node's inbox
    nc, js = await connect_nats(
        env.bus(token_file, inbox_prefix=agent_inbox(node)), name="agent", wait=False
    )
    try:
        ack = await js.publish(f"gpu.health.{token(node)}.0", b"{}")
        assert ack.stream == "GPU"
    finally:
        await nc.close()
    client = await Client().connect(env.nats.url, token_file, agent_inbox(node))
    try:
        said = await client.refused(f"gpu.health.{token(other)}.0")
        assert f'publish to "gpu.health.{token(other)}.0"' in said
        assert "permissions violation" in said.lower()
    finally:
        await client.nc.close()


async def test_a_terminated_pods_token_is_refused(env: Env) -> None:
    pod = await env.pod("nodeward-agent-gone", "gpu-h100-03")
    agent = env.bus(await env.token("nodeward-agent", pod))
    nc, _ = await connect_nats(agent, name="agent", wait=False)  # accepted while it runs
    await nc.close()
    async with sim_http(env.sim) as http:
        gone = await http.delete(
            f"/api/v1/namespaces/{NAMESPACE}/pods/nodeward-agent-gone",
            params={"gracePeriodSeconds": 0},
        )
        assert gone.status_code == 200, gone.text

        async def deleted() -> bool:
            got = await http.get(f"/api/v1/namespaces/{NAMESPACE}/pods/nodeward-agent-gone")
            return got.status_code == 404

        await wait_for(deleted, timeout=10, what="the pod gone")
    assert "Authorization Violation" in await _refused(agent)


async def test_a_new_node_needs_no_configuration(env: Env) -> None:
    """Neither the server nor the callout was told of this node before its agent came."""
    node = "gpu-mi300x-02"
    pod = await env.pod("nodeward-agent-new", node)
    settings = env.bus(await env.token("nodeward-agent", pod), inbox_prefix=agent_inbox(node))
    nc, js = await connect_nats(settings, name="agent", wait=False)
    try:
        ack = await js.publish(f"gpu.health.{token(node)}.0", b"{}")
        assert ack.stream == "GPU"
    finally:
        await nc.close()


@pytest.mark.parametrize(
    ("account", "namespace", "audience"),
    [
        ("nodeward-agent", NAMESPACE, "nats"),  # an agent's token must be bound to its pod
        ("default", NAMESPACE, "nats"),  # no grants for that ServiceAccount
        ("default", "default", "nats"),  # not nodeward's namespace
        ("nodeward-cordon", NAMESPACE, "https://kubernetes.default.svc"),  # not for NATS
    ],
)
async def test_tokens_without_a_nodeward_identity_for_nats_are_refused(
    env: Env, account: str, namespace: str, audience: str
) -> None:
    token_file = await env.token(account, namespace=namespace, audience=audience)
    assert "Authorization Violation" in await _refused(env.bus(token_file))
    # the server logs the callout's one-line reason (after it told the client), and never
    # the token

    def logged() -> str | None:
        text = env.nats.log_file.read_text()
        return text if "Auth callout service returned an error: " in text else None

    log = await wait_for(logged, what="the server's log of the refusal")
    assert token_file.read_text().strip() not in log


async def test_no_token_is_refused(env: Env) -> None:
    no_token = BusSettings(url=env.nats.url, connect_timeout="3s")  # type: ignore[arg-type]
    assert "Authorization Violation" in await _refused(no_token)
    # Counted as refused; nothing failed, and no agent signed in: those series are there
    # at 0 (the failure alert sees the first failure).
    async with httpx.AsyncClient() as http:
        scraped = (await http.get(f"{env.callout.url}/metrics")).text
    answers = {
        (s.labels["outcome"], s.labels["kind"]): s.value
        for family in text_string_to_metric_families(scraped)
        for s in family.samples
        if s.name == "nodeward_auth_callout_answers_total"
    }
    assert set(answers) == {
        ("allowed", "agent"),
        ("allowed", "component"),
        ("refused", "unknown"),
        ("failed", "unknown"),
    }
    assert answers["failed", "unknown"] == answers["allowed", "agent"] == 0.0
    assert answers["refused", "unknown"] >= 1 and answers["allowed", "component"] >= 1


async def test_a_service_gets_its_own_grants_and_no_more(env: Env) -> None:
    token_file = await env.token("nodeward-cordon")
    client = await Client().connect(env.nats.url, token_file, "_INBOX_cordon")
    try:
        said = await client.refused("gpu.health.gpu-h100-01.0")  # an agent's subject
        assert "permissions violation" in said.lower()
    finally:
        await client.nc.close()


async def test_a_daemon_reconnects_with_the_kubelets_rotated_token_before_its_grant_ends(
    env: Env,
) -> None:
    """The grant ends with the token it was given (the server then closes the connection,
    for good with nats-py), so the daemon reconnects with the newer token the kubelet wrote
    into its file, and the old one is not what it presents."""
    node = "gpu-a100-01"
    pod = await env.pod("nodeward-agent-rotated", node)
    token_file = await env.token("nodeward-agent", pod)  # 3600 s
    settings = env.bus(
        token_file,
        inbox_prefix=agent_inbox(node),
        token_refresh_before="3599s",  # near its end at once
    )
    nc, js = await connect_nats(settings, name="agent", wait=True)
    try:
        assert nc.stats["reconnects"] == 0  # nothing to renew yet: the file holds the same
        env.sim.tokens.advance(3700)  # the first token has expired, for the API server
        token_file.write_text((await env.token("nodeward-agent", pod)).read_text())
        await wait_for(
            lambda: nc.stats["reconnects"] >= 1 and nc.is_connected,
            timeout=20,
            what="a reconnect with the rotated token",
        )
        ack = await js.publish(f"gpu.health.{token(node)}.0", b"{}")
        assert ack.stream == "GPU"
    finally:
        await nc.close()
