"""The falco service's isolation records kept true to the API (issue 28): a real nats-server,
the sim cluster, and what `nodeward status` reads (`nodeward.fleet_status.gather_status`).

An isolated pod deleted, replaced by another of its name, or unlabelled by someone else is
no longer counted as isolated: its record in `marks_bucket` ends within seconds, its end
audited once on `remediation.isolate.<pod>`; an operator's release forgets the record with
its own audit and nothing more.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from nodeward.bus.snapshot import kv_entries
from nodeward.fleet_status import gather_status
from schemas.control import ControlRequest, ControlStatus
from schemas.falco import ISOLATE_LABEL
from schemas.remediation import Outcome, Remediation
from services.falco.state import ISOLATIONS, IsolationRecord, isolation_key
from services.falco.view import FalcoView
from tests.conftest import wait_for
from tests.integration.falco_fixtures import DROP_AND_EXECUTE, EnvFactory, FalcoEnv

BOB = "bob-llm-finetune-6d5f9c7b8d-q8wzr"
BOB_SIBLING = "bob-llm-finetune-6d5f9c7b8d-x2kfp"
RULES = [
    {
        "name": "contain",
        "match": {"pod": True, "output_fields": ["proc.name=xmrig"]},
        "actions": [{"action": "isolate"}],
    },
    {
        "name": "tell",
        "match": {"pod": True},
        "actions": [
            {"action": "annotate", "with": {"annotations": {"nodeward.io/seen": "{rule}"}}}
        ],
    },
]
ENDS = frozenset({"pod_gone", "label_removed"})
SLOW = "1h"
"""No pass of its own during the test: the test runs `check_all` itself."""


def bucket(env: FalcoEnv) -> str:
    return str(env.settings.services["falco"]["marks_bucket"])


async def record(env: FalcoEnv, namespace: str, pod: str) -> IsolationRecord | None:
    raw = await kv_entries(env.bus.nc, bucket(env), [ISOLATIONS.prefix]) or {}
    found = raw.get(isolation_key(namespace, pod))
    return ISOLATIONS.load(found) if found else None


async def status_isolated(env: FalcoEnv, namespace: str) -> set[str]:
    """The pods of `namespace` that `nodeward status` counts as isolated."""
    fleet = await gather_status(
        env.bus.nc, nats_url="nats://test", views={"falco": FalcoView(marks_bucket=bucket(env))}
    )
    return {i.pod for n in fleet.nodes for i in n.isolated if i.pod.startswith(f"{namespace}/")}


async def ends(env: FalcoEnv, namespace: str, pod: str) -> list[Remediation]:
    return [r for r in await env.audits(namespace, pod, "isolate") if r.guard in ENDS]


async def isolate_bob(env: FalcoEnv) -> tuple[str, str]:
    """Bob's pod isolated through an alert, recorded, and counted by status: (ns, uid)."""
    ns = env.ns("user-bob")
    await env.publish_raw(env.alert(DROP_AND_EXECUTE))

    async def decided() -> bool:
        done = (Outcome.APPLIED, Outcome.DRY_RUN)
        return any(r.outcome in done for r in await env.audits(ns, BOB, "isolate"))

    await wait_for(decided, timeout=10, what="bob's pod isolated")
    uid = (await env.pod(ns, BOB))["metadata"]["uid"]
    held = await wait_for(lambda: record(env, ns, BOB), timeout=5, what="its record")
    assert (held.uid, held.falco_rule, held.policy) == (
        uid,
        f"{DROP_AND_EXECUTE} {env.uid}",
        "contain",
    )
    assert await status_isolated(env, ns) == {f"{ns}/{BOB}"}
    return ns, uid


async def successor(env: FalcoEnv, namespace: str, name: str) -> dict[str, Any]:
    """The pod deleted and made again under its name, as its controller would (from the
    template: without nodeward's label and annotation): another uid."""
    old = await env.pod(namespace, name)
    meta = old["metadata"]
    await env.admin.pods.delete(namespace, name)
    # as a StatefulSet's controller does: the new pod only once the old one has terminated
    assert await env.admin.pods.wait_gone(namespace, name, meta["uid"], within=10)
    labels = {k: v for k, v in (meta.get("labels") or {}).items() if k != ISOLATE_LABEL}
    manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels,
            "ownerReferences": meta.get("ownerReferences") or [],
        },
        "spec": old["spec"],
    }
    path = f"/api/v1/namespaces/{namespace}/pods"
    made: dict[str, Any] = await env.admin.client.request("POST", path, body=manifest)
    assert made["metadata"]["uid"] != meta["uid"]
    return made


@pytest.mark.parametrize("dry_run", [False, True])
async def test_a_deleted_isolated_pod_ends_its_record_and_leaves_status(
    falco_env: EnvFactory, dry_run: bool
) -> None:
    env = await falco_env(rules=RULES, isolation_check_interval="200ms", dry_run=dry_run)
    await env.start()
    ns, uid = await isolate_bob(env)
    await asyncio.sleep(0.6)  # passes over a pod that is there: nothing ends
    assert await ends(env, ns, BOB) == []
    assert await record(env, ns, BOB) is not None

    await env.admin.pods.delete(ns, BOB)

    async def gone() -> bool:
        return await record(env, ns, BOB) is None and not await status_isolated(env, ns)

    await wait_for(gone, timeout=10, what="the record ended and status no longer counting it")
    await asyncio.sleep(0.6)  # more passes: the end is audited once
    [end] = await ends(env, ns, BOB)
    assert (end.outcome, end.guard, end.actor) == (Outcome.SKIPPED, "pod_gone", "service/falco")
    assert end.reason.startswith(f"{ns}/{BOB}: the isolated pod is gone (deleted")
    assert end.reason.endswith("; its isolation record ends")
    assert end.details["pod_uid"] == uid and end.details["pod_gone"] == "deleted"
    assert end.details["dry_run_isolation"] is dry_run
    assert await record(env, ns, BOB_SIBLING) is None  # its sibling replica never was isolated


async def test_a_pod_made_again_under_the_isolated_ones_name_is_not_isolated(
    falco_env: EnvFactory,
) -> None:
    env = await falco_env(rules=RULES, isolation_check_interval=SLOW)
    assembled = await env.start()
    isolations = assembled.service.isolations
    assert isolations is not None
    ns, uid = await isolate_bob(env)

    new = await successor(env, ns, BOB)
    # status alone tells the successor from the isolated pod once a decision names it: an
    # alert about the new pod (annotated, not isolated) carries its uid.
    later = env.alert(DROP_AND_EXECUTE, **{"proc.name": "curl"})
    later["output"] = later["output"].replace("process=xmrig", "process=curl")
    await env.publish_raw(later)

    async def annotated() -> bool:
        return any(r.outcome == Outcome.APPLIED for r in await env.audits(ns, BOB, "annotate"))

    await wait_for(annotated, timeout=10, what="the successor annotated")
    assert await status_isolated(env, ns) == set()
    assert await record(env, ns, BOB) is not None  # the pass has not run yet

    assert await isolations.check_all() == 1
    assert await record(env, ns, BOB) is None
    assert await isolations.check_all() == 0
    [end] = await ends(env, ns, BOB)
    assert (end.outcome, end.guard) == (Outcome.SKIPPED, "pod_gone")
    assert end.details["pod_gone"] == "replaced"
    assert (end.details["pod_uid"], end.details["new_pod_uid"]) == (uid, new["metadata"]["uid"])
    assert f"the isolated pod (uid {uid}) is gone" in end.reason
    assert await status_isolated(env, ns) == set()


async def test_a_successor_is_not_counted_by_the_pass_alone(falco_env: EnvFactory) -> None:
    """No later decision names the successor: the service's pass is what ends it."""
    env = await falco_env(rules=RULES, isolation_check_interval="200ms")
    await env.start()
    ns, uid = await isolate_bob(env)
    await successor(env, ns, BOB)

    async def ended() -> bool:
        return await record(env, ns, BOB) is None and not await status_isolated(env, ns)

    await wait_for(ended, timeout=10, what="the successor not counted")
    [end] = await ends(env, ns, BOB)
    # The pass may find the name absent, or already made again: either way the pod is gone.
    assert end.guard == "pod_gone" and end.details["pod_uid"] == uid
    assert end.details["pod_gone"] in ("deleted", "replaced")


async def test_a_label_removed_by_hand_ends_the_record_once(falco_env: EnvFactory) -> None:
    env = await falco_env(rules=RULES, isolation_check_interval=SLOW)
    assembled = await env.start()
    isolations = assembled.service.isolations
    assert isolations is not None
    ns, _ = await isolate_bob(env)

    await env.admin.pods.set_labels(ns, BOB, {ISOLATE_LABEL: None})
    assert await isolations.check_all() == 1
    assert await isolations.check_all() == 0
    assert await record(env, ns, BOB) is None
    assert await status_isolated(env, ns) == set()
    [end] = await ends(env, ns, BOB)
    assert (end.outcome, end.guard) == (Outcome.SKIPPED, "label_removed")
    assert f"its {ISOLATE_LABEL}=true label was removed, not by nodeward" in end.reason


async def test_a_release_forgets_the_record_with_its_own_audit(falco_env: EnvFactory) -> None:
    env = await falco_env(rules=RULES, isolation_check_interval=SLOW)
    assembled = await env.start()
    service = assembled.service
    assert service.isolations is not None
    ns, _ = await isolate_bob(env)

    reply = await service.release_control(
        ControlRequest(
            service="falco",
            verb="release",
            operator="carol",
            reason="a benchmark",
            target=f"{ns}/{BOB}",
        )
    )
    assert reply.status == ControlStatus.OK, reply
    assert await record(env, ns, BOB) is None
    assert await service.isolations.check_all() == 0
    assert await ends(env, ns, BOB) == []
    assert await status_isolated(env, ns) == set()
