"""The chart's rendered server include on a real nats-server, laid out as the official NATS
chart mounts and includes it with deploy/nats/values.yaml: in modes passwords and nkeys each
component's user connects, a node's agent publishes its own node's subjects and is refused
another node's, the operators' user publishes no event; in mode callout the server loads the
include and listens (the callout's own live test is the Python side's)."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client

from nodeward.bus.server import EmbeddedNats, find_nats_server
from nodeward.nats_auth import OPERATOR_INBOX, agent_inbox, service_inbox
from schemas.tokens import token
from tests.conftest import wait_for
from tests.integration.helm_chart import (
    DEFAULT_SERVICES,
    Errors,
    minimal,
    named,
    nats_server_layout,
    new_nkey,
    render,
)

NODE_A, NODE_B = "gpu-node-a", "dgx.rack7"
IDENTITIES = (*DEFAULT_SERVICES, "admin", "operator", "console")


def _inbox(identity: str) -> str:
    return {"operator": OPERATOR_INBOX, "admin": "_INBOX"}.get(identity, service_inbox(identity))


async def _connect(url: str, errors: Errors | None = None, **auth: Any) -> Client:
    return await nats.connect(
        url,
        allow_reconnect=False,
        connect_timeout=3,
        max_reconnect_attempts=0,
        error_cb=(errors or Errors()).record,
        **auth,
    )


async def _subjects_seen(admin: Client, subject: str) -> list[str]:
    """The subjects of what the admin receives on `subject` from now on (the list fills)."""
    seen: list[str] = []

    async def record(msg: Any) -> None:
        seen.append(msg.subject)

    await admin.subscribe(subject, cb=record)
    await admin.flush()
    return seen


async def _own_and_others(url: str, agent_auth: dict[str, Any], admin: Client) -> None:
    """Node A publishes its own health (delivered) and B's (refused, not delivered)."""
    seen = await _subjects_seen(admin, "gpu.health.>")
    errors = Errors()
    agent = await _connect(url, errors, inbox_prefix=agent_inbox(NODE_A), **agent_auth)
    try:
        own, other = f"gpu.health.{token(NODE_A)}.0", f"gpu.health.{token(NODE_B)}.0"
        await agent.publish(own, b"{}")
        await agent.publish(other, b"{}")
        await agent.flush()
        await wait_for(
            lambda: errors.has("permissions violation", "publish", token(NODE_B)),
            what="the server's refusal of A's publish to B's subject",
        )
        await wait_for(lambda: own in seen, what="A's own event delivered")
        # the server refused B's before it said so; anything it had sent the admin before
        # arrives before the admin's PONG
        await admin.flush()
        assert other not in seen
        assert not errors.has("permissions violation", token(NODE_A))
    finally:
        await agent.close()


async def _operator_publishes_no_event(
    url: str, operator_auth: dict[str, Any], admin: Client
) -> None:
    seen = await _subjects_seen(admin, "gpu.health.*.9")
    errors = Errors()
    operator = await _connect(url, errors, inbox_prefix=OPERATOR_INBOX, **operator_auth)
    try:
        await operator.publish(f"gpu.health.{token(NODE_A)}.9", b"{}")
        await operator.flush()
        await wait_for(
            lambda: errors.has("permissions violation", "publish", "gpu.health"),
            what="the server's refusal of the operator's event",
        )
        await admin.flush()  # anything sent to the admin before arrives before its PONG
        assert seen == []
    finally:
        await operator.close()


def _generated(tmp: Path) -> dict[str, tuple[str, str]]:
    """Per identity, a password and its bcrypt hash, made by helm (generate: true)."""
    docs = render(
        tmp, minimal({"natsAuth": {"mode": "passwords", "passwords": {"generate": True}}})
    )
    conf = named(docs, "Secret", "nw-nats-auth")["stringData"]["auth.conf"]
    users = json.loads(conf[conf.index("[") : conf.rindex("]") + 1])
    hashes = {u["user"]: u["password"] for u in users if "user" in u}
    out = {}
    for identity in IDENTITIES:
        secret = named(docs, "Secret", f"nw-nats-{identity}")["stringData"]
        out[identity] = (secret["password"], hashes[secret["user"]])
    return out


async def test_passwords_mode_on_a_real_server(tmp_path: Path) -> None:
    """Two passwords given in values (as given in auth.conf), the others in an existingSecret
    with their bcrypt hashes (only the hashes in auth.conf)."""
    seed_a, key_a = new_nkey()
    seed_file = tmp_path / "agent-a.nk"
    seed_file.write_text(seed_a + "\n")
    made = _generated(tmp_path / "made")
    values = minimal(
        {
            "natsAuth": {
                "mode": "passwords",
                "passwords": {
                    "cordon": "cordon-pw",
                    "operator": "operator-pw",
                    "existingSecret": "nats-passwords",
                    "hashes": {
                        i: made[i][1] for i in IDENTITIES if i not in {"cordon", "operator"}
                    },
                },
            },
            "agents": {"nodeKeys": {NODE_A: key_a, NODE_B: new_nkey()[1]}},
        }
    )
    docs = render(tmp_path, values)
    conf = nats_server_layout(tmp_path, docs)
    server_side = (conf.parent.parent / "nats-auth" / "auth.conf").read_text()
    assert "cordon-pw" in server_side and made["admin"][0] not in server_side
    passwords = {i: made[i][0] for i in IDENTITIES} | {
        "cordon": "cordon-pw",
        "operator": "operator-pw",
    }

    async with EmbeddedNats(tmp_path / "nats", config_file=conf) as server:
        for identity, password in passwords.items():  # every component's user signs in
            client = await _connect(
                server.url,
                user=f"nodeward-{identity}",
                password=password,
                inbox_prefix=_inbox(identity),
            )
            assert client.is_connected, identity
            await client.close()
        with pytest.raises(nats.errors.Error, match="Authorization Violation"):
            await _connect(server.url, user="nodeward-cordon", password="wrong")
        admin = await _connect(server.url, user="nodeward-admin", password=passwords["admin"])
        try:
            await _own_and_others(server.url, {"nkeys_seed": str(seed_file)}, admin)
            await _operator_publishes_no_event(
                server.url, {"user": "nodeward-operator", "password": "operator-pw"}, admin
            )
        finally:
            await admin.close()


async def test_nkeys_mode_on_a_real_server(tmp_path: Path) -> None:
    seeds: dict[str, Path] = {}
    keys: dict[str, str] = {}
    for identity in (*IDENTITIES, NODE_A):
        seed, key = new_nkey()
        seeds[identity] = tmp_path / f"{identity}.nk"
        seeds[identity].write_text(seed + "\n")
        keys[identity] = key
    values = minimal(
        {
            "natsAuth": {
                "mode": "nkeys",
                "nkeys": {"publicKeys": {i: keys[i] for i in IDENTITIES}},
            },
            "agents": {"nodeKeys": {NODE_A: keys[NODE_A], NODE_B: new_nkey()[1]}},
        }
    )
    conf = nats_server_layout(tmp_path, render(tmp_path, values))

    async with EmbeddedNats(tmp_path / "nats", config_file=conf) as server:
        for identity in IDENTITIES:  # every component's seed signs in
            client = await _connect(
                server.url, nkeys_seed=str(seeds[identity]), inbox_prefix=_inbox(identity)
            )
            assert client.is_connected, identity
            await client.close()
        stranger = tmp_path / "stranger.nk"
        stranger.write_text(new_nkey()[0] + "\n")
        with pytest.raises(nats.errors.Error, match="Authorization Violation"):
            await _connect(server.url, nkeys_seed=str(stranger))
        admin = await _connect(server.url, nkeys_seed=str(seeds["admin"]))
        try:
            await _own_and_others(server.url, {"nkeys_seed": str(seeds[NODE_A])}, admin)
            await _operator_publishes_no_event(
                server.url, {"nkeys_seed": str(seeds["operator"])}, admin
            )
        finally:
            await admin.close()


@pytest.mark.parametrize("xkey", [True, False], ids=["xkey", "no-xkey"])
async def test_the_callout_include_loads_and_the_server_listens(tmp_path: Path, xkey: bool) -> None:
    values = minimal()
    if not xkey:
        del values["natsAuth"]["callout"]["xkey"]
    conf = nats_server_layout(tmp_path, render(tmp_path, values))
    checked = subprocess.run(
        [find_nats_server(), "-c", str(conf), "-t"], capture_output=True, text=True, timeout=30
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "is valid" in checked.stdout + checked.stderr
    async with EmbeddedNats(tmp_path / "nats", config_file=conf) as server:
        assert server.port
        # Nobody but the callout's own user gets in without the callout running: the
        # server holds the connection for the callout's answer, then drops it.
        try:
            client = await asyncio.wait_for(_connect(server.url, token="not-a-token"), 15)
        except (nats.errors.Error, nats.errors.NoServersError, TimeoutError):
            return
        try:
            await wait_for(lambda: not client.is_connected, timeout=15, what="the refusal")
        finally:
            await client.close()


async def test_a_malformed_include_is_what_nats_server_refuses(tmp_path: Path) -> None:
    """The control for the check above: `-t` does refuse a bad key."""
    docs = render(tmp_path, minimal())
    conf = nats_server_layout(tmp_path, docs)
    auth = next((tmp_path / "pod").rglob("auth.conf"))
    auth.write_text(auth.read_text().replace("issuer: A", "issuer: U"))
    checked = subprocess.run(
        [find_nats_server(), "-c", str(conf), "-t"], capture_output=True, text=True, timeout=30
    )
    assert checked.returncode != 0
    assert "valid public account nkey" in checked.stdout + checked.stderr
