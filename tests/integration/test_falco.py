"""services.falco against a real NATS and the sim cluster: what on-call and a user would see.

Alerts come in as Falco and Falcosidekick send them (an HTTP POST to the ingest, or a core
NATS publish on `falco.<priority>.<rule>` without headers) and end in pod labels, the
isolating NetworkPolicy, kubelet checkpoints, audit records and notices.
"""

from __future__ import annotations

import base64
import gzip
import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from schemas.falco import ISOLATE_LABEL
from schemas.remediation import Outcome, Remediation
from services.falco.actions.isolate import ISOLATE_POLICY
from tests.conftest import wait_for
from tests.helpers.pki import write_pki
from tests.integration.falco_fixtures import (
    DROP_AND_EXECUTE,
    NODE,
    TOKEN,
    EnvFactory,
    FalcoEnv,
    sidekick_subject,
)
from tests.integration.notifier_peers import EnvFactory as NotifierFactory

BOB = "bob-llm-finetune-6d5f9c7b8d-q8wzr"
BOB_SIBLING = "bob-llm-finetune-6d5f9c7b8d-x2kfp"
CAROL = "carol-vllm-serve-84c6d7f9b-7tq5z"

# What the shipped rules do with each sample's priority.
EXPECTED = {
    "Critical": {"checkpoint", "isolate", "notify"},
    "Warning": {"annotate", "notify"},
    "Notice": {"notify"},
    "Informational": set(),
}


def outcomes(records: list[Remediation]) -> dict[str, tuple[str, str | None]]:
    return {r.action: (r.outcome.value, r.guard) for r in records}


async def deliver(env: FalcoEnv, alert: dict[str, Any], transport: str) -> None:
    if transport == "http":
        response = await env.post(alert)
        assert response.status_code == 200, response.text
        assert response.json()["subjects"] == [sidekick_subject(alert)]
    else:
        await env.publish_raw(alert)


def isolate_alert_time(env: FalcoEnv) -> datetime:
    """The time of the sample alert that isolates bob's pod (the Critical one)."""
    return datetime.fromisoformat(env.alert(DROP_AND_EXECUTE)["time"].replace("Z", "+00:00"))


async def selected_pods(env: FalcoEnv, namespace: str) -> list[str]:
    """The pods the isolating policy's selector selects, as the API server lists them."""
    policy = await env.network_policy(namespace, ISOLATE_POLICY)
    assert policy is not None
    selector = ",".join(f"{k}={v}" for k, v in policy["spec"]["podSelector"]["matchLabels"].items())
    return sorted(
        p["metadata"]["name"] for p in await env.admin.pods.list(namespace, label_selector=selector)
    )


@pytest.mark.parametrize("transport", ["http", "nats"])
async def test_every_sample_alert_ends_in_its_rules_actions(
    falco_env: EnvFactory, transport: str
) -> None:
    env = await falco_env()
    await env.start()
    alerts = env.every_sample()
    assert len(alerts) == 8
    for alert in alerts:
        await deliver(env, alert, transport)

    async def decided(alert: dict[str, Any]) -> dict[str, tuple[str, str | None]] | None:
        ns, pod = alert["output_fields"]["k8s.ns.name"], alert["output_fields"]["k8s.pod.name"]
        mine = [
            r for r in await env.audits(ns, pod) if r.details.get("falco_rule") == alert["rule"]
        ]
        found = outcomes(mine)
        return found if set(found) == EXPECTED[alert["priority"]] else None

    for alert in alerts:
        if not EXPECTED[alert["priority"]]:
            continue
        found = await wait_for(lambda a=alert: decided(a), timeout=10, what=alert["rule"])
        assert all(outcome == ("applied", None) for outcome in found.values()), found
    await wait_for(env.settled, timeout=10, what="every alert acked")
    assert env.metric("nodeward_falco_alerts_total", outcome="responded") == 7
    assert env.metric("nodeward_falco_alerts_total", outcome="unmatched") == 1  # Informational

    # Critical: bob's one pod isolated, its sibling replica not; the checkpoint was taken.
    bob_ns = env.ns("user-bob")
    assert await selected_pods(env, bob_ns) == [BOB]
    policy = await env.network_policy(bob_ns, ISOLATE_POLICY)
    assert policy is not None
    assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert "ingress" not in policy["spec"] and "egress" not in policy["spec"]  # deny all
    assert [(c.namespace, c.pod, c.container) for c in env.sim.checkpoints] == [
        (bob_ns, BOB, "trainer")
    ]
    isolate = (await env.audits(bob_ns, BOB, "isolate"))[0]
    assert isolate.details["network_policy"] == f"{bob_ns}/{ISOLATE_POLICY}"
    assert isolate.actor == "service/falco" and isolate.policy == "critical-contain"
    # The isolation annotation says when nodeward acted and, apart, when Falco saw it (the
    # sample alerts are hours old).
    note = json.loads(
        (await env.pod(bob_ns, BOB))["metadata"]["annotations"]["nodeward.io/isolation"]
    )
    acted = datetime.fromisoformat(note["at"])
    assert abs((datetime.now(UTC) - acted).total_seconds()) < 60
    assert datetime.fromisoformat(note["alert_time"]) == isolate_alert_time(env)
    # Warning: the pod carries the annotation the rule writes.
    alice = await env.pod(env.ns("user-alice"), "jupyter-alice-0")
    assert alice["metadata"]["annotations"]["nodeward.io/falco-warning"].startswith(
        "Read sensitive file untrusted"
    )
    assert ISOLATE_LABEL not in (alice["metadata"].get("labels") or {})


async def test_unauthenticated_wrong_and_oversized_posts_are_refused(
    falco_env: EnvFactory,
) -> None:
    env = await falco_env()
    await env.start(
        ingest={
            "host": "127.0.0.1",
            "port": 0,
            "token_file": str(env.token_file),
            "max_body_bytes": 4096,
        }
    )
    # Before any request, every status the ingest answers is there at 0 (with a token:
    # 401 and 403 too), so the refusal alert sees the first refusals.
    async with httpx.AsyncClient() as http:
        scraped = (await http.get(f"{env.running[-1].daemon.url}/metrics")).text
    codes = re.findall(r'nodeward_falco_ingest_requests_total\{code="(\d+)"\} 0.0', scraped)
    assert codes == ["200", "400", "401", "403", "413", "429", "503"]
    alert = env.alert(DROP_AND_EXECUTE)
    no_auth = await env.post(alert, headers={"Authorization": ""})
    assert no_auth.status_code == 401
    assert no_auth.headers["WWW-Authenticate"].startswith("Bearer")
    wrong = await env.post(alert, headers={"Authorization": "Bearer not-the-token-at-all"})
    assert wrong.status_code == 403
    big = dict(alert, output="x" * 5000)
    assert (await env.post(big)).status_code == 413
    # Falco's `http_output.compress_uploads`: gzip bodies, limited once inflated.
    zipped = {"Content-Encoding": "gzip"}
    bomb = gzip.compress(json.dumps(dict(alert, output="x" * 1_000_000)).encode())
    assert len(bomb) < 4096
    assert (await env.post(bomb, headers=zipped)).status_code == 413
    gzipped = await env.post(gzip.compress(json.dumps(alert).encode()), headers=zipped)
    assert gzipped.status_code == 200, gzipped.text
    # Falco's http_output sends the token as a URL password: HTTP Basic.
    basic = base64.b64encode(f"falco:{TOKEN}".encode()).decode()
    ok = await env.post(alert, headers={"Authorization": f"Basic {basic}"})
    assert ok.status_code == 200, ok.text
    await wait_for(env.settled, timeout=10, what="the accepted alert handled")
    assert env.metric("nodeward_falco_alerts_total", outcome="responded") == 1
    assert env.metric("nodeward_falco_ingest_requests_total", code="401") == 1
    assert env.metric("nodeward_falco_ingest_requests_total", code="403") == 1
    assert env.metric("nodeward_falco_ingest_requests_total", code="413") == 2


async def test_garbage_is_400_over_http_and_dead_lettered_over_nats(
    falco_env: EnvFactory,
) -> None:
    env = await falco_env()
    await env.start()
    garbage = await env.post(b'{"rule": "half an alert", "priority":')
    assert garbage.status_code == 400
    assert "not JSON" in garbage.json()["error"]
    wrong = await env.post({"rule": "x", "priority": "Sever", "time": "2026-08-20T14:02:11Z"})
    assert wrong.status_code == 400
    assert "priority" in wrong.json()["error"] and "\n" not in wrong.json()["error"]
    # Falcosidekick's `/test` event is recognised and dropped.
    from tests.unit.test_falco_rules import SIDEKICK_TESTS

    dropped = await env.post(SIDEKICK_TESTS["2.29-internal"])
    assert dropped.status_code == 200 and dropped.json()["dropped_test_events"] == 1
    assert dropped.json()["published"] == []

    subject = f"falco.critical.garbage_{env.uid}"
    await env.publish_raw(b"\x00not json at all{", subject=subject)
    from tests.integration.cordon_fixtures import read_stream

    consumer = env.consumers()[0]  # a Critical alert's lane

    async def dead_lettered() -> list[Any]:
        return await read_stream(env.bus, "DLQ", f"dlq.SECURITY.{consumer}")

    letters = await wait_for(dead_lettered, timeout=10, what="the DLQ entry")
    assert len(letters) == 1
    assert letters[0].data.original_subject == subject
    assert letters[0].data.reason.value == "invalid"
    assert "not JSON" in letters[0].data.error
    await wait_for(env.settled, timeout=10, what="the garbage acked")


async def test_a_burst_of_500_identical_alerts_is_one_action_and_one_notice(
    falco_env: EnvFactory, notifier_env: NotifierFactory
) -> None:
    notifier = await notifier_env(
        grouping={"group_wait": "3s", "group_interval": "0s", "dedup_window": "10m"}
    )
    env = await falco_env(topic=notifier.topic)
    await notifier.start()
    await env.start()
    base = env.alert(DROP_AND_EXECUTE)
    for i in range(500):  # the same behaviour, seen again and again (Falcosidekick uuids)
        alert = dict(base, uuid=f"00000000-0000-4000-8000-{i:012d}")
        alert["time"] = f"2026-08-20T14:11:05.{i:06d}Z"
        alert["output"] = f"14:11:05.{i:09d}: " + base["output"].partition(": ")[2]
        await env.publish_raw(alert)
    await wait_for(env.settled, timeout=30, what="500 alerts handled")
    bob_ns = env.ns("user-bob")
    records = await env.audits(bob_ns, BOB)
    assert sorted(r.action for r in records) == ["checkpoint", "isolate", "notify"]
    assert all(r.outcome == Outcome.APPLIED for r in records)
    assert len(env.sim.checkpoints) == 1
    assert env.metric("nodeward_falco_alerts_total", outcome="responded") == 1
    assert env.metric("nodeward_falco_alerts_total", outcome="duplicate") == 499
    await wait_for(notifier.settled, timeout=15, what="the notices delivered")
    # One page for on-call (the incident's decisions together), one message for bob's owner.
    files = notifier.outbox_files()
    assert len(files) == 2, [f.name for f in files]
    [oncall] = [f.read_text() for f in files if "To: on-call" in f.read_text()]
    [owner] = [f.read_text() for f in files if f"To: the owner of {bob_ns}/" in f.read_text()]
    assert BOB in oncall and "isolate" in oncall and "Security alert" not in oncall
    assert "Security alert on your pod" in owner


async def test_critical_on_an_exempt_pod_only_notifies(falco_env: EnvFactory) -> None:
    env = await falco_env()
    await env.start()
    dave = env.ns("user-dave")
    alert = env.alert(
        DROP_AND_EXECUTE,
        **{"k8s.ns.name": dave, "k8s.pod.name": "exempt-trainer", "container.name": "trainer"},
    )
    await env.publish_raw(alert)
    records = await wait_for(
        lambda: _when(env.audits(dave, "exempt-trainer"), 3), timeout=10, what="3 decisions"
    )
    assert outcomes(records) == {
        "checkpoint": ("skipped", "exempt"),
        "isolate": ("skipped", "exempt"),
        "notify": ("applied", None),
    }
    pod = await env.pod(dave, "exempt-trainer")
    assert ISOLATE_LABEL not in pod["metadata"]["labels"]
    assert env.sim.checkpoints == []
    assert await env.network_policy(dave, ISOLATE_POLICY) is None


@pytest.mark.parametrize("go_on", [True, False])
async def test_a_failed_checkpoint_is_reported_and_continue_decides(
    falco_env: EnvFactory, go_on: bool
) -> None:
    rules = [
        {
            "name": "contain",
            "match": {"priority": ">=Critical"},
            "actions": [
                {"action": "checkpoint", "continue": go_on},
                {"action": "isolate"},
                {"action": "notify"},
            ],
        }
    ]
    env = await falco_env(rules=rules)
    await env.start()
    carol = env.ns("user-carol")
    alert = env.alert(
        DROP_AND_EXECUTE, **{"k8s.ns.name": carol, "k8s.pod.name": CAROL, "container.name": "vllm"}
    )
    response = await env.post(alert)
    assert response.status_code == 200
    records = await wait_for(
        lambda: _when(env.audits(carol, CAROL), 3), timeout=10, what="3 decisions"
    )
    found = outcomes(records)
    assert found["checkpoint"] == ("failed", None)
    failed = next(r for r in records if r.action == "checkpoint")
    assert "checkpoint/restore support not available" in failed.reason
    pod = await env.pod(carol, CAROL)
    if go_on:
        assert found["isolate"] == ("applied", None) and found["notify"] == ("applied", None)
        assert pod["metadata"]["labels"][ISOLATE_LABEL] == "true"
    else:
        assert found["isolate"] == ("skipped", "stopped") and found["notify"] == (
            "skipped",
            "stopped",
        )
        assert ISOLATE_LABEL not in pod["metadata"]["labels"]


async def test_alerts_real_falco_sends_are_tolerated(falco_env: EnvFactory) -> None:
    """Null k8s fields (a host event), integer nanosecond times, escapes, cut strings."""
    env = await falco_env(
        rules=[
            {
                "name": "host",
                "match": {"pod": False},
                "actions": [{"action": "cordon"}, {"action": "notify"}],
            },
            {"name": "rest", "actions": [{"action": "isolate"}, {"action": "notify"}]},
        ]
    )
    await env.start()
    host = env.alert(
        "Clear Log Activities",
        **{"k8s.ns.name": None, "k8s.pod.name": None, "container.id": "host"},
    )
    host["time"] = 1787234531318274915  # integer nanoseconds
    host["output"] += " <NA> \u00e9\u00e8 \U0001f600"
    # Go-style escapes, non-ASCII as \uXXXX, and a lone surrogate escape (\ud800).
    body = (
        json.dumps(host).replace("<NA>", "\\u003cNA\\u003e").replace(" \\u00e9", " \\ud800\\u00e9")
    )
    assert "\\ud800" in body and "\\u003c" in body
    response = await env.post(body.encode())
    assert response.status_code == 200, response.text
    records = await wait_for(lambda: _when(_node_audits(env), 2), timeout=10, what="node decisions")
    assert outcomes(records) == {"cordon": ("applied", None), "notify": ("applied", None)}
    node = await env.admin.nodes.get(NODE)
    assert node["spec"]["unschedulable"] is True
    assert any(t["key"] == "nodeward.io/falco-compromised" for t in node["spec"]["taints"])
    # A pod name Falcosidekick cut short is never acted on.
    cut = env.alert(DROP_AND_EXECUTE, **{"k8s.pod.name": "bob-llm-fine[...]"})
    cut["output"] = cut["output"][:507] + "[...]"
    assert (await env.post(cut)).status_code == 200
    await wait_for(env.settled, timeout=10, what="the cut alert handled")
    assert await env.network_policy(env.ns("user-bob"), ISOLATE_POLICY) is None


async def _when(records: Any, count: int) -> list[Remediation] | None:
    found: list[Remediation] = await records
    return found if len(found) >= count else None


async def _node_audits(env: FalcoEnv) -> list[Remediation]:
    from tests.integration.cordon_fixtures import read_stream

    events = await read_stream(env.bus, "AUDIT", f"remediation.*.{NODE}")
    return [e.data for e in events if str(e.data.details.get("falco_rule", "")).endswith(env.uid)]


async def test_label_checkpoint_then_terminate_with_the_grace_asked(falco_env: EnvFactory) -> None:
    rules = [
        {
            # Rule names match exactly: this test's alert is "<rule> <uid>", so not this one.
            "name": "miner",
            "match": {"rules": [DROP_AND_EXECUTE], "output_fields": ["proc.name=xmrig"]},
            "actions": [{"action": "notify"}],
        },
        {
            "name": "kill-miner",
            "match": {"output_fields": ["proc.name=xmrig"]},
            "actions": [
                {"action": "label", "with": {"labels": {"security.example.org/falco": "{rule}"}}},
                {"action": "checkpoint", "continue": False},
                {"action": "terminate", "with": {"grace_period_seconds": 5}},
            ],
        },
    ]
    env = await falco_env(rules=rules)
    await env.start()
    bob = env.ns("user-bob")
    await env.publish_raw(env.alert(DROP_AND_EXECUTE))
    records = await wait_for(lambda: _when(env.audits(bob, BOB), 3), timeout=10, what="3 decisions")
    assert outcomes(records) == {
        "label": ("applied", None),
        "checkpoint": ("applied", None),
        "terminate": ("applied", None),
    }
    terminate = next(r for r in records if r.action == "terminate")
    assert terminate.details == {**terminate.details, "deleted": True, "grace_period_seconds": 5}
    assert [c.pod for c in env.sim.checkpoints] == [BOB]  # the evidence came first

    async def gone() -> bool:
        names = {p["metadata"]["name"] for p in await env.admin.pods.list(bob)}
        return BOB not in names and BOB_SIBLING in names

    await wait_for(gone, timeout=10, what="bob's pod deleted, its sibling kept")


async def test_dry_run_and_the_per_pod_rate_limit_are_audited(falco_env: EnvFactory) -> None:
    env = await falco_env(dry_run=True)
    await env.start()
    bob = env.ns("user-bob")
    await env.post(env.alert(DROP_AND_EXECUTE))
    records = await wait_for(lambda: _when(env.audits(bob, BOB), 3), timeout=10, what="dry run")
    assert {r.outcome for r in records} == {Outcome.DRY_RUN}
    assert all(r.dry_run and r.reason.startswith("dry run: would") for r in records)
    assert await env.network_policy(bob, ISOLATE_POLICY) is None and env.sim.checkpoints == []

    limited = await falco_env(rate_limit_per_pod={"per_minute": 0.001, "burst": 2})
    await limited.start()
    bob = limited.ns("user-bob")
    first = limited.alert(DROP_AND_EXECUTE)
    second = dict(first, output=first["output"] + " again")  # not a duplicate: another alert
    await limited.publish_raw(first)
    await wait_for(lambda: _when(limited.audits(bob, BOB), 3), timeout=10, what="first alert")
    await limited.publish_raw(second)
    records = await wait_for(lambda: _when(limited.audits(bob, BOB), 6), timeout=10, what="second")
    later = [r for r in records if r.trigger_event_id != records[0].trigger_event_id]
    assert outcomes(later) == {
        "checkpoint": ("refused", "rate_limit_pod"),
        "isolate": ("refused", "rate_limit_pod"),
        "notify": ("applied", None),  # people are still told
    }
    assert "2" in next(r for r in later if r.action == "isolate").reason  # names the burst


async def test_one_alert_from_falcosidekick_and_the_ingest_is_acted_on_once(
    falco_env: EnvFactory,
) -> None:
    env = await falco_env()
    await env.start()
    alert = env.alert(DROP_AND_EXECUTE)
    assert (await env.post(alert)).status_code == 200
    await env.publish_raw(alert)
    await wait_for(
        lambda: env.metric("nodeward_falco_alerts_total", outcome="duplicate") == 1,
        timeout=10,
        what="the second copy counted as a duplicate",
    )
    await wait_for(env.settled, timeout=10, what="both handled")
    assert env.metric("nodeward_falco_alerts_total", outcome="responded") == 1
    assert len(env.sim.checkpoints) == 1
    assert len(await env.audits(env.ns("user-bob"), BOB, "checkpoint")) == 1


async def test_mtls_alone_lets_a_client_certificate_in_and_nobody_else(
    falco_env: EnvFactory, tmp_path: Path
) -> None:
    import ssl

    import httpx

    pki = write_pki(tmp_path, "falco")
    env = await falco_env()
    ingest = {
        "host": "127.0.0.1",
        "port": 0,
        "tls_cert_file": str(pki.server[0]),
        "tls_key_file": str(pki.server[1]),
        "client_ca_file": str(pki.ca),
    }
    await env.start(ingest=ingest)
    assert env.url.startswith("https://")
    alert = env.alert(DROP_AND_EXECUTE)
    with_cert = ssl.create_default_context(cafile=str(pki.ca))
    with_cert.load_cert_chain(str(pki.client[0]), str(pki.client[1]))
    async with httpx.AsyncClient(verify=with_cert) as client:
        answer = await client.post(env.url, json=alert, timeout=5)
    assert answer.status_code == 200, answer.text
    without = ssl.create_default_context(cafile=str(pki.ca))
    with pytest.raises(httpx.HTTPError):
        async with httpx.AsyncClient(verify=without) as client:
            await client.post(env.url, json=alert, timeout=5)
    await wait_for(env.settled, timeout=10, what="the accepted alert handled")
    assert env.metric("nodeward_falco_alerts_total", outcome="responded") == 1


async def test_pods_in_skipped_namespaces_are_never_acted_on(falco_env: EnvFactory) -> None:
    env = await falco_env()
    bob = env.ns("user-bob")
    await env.start(skip_namespaces=["kube-system", bob])
    await env.publish_raw(env.alert(DROP_AND_EXECUTE))
    records = await wait_for(lambda: _when(env.audits(bob, BOB), 3), timeout=10, what="3 decisions")
    assert outcomes(records) == {
        "checkpoint": ("skipped", "skipped_namespace"),
        "isolate": ("skipped", "skipped_namespace"),
        "notify": ("applied", None),
    }
    assert env.sim.checkpoints == [] and await env.network_policy(bob, ISOLATE_POLICY) is None


async def test_falcosidekick_test_events_of_every_version_are_dropped_over_http_and_nats(
    falco_env: EnvFactory,
) -> None:
    """Falcosidekick's `/test` event, as each version sends it: counted as dropped, never
    stored as an alert or acted on, whether it comes to the ingest or on its NATS subject."""
    from tests.unit.test_falco_rules import SIDEKICK_TESTS

    env = await falco_env(subjects=["falco.debug.>"])  # only this test publishes there
    await env.start()
    for version, body in SIDEKICK_TESTS.items():
        got = await env.post(body)
        assert got.status_code == 200, version
        assert got.json()["dropped_test_events"] == 1 and got.json()["published"] == [], version
    assert env.metric("nodeward_falco_ingest_alerts_total", outcome="test_dropped") == len(
        SIDEKICK_TESTS
    )
    for body in SIDEKICK_TESTS.values():
        await env.publish_raw(body)  # on falco.debug.test_rule, as Falcosidekick's NATS output

    def dropped() -> bool:
        return env.metric("nodeward_falco_alerts_total", outcome="test_dropped") >= len(
            SIDEKICK_TESTS
        )

    await wait_for(dropped, timeout=10, what="the test events dropped by the service")
    await wait_for(env.settled, timeout=10, what="the test events acked")
    assert env.metric("nodeward_falco_alerts_total", outcome="responded") == 0
