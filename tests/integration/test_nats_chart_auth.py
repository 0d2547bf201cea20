"""The chart's NATS users, on a real nats-server: each node agent only its own subjects.

The `authorization {}` file is taken from the rendered `nodeward-nats-auth` Secret and
included the way the NATS subchart's nats.conf includes it (`config.merge.$include`,
resolved from /etc/nats-config against the Secret's mount path).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client
from nats.js.errors import BucketNotFoundError

from agents.energy.caps import TOPIC as POWER_LIMIT
from agents.energy.caps import CapWatch, cap_notice
from agents.energy.settings import PowerCap
from nodeward.bus import Bus, BusError, ConsumerSpec, Delivery, PublishError
from nodeward.bus.server import EmbeddedNats
from nodeward.config import BusSettings, Settings
from nodeward.nats_auth import OPERATOR_INBOX, OPERATOR_USER, agent_inbox, service_inbox
from schemas import Event, decode, make_event
from schemas.cloudevents import encode
from schemas.control import ControlReply, ControlRequest
from schemas.gpu import GpuHealth
from schemas.notify import Notification, Severity
from schemas.remediation import Remediation
from services.notifier import service as notifier
from tests.conftest import wait_for
from tests.integration.helm_chart import (
    Errors,
    named,
    nats_server_layout,
    new_nkey,
    render,
    representative_values,
)


def _decode_secret(doc: dict[str, Any], key: str) -> str:
    return str(doc["stringData"][key])


def _auth_layout(tmp: Path, docs: list[dict[str, Any]]) -> Path:
    """nats.conf and the auth file laid out as the NATS pod sees them; returns nats.conf."""
    return nats_server_layout(tmp, docs)


@asynccontextmanager
async def _two_node_nats(
    tmp: Path, node_a: str, node_b: str
) -> AsyncIterator[tuple[EmbeddedNats, Bus, Path, list[dict[str, Any]]]]:
    """Node A's seed made by `agent keygen`, node B's key made here, the chart rendered for
    both and run by a nats-server whose streams the admin user provisioned: (the server,
    the admin's bus, A's seed file, the chart's documents). The admin's bus closes last."""
    seed_file = tmp / "agent-a.nk"
    keygen = _nodeward("agent", "keygen", "--out", str(seed_file))
    assert keygen.returncode == 0, keygen.stderr
    _, key_b = new_nkey()
    docs = render(tmp, representative_values({node_a: keygen.stdout.strip(), node_b: key_b}))
    conf = _auth_layout(tmp, docs)
    async with EmbeddedNats(tmp / "nats", config_file=conf) as server:
        # The admin user creates the streams, as the chart's provision Job does.
        admin = await _provisioned(server, _admin_password(docs))
        try:
            yield server, admin, seed_file, docs
        finally:
            await admin.close(grace=1)


def _admin_password(docs: list[dict[str, Any]]) -> str:
    return _decode_secret(named(docs, "Secret", "nw-nats-admin"), "password")


async def _agent_bus(url: str, seed_file: Path, node: str, agent: str, *, fail_fast: bool) -> Bus:
    """Node `node`'s `agent` agent on the bus with its own seed; `fail_fast`: a refused
    publish fails at once (a short publish timeout and no retry)."""
    quick: dict[str, Any] = {"publish_timeout": "500ms", "publish_retries": 0} if fail_fast else {}
    settings = BusSettings(
        url=url,
        nkey_seed_file=seed_file,
        inbox_prefix=agent_inbox(node),
        provision=False,
        **quick,
    )
    return await Bus.connect(settings, source=f"agent/{agent}/{node}")


def _service_settings(
    url: str, secret: dict[str, Any], service: str, *, fail_fast: bool = False
) -> BusSettings:
    """A service's bus settings as its chart user (the user and password of `secret`)."""
    quick: dict[str, Any] = {"publish_timeout": "500ms", "publish_retries": 0} if fail_fast else {}
    return BusSettings(
        url=url,
        user=_decode_secret(secret, "user"),
        password=_decode_secret(secret, "password"),  # type: ignore[arg-type]
        inbox_prefix=service_inbox(service),
        provision=False,
        **quick,
    )


async def _stored(admin: Bus, stream: str, subject: str, n: int) -> list[Event[Any]] | None:
    """The first `n` events on `subject` of `stream`, once it holds that many; else None."""
    info = await admin.js.stream_info(stream, subjects_filter=subject)
    if sum((info.state.subjects or {}).values()) < n:
        return None
    psub = await admin.js.pull_subscribe(subject, stream=stream)
    try:
        msgs = await psub.fetch(n, timeout=2)
        return [decode(m.subject, m.headers, m.data) for m in msgs]
    finally:
        await psub.unsubscribe()


async def _raw(url: str, seed_file: Path, inbox: str, errors: Errors) -> Client:
    return await nats.connect(
        url,
        nkeys_seed=str(seed_file),
        inbox_prefix=inbox,
        error_cb=errors.record,
        allow_reconnect=False,
        connect_timeout=2,
    )


def _health(node: str) -> Event[Any]:
    data = GpuHealth.example().model_copy(update={"node": node})
    return make_event(data, source=f"agent/gpu/{node}")


def _nodeward(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "launch", *args],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, **(env or {})},
    )


def test_agent_keygen_writes_a_private_seed_and_prints_its_key(tmp_path: Path) -> None:
    seed = tmp_path / "etc" / "agent.nk"
    done = _nodeward("agent", "keygen", "--out", str(seed))
    assert done.returncode == 0, done.stderr
    public = done.stdout.strip()
    assert public.startswith("U") and len(public) == 56
    assert seed.stat().st_mode & 0o777 == 0o600
    assert seed.read_text().startswith("SU")
    again = _nodeward("agent", "keygen", "--out", str(seed))
    assert again.returncode == 1
    assert again.stderr.strip().splitlines() == [
        f"nodeward: error: {seed} exists; --force replaces it (then deploy the new key)"
    ]


async def test_chart_users_enforce_per_node_and_per_service_rights(tmp_path: Path) -> None:
    node_a, node_b = "gpu-node-a", "gpu-node-b.example"
    async with _two_node_nats(tmp_path, node_a, node_b) as (server, admin, seed_file, docs):
        cordon = named(docs, "Secret", "nw-nats-cordon")
        # Node A's agent signs in with its own seed through nodeward's bus settings.
        agent = await _agent_bus(server.url, seed_file, node_a, "gpu", fail_fast=True)
        errors = Errors()
        raw = await _raw(server.url, seed_file, agent_inbox(node_a), errors)
        service = await Bus.connect(
            _service_settings(server.url, cordon, "cordon", fail_fast=True),
            source="service/cordon",
        )
        try:
            own = _health(node_a)
            ack = await agent.publish(own)
            assert ack.stream == "GPU"

            # A forges B's health: refused by the server, nothing stored.
            with pytest.raises(PublishError):
                await agent.publish(_health(node_b))
            await raw.publish("gpu.health.gpu-node-b_example.0", b"{}")
            await wait_for(
                lambda: errors.has("permissions violation", "publish", "gpu-node-b_example"),
                what="the server's refusal of A's publish to B's subject",
            )
            info = await admin.js.stream_info("GPU", subjects_filter="gpu.health.>")
            assert set(info.state.subjects or {}) == {own.nats_subject}

            # A reads B's inbox: refused.
            await raw.subscribe(f"{agent_inbox(node_b)}.>")
            await raw.flush()
            await wait_for(
                lambda: errors.has("permissions violation", "subscription", agent_inbox(node_b)),
                what="the server's refusal of A's subscription to B's inbox",
            )
            # Its own inbox is fine.
            before = len(errors.seen)
            await raw.subscribe(f"{agent_inbox(node_a)}.mine")
            await raw.flush()
            assert len(errors.seen) == before

            # The cordon user binds its durable consumer and KV bucket, and gets A's event.
            kv = await service.kv("cordon")
            await kv.put("node.gpu-node-a", b"{}")
            assert (await kv.get("node.gpu-node-a")).value == b"{}"
            assert await kv.keys() == ["node.gpu-node-a"]  # the reconcile loop lists keys
            got: list[str] = []

            async def handle(event: Event[Any], delivery: Delivery) -> None:
                got.append(event.id)

            spec = ConsumerSpec(name="cordon", stream="GPU", subjects=("gpu.health.>",))
            await service.consume(spec, handle)
            await wait_for(lambda: own.id in got, what="cordon receiving A's event")
            audit = make_event(Remediation.example(), source="service/cordon")
            assert (await service.publish(audit)).stream == "AUDIT"

            # ... and nothing outside its role: no GPU health, no other service's bucket.
            with pytest.raises(PublishError):
                await service.publish(_health(node_a))
            with pytest.raises(nats.errors.TimeoutError):  # $JS.API.STREAM.INFO.KV_culler refused
                await asyncio.wait_for(service.kv("culler"), 5)
            with pytest.raises(BucketNotFoundError):
                await admin.js.key_value("culler")
        finally:
            await raw.close()
            await service.close(grace=1)
            await agent.close(grace=1)


async def test_a_missing_seed_file_is_one_clear_error(tmp_path: Path) -> None:
    """A node whose seed was never provisioned says so, instead of retrying forever."""
    missing = tmp_path / "agent.nk"
    settings = BusSettings(url="nats://127.0.0.1:1", nkey_seed_file=missing, provision=False)
    with pytest.raises(BusError) as caught:
        await Bus.connect(settings, source="agent/gpu/x")
    assert (
        str(caught.value) == f"cannot read the nkey seed file {missing}: No such file or directory"
    )


async def test_a_node_forging_another_node_on_its_own_subject_is_refused(tmp_path: Path) -> None:
    """Issue 16's reproduction under the chart's authorization: node A's user may publish
    on `gpu.health.<A>.0`, and does, a failure of node B. The cordon user's consumer never
    hands it to the handler; with its own rights it dead-letters it (`identity_mismatch`),
    audits it and tells on-call once for the burst."""
    node_a, node_b = "gpu-h100-01", "gpu-h100-02"
    async with _two_node_nats(tmp_path, node_a, node_b) as (server, admin, seed_file, docs):
        cordon = named(docs, "Secret", "nw-nats-cordon")
        agent = await _agent_bus(server.url, seed_file, node_a, "gpu", fail_fast=False)
        service = await Bus.connect(
            _service_settings(server.url, cordon, "cordon"), source="service/cordon"
        )
        try:
            burst = 3
            for gpu in range(burst):  # accepted by the server: A's own subject
                wire = encode(_health(node_b))
                ack = await agent.js.publish(
                    f"gpu.health.{node_a}.{gpu}", wire.body, headers=wire.headers
                )
                assert ack.stream == "GPU"
            got: list[str] = []

            async def handle(event: Event[Any], delivery: Delivery) -> None:
                got.append(event.data.node)

            spec = ConsumerSpec(
                name="cordon",
                stream="GPU",
                subjects=("gpu.health.>",),
                identity=(ConsumerSpec.bind(GpuHealth, "node"),),
            )
            await service.consume(spec, handle)
            dead = await wait_for(
                lambda: _stored(admin, "DLQ", "dlq.GPU.cordon", burst), what="DLQ"
            )
            assert {e.data.reason for e in dead} == {"identity_mismatch"}
            assert all(node_a in e.data.error and node_b in e.data.error for e in dead)
            audits = await wait_for(
                lambda: _stored(admin, "AUDIT", f"remediation.identity_mismatch.{node_b}", burst),
                what="security audits",
            )
            assert {e.data.details["publisher"] for e in audits} == {node_a}
            notes = await wait_for(
                lambda: _stored(admin, "NOTIFY", "notify.critical.security", 1),
                what="on-call notice",
            )

            async def settled() -> bool:
                info = await admin.js.consumer_info("GPU", "cordon")
                return info.num_ack_pending == 0 and info.num_pending == 0

            await wait_for(settled, what="nothing left unacknowledged")
            notify = await admin.js.stream_info("NOTIFY", subjects_filter="notify.>")
            assert notify.state.messages == 1  # one notice for the burst
            assert notes[0].data.targets[0].name == node_a
            assert got == []
        finally:
            await service.close(grace=1)
            await agent.close(grace=1)


def _notice(**fields: Any) -> Notification:
    base: dict[str, Any] = {
        "severity": Severity.WARNING,
        "topic": POWER_LIMIT,
        "title": "Your session will be stopped: confirm your account",
        "body": f"Sign in at {PHISHING} to keep your GPU.",
        "audience": "user:ml-nlp/bob-explore-0",
        "links": {"confirm": PHISHING},
    }
    return Notification(**(base | fields))


PHISHING = "https://nodeward-login.example.net/confirm"


async def test_a_node_cannot_speak_to_users_nor_on_another_topic(tmp_path: Path) -> None:
    """Issue 16, finding 2, under the chart's authorization: node A's user may publish
    `notify.*.power-limit`. Its forged notice to a user (topic power-limit) and its forged
    security-topic notice to a user are not delivered: both are dead-lettered
    (`identity_mismatch`) and audited as security events. Its genuine power-cap notice to
    on-call still is delivered. The notifier runs with the chart's notifier user."""
    node_a, node_b = "gpu-h100-01", "gpu-h100-02"
    directory = tmp_path / "owners.yaml"
    directory.write_text("ml-nlp: bob@example.org\n")  # were it delivered, Bob would get it
    outbox = tmp_path / "outbox"

    async with _two_node_nats(tmp_path, node_a, node_b) as (server, admin, seed_file, docs):
        notifier_secret = named(docs, "Secret", "nw-nats-notifier")
        agent = await _agent_bus(server.url, seed_file, node_a, "energy", fail_fast=True)
        settings = Settings(
            bus={
                "url": server.url,
                "user": _decode_secret(notifier_secret, "user"),
                "password": _decode_secret(notifier_secret, "password"),
                "inbox_prefix": service_inbox("notifier"),
                "provision": False,
                "publish_timeout": "2s",
            },
            daemon={"shutdown_timeout": "4s"},
            services={
                "notifier": {
                    "owner_lookup": False,
                    "owner_directory": str(directory),
                    "grouping": {"group_wait": "0.2s", "group_interval": "0s"},
                }
            },
        )
        daemon = await notifier.build(settings, outbox_dir=outbox)
        await daemon.start()
        try:

            async def ready() -> bool:
                return (await daemon.readiness()).ready

            await wait_for(ready, timeout=15, what="the notifier ready")
            subject = f"notify.warning.{POWER_LIMIT}"
            forged_user = make_event(_notice(), source=f"agent/energy/{node_a}")
            forged_security = make_event(
                _notice(topic="security", severity=Severity.WARNING),
                source="service/falco",  # the publisher's word, worth nothing
            )
            for event in (forged_user, forged_security):  # accepted: a subject A may use
                wire = encode(event)
                ack = await agent.js.publish(subject, wire.body, headers=wire.headers)
                assert ack.stream == "NOTIFY"
            # ... while a security subject itself is refused by the server.
            with pytest.raises(PublishError):
                await agent.publish(make_event(_notice(topic="security"), source="x"))
            watch = CapWatch("node", node_a, PowerCap(watts=6500))
            assert watch.check(7100.0) == "crossed"
            genuine = make_event(
                cap_notice(watch, "crossed", node_a, 7100.0), source=f"agent/energy/{node_a}"
            )
            assert genuine.nats_subject == subject
            await agent.publish(genuine)
            dead = await wait_for(
                lambda: _stored(admin, "DLQ", "dlq.NOTIFY.notifier", 2), timeout=15, what="DLQ"
            )
            by_id = {e.data.original_headers.get("ce-id"): e.data for e in dead}
            assert set(by_id) == {forged_user.id, forged_security.id}
            assert {d.reason for d in by_id.values()} == {"identity_mismatch"}
            assert "may address only on-call" in by_id[forged_user.id].error
            assert "'security'" in by_id[forged_security.id].error
            assert "'power-limit'" in by_id[forged_security.id].error
            audits = await wait_for(
                lambda: _stored(admin, "AUDIT", "remediation.identity_mismatch.>", 2),
                timeout=15,
                what="security audits",
            )
            assert {a.data.trigger_event_id for a in audits} == {
                forged_user.id,
                forged_security.id,
            }
            assert all(a.data.details["security"] is True for a in audits)
            assert all(a.data.outcome == "refused" for a in audits)

            def files() -> list[str]:
                return [p.read_text() for p in sorted(outbox.glob("*.txt"))]

            await wait_for(
                lambda: any(genuine.data.title in f for f in files()),
                timeout=15,
                what="the genuine power-limit notice in the outbox",
            )

            # On-call hears of both refusals (security notices, the notifier's own).
            await wait_for(
                lambda: (
                    any("published notify.v1 about audience user:ml-nlp/" in f for f in files())
                    and any("published notify.v1 about topic security" in f for f in files())
                ),
                timeout=15,
                what="on-call's security notices",
            )

            async def settled() -> bool:
                for consumer in ("notifier", "notifier-critical"):
                    info = await admin.js.consumer_info("NOTIFY", consumer)
                    if info.num_ack_pending or info.num_pending:
                        return False
                return True

            await wait_for(settled, timeout=15, what="every notice settled")
            sent = files()
            [delivered] = [f for f in sent if genuine.data.title in f]
            assert "To: on-call" in delivered
            assert not [f for f in sent if "bob@example.org" in f or "Route: users" in f]
            assert not [f for f in sent if PHISHING in f or forged_user.data.title in f]
        finally:
            await daemon.stop()
            await agent.close(grace=1)


async def _provisioned(server: EmbeddedNats, admin_pw: str) -> Bus:
    """Every stream created by the admin user (as the chart's provision Job does), and a bus
    connected as that user."""
    admin_env = {"NODEWARD_BUS__USER": "nodeward-admin", "NODEWARD_BUS__PASSWORD": admin_pw}
    provision = await asyncio.to_thread(
        _nodeward, "streams", "--provision", "--json", "--nats", server.url, env=admin_env
    )
    assert provision.returncode == 0, provision.stderr
    rows = {row["stream"]: row for row in json.loads(provision.stdout)}
    assert not rows["GPU"].get("missing") and not rows["AUDIT"].get("missing")
    admin_url = server.url.replace("nats://", f"nats://nodeward-admin:{admin_pw}@")
    return await Bus.connect(BusSettings(url=admin_url, provision=False), source="test/admin")


async def test_the_operator_user_reads_everything_sends_controls_and_changes_nothing(
    tmp_path: Path,
) -> None:
    """The chart's `nodeward-operator`: `streams`, `replay`, `tail`, `status`, `quarantine
    list` and `breaker status` work with it, and so does a control request the cordon user
    answers; publishing an event, writing or deleting a KV key, deleting a stream, taking a
    service's durable consumer and reading the control requests are refused by the server."""
    _, key_a = new_nkey()
    values = representative_values({"gpu-node-a": key_a})
    values["natsAuth"]["passwords"]["operator"] = "operator-test-pw"
    docs = render(tmp_path, values)
    conf = _auth_layout(tmp_path, docs)
    admin_pw = _admin_password(docs)
    secret = named(docs, "Secret", "nw-nats-operator")
    assert _decode_secret(secret, "user") == OPERATOR_USER
    cordon = named(docs, "Secret", "nw-nats-cordon")

    async with EmbeddedNats(tmp_path / "nats", config_file=conf) as server:
        admin = await _provisioned(server, admin_pw)
        health = _health("gpu-node-a")
        await admin.publish(health)
        state = await admin.kv("cordon")
        await state.put("node.gpu-node-a", b'{"gpus": {}}')
        await admin.kv("breaker")
        durable = ConsumerSpec(name="cordon", stream="GPU", subjects=("gpu.health.>",))

        async def ignore(event: Event[Any], delivery: Delivery) -> None:
            return None

        await admin.consume(durable, ignore)  # the cordon service's durable consumer exists
        env = {
            "NODEWARD_BUS__USER": OPERATOR_USER,
            "NODEWARD_BUS__PASSWORD": "operator-test-pw",
            "NODEWARD_BUS__INBOX_PREFIX": OPERATOR_INBOX,
        }

        async def run(*args: str) -> subprocess.CompletedProcess[str]:
            return await asyncio.to_thread(_nodeward, *args, "--nats", server.url, env=env)

        # What operators read.
        streams = await run("streams", "--json")
        assert streams.returncode == 0, streams.stderr
        assert {row["stream"] for row in json.loads(streams.stdout)} >= {"GPU", "AUDIT"}
        replayed = await run("replay", "--since", "1h", "--subject", "gpu.health.>")
        assert replayed.returncode == 0, replayed.stderr
        assert health.id in replayed.stdout
        tailed = await run("tail", "gpu.health.>", "--since", "1h", "--count", "1", "--json")
        assert tailed.returncode == 0, tailed.stderr
        assert health.id in tailed.stdout
        status = await run("status", "--json")
        assert status.returncode == 0, status.stderr
        listed = await run("quarantine", "list")
        assert listed.returncode == 0, listed.stderr
        breaker = await run("breaker", "status")
        assert breaker.returncode == 0 and "closed" in breaker.stdout, breaker.stderr

        # A control request, answered by a service connected as the chart's cordon user.
        service = await Bus.connect(
            _service_settings(server.url, cordon, "cordon"), source="service/cordon"
        )
        asked: list[ControlRequest] = []

        async def release(request: ControlRequest) -> ControlReply:
            asked.append(request)
            return ControlReply.ok(f"released {request.target}")

        await service.control("cordon", "release", release)
        released = await run(
            "quarantine", "release", "gpu-node-a", "--reason", "checked", "--operator", "op"
        )
        assert released.returncode == 0, released.stderr
        assert released.stdout.strip() == "released gpu-node-a"
        assert [(r.operator, r.reason) for r in asked] == [("op", "checked")]

        # ... and nothing it may not do.
        errors = Errors()
        raw = await nats.connect(
            server.url,
            user=OPERATOR_USER,
            password="operator-test-pw",
            inbox_prefix=OPERATOR_INBOX,
            error_cb=errors.record,
            allow_reconnect=False,
        )
        js = raw.jetstream(timeout=1)
        try:
            wire = encode(_health("gpu-node-a"))
            await raw.publish(wire.subject, wire.body, headers=wire.headers)
            kv = await js.key_value("cordon")
            assert (await kv.get("node.gpu-node-a")).value == b'{"gpus": {}}'  # it reads
            with pytest.raises(nats.errors.TimeoutError):
                await kv.put("node.gpu-node-a", b"{}")
            with pytest.raises(nats.errors.TimeoutError):
                await kv.delete("node.gpu-node-a")
            with pytest.raises(nats.errors.TimeoutError):
                await js.delete_stream("AUDIT")
            with pytest.raises(nats.errors.TimeoutError):  # a service's durable: not its to pull
                psub = await js.pull_subscribe_bind("cordon", stream="GPU")
                await psub.fetch(1, timeout=1)
            await raw.subscribe("control.>")
            await raw.flush()
            await wait_for(
                lambda: (
                    errors.has("permissions violation", "publish", "gpu.health.gpu-node-a")
                    and errors.has("permissions violation", "$kv.cordon")
                    and errors.has("permissions violation", "stream.delete.audit")
                    and errors.has("permissions violation", "msg.next.gpu.cordon")
                    and errors.has("permissions violation", "subscription", "control.>")
                ),
                what="the server's refusals of the operator's writes",
            )
            info = await admin.js.stream_info("GPU", subjects_filter="gpu.health.>")
            assert info.state.messages == 1  # only the admin's event
            entry = await state.get("node.gpu-node-a")
            assert entry.value == b'{"gpus": {}}'
            assert (await admin.js.stream_info("AUDIT")).config.name == "AUDIT"
        finally:
            await raw.close()
            await service.close(grace=1)
            await admin.close(grace=1)


async def test_the_capacity_service_runs_as_its_chart_user_and_publishes_only_capacity(
    tmp_path: Path,
) -> None:
    """`nodeward-capacity` with the chart's grants: the service binds its two consumers and
    its bucket, writes its snapshot and publishes `capacity.v1`; an audit event is refused."""
    from services.capacity.service import build
    from sim.cluster import SimCluster
    from tests.integration.capacity_fixtures import capacity_seed

    _, key = new_nkey()
    docs = render(tmp_path, representative_values({"gpu-node-a": key}))
    conf = _auth_layout(tmp_path, docs)
    admin_pw = _admin_password(docs)
    secret = named(docs, "Secret", "nw-nats-capacity")
    async with (
        EmbeddedNats(tmp_path / "nats", config_file=conf) as server,
        SimCluster(capacity_seed("auth"), port=0, bookmark_interval=0.2) as sim,
    ):
        admin = await _provisioned(server, admin_pw)
        bus = _service_settings(server.url, secret, "capacity", fail_fast=True)
        settings = Settings(
            bus=bus,
            cluster={"kubeconfig": sim.write_kubeconfig(tmp_path / "kc", identity="capacity")},
            daemon={"shutdown_timeout": "4s"},
        )
        daemon = await build(settings)
        await daemon.start()
        other = await Bus.connect(bus, source="service/capacity")
        try:

            async def published() -> bool:
                info = await admin.js.stream_info("CAPACITY")
                return info.state.messages >= 4  # H100 and A100 whole GPUs, two MIG profiles

            await wait_for(published, timeout=15, what="capacity.v1 on CAPACITY")
            entry = await (await admin.js.key_value("capacity")).get("snapshot")
            assert entry.value and b"h100-a-auth" in entry.value
            with pytest.raises(PublishError):
                await other.publish(make_event(Remediation.example(), source="service/capacity"))
        finally:
            await other.close(grace=1)
            await daemon.stop()
            await admin.close(grace=1)
