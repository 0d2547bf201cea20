"""Routing by urgency: a critical notice goes out at once, grouped only with its own topic's
(a storm is one page), never behind a digest; a user's notice goes to that user alone, one message each."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from schemas import make_event
from schemas.notify import Notification, Severity
from services.notifier.channels import matcher, resolved
from services.notifier.grouping import Entry, Group, Grouper, GroupingSettings, RateLimitSettings
from services.notifier.routing import Audience, Facts, Route, RoutingError, load_routes
from services.notifier.service import NotifierSettings, lanes
from tests.helpers.notices import note


def notice(title: str, severity: Severity, *, node: str | None = None, **fields: Any) -> Entry:
    """A notice about `node` keyed by its title and node, as an outbox entry; `fields`: its
    incident, audience, topic, decision, resolves..."""
    data = note(title, severity, node=node, dedup_key=f"{title}/{node}", **fields)
    return Entry(make_event(data, source="test"), Audience.parse(data.audience), ("outbox",))


class Sent:
    """The flush: keeps each group's titles with the time it went out."""

    def __init__(self) -> None:
        self.groups: list[tuple[float, list[str], Group]] = []

    async def __call__(self, group: Group) -> None:
        titles = [e.note.title for e in group.entries]
        self.groups.append((asyncio.get_running_loop().time(), titles, group))
        for e in group.entries:
            e.done.set_result(dict.fromkeys(e.channels, "sent"))

    def titles(self) -> list[list[str]]:
        return [t for _, t, _ in self.groups]


def grouping(**values: str) -> GroupingSettings:
    return GroupingSettings.model_validate(
        {"group_wait": "1h", "group_interval": "1h", "dedup_window": "0s"} | values
    )


async def test_a_critical_notice_is_not_held_by_an_open_digest_or_its_interval() -> None:
    sent = Sent()
    grouper = Grouper(grouping(group_wait="0.05s"), RateLimitSettings(), sent)
    route = Route(name="oncall", channels=["outbox"])
    # A digest goes out, so the route's next digest is an hour away; another one opens.
    await grouper.add(route, None, notice("idle 1", Severity.INFO))
    later = [
        asyncio.ensure_future(grouper.add(route, None, notice(f"idle {i}", Severity.INFO)))
        for i in range(2, 22)
    ]
    started = asyncio.get_running_loop().time()
    page = notice("gpu-h100-03: quarantine applied", Severity.CRITICAL, node="gpu-h100-03")
    async with asyncio.timeout(60):  # far below the hour the digest waits
        assert await grouper.add(route, None, page) == {"outbox": "sent"}
    took = sent.groups[-1][0] - started
    assert sent.titles() == [["idle 1"], ["gpu-h100-03: quarantine applied"]]
    print(f"the page went out after {took:.2f}s (critical_wait 0.5s, digest 1h)")
    assert not any(f.done() for f in later)  # the 20 info notices still wait for the digest
    assert grouper.waiting == 20
    await grouper.close(1.0)
    assert sent.titles()[-1] == [f"idle {i}" for i in range(2, 22)]


async def test_critical_notices_group_with_their_own_topics_a_storm_is_one_page() -> None:
    sent = Sent()
    grouper = Grouper(grouping(critical_wait="0.3s"), RateLimitSettings(), sent)
    route = Route(name="oncall", channels=["outbox"])
    a = "gpu-health/node/gpu-a"
    entries = [
        notice("gpu-a quarantined", Severity.CRITICAL, node="gpu-a", incident=a),
        notice(
            "gpu-b quarantined", Severity.CRITICAL, node="gpu-b", incident="gpu-health/node/gpu-b"
        ),
        notice("gpu-a drain incomplete", Severity.CRITICAL, node="gpu-a", incident=a),
        notice("pod isolated", Severity.CRITICAL, node="gpu-c", topic="security"),
        notice("gpu-a release pending", Severity.WARNING, node="gpu-a", incident=a),
    ]
    waits = [asyncio.ensure_future(grouper.add(route, None, e)) for e in entries]
    async with asyncio.timeout(2):
        await asyncio.gather(*waits[:4])
    assert sorted(sent.titles()) == [
        ["gpu-a quarantined", "gpu-b quarantined", "gpu-a drain incomplete"],
        ["pod isolated"],
    ]
    assert not waits[4].done()  # a warning stays in the digest, incident or not
    await grouper.close(1.0)


async def test_a_storms_page_counts_its_decisions_and_the_next_one_is_its_update() -> None:
    sent = Sent()
    grouper = Grouper(
        grouping(critical_wait="0.2s", group_interval="1m"), RateLimitSettings(), sent
    )
    route = Route(name="oncall", channels=["outbox"])
    storm = [
        notice(
            f"gpu-{i}: quarantine applied",
            Severity.CRITICAL,
            node=f"gpu-{i}",
            decision="quarantine applied",
        )
        for i in range(3)
    ] + [
        notice(
            f"gpu-{i}: quarantine refused (circuit_breaker)",
            Severity.CRITICAL,
            node=f"gpu-{i}",
            decision="quarantine refused (circuit_breaker)",
        )
        for i in range(3, 6)
    ]
    async with asyncio.timeout(2):
        await asyncio.gather(*(grouper.add(route, None, e) for e in storm))
    [(_, _, page)] = sent.groups
    assert page.storm is not None and page.storm.pages == 1
    assert page.storm.decisions == {
        "quarantine applied": 3,
        "quarantine refused (circuit_breaker)": 3,
    }
    late = notice(
        "gpu-6: quarantine refused (circuit_breaker)",
        Severity.CRITICAL,
        node="gpu-6",
        decision="quarantine refused (circuit_breaker)",
    )
    async with asyncio.timeout(2):
        await grouper.add(route, None, late)
    update = sent.groups[1][2].storm
    assert update is not None and update.pages == 2 and update.since == page.storm.since
    assert update.decisions["quarantine refused (circuit_breaker)"] == 4
    await grouper.close(1.0)


async def test_a_page_whose_incident_ended_while_it_waited_for_a_token_is_not_sent() -> None:
    sent = Sent()
    limit = RateLimitSettings(per_hour=1, burst=1)
    grouper = Grouper(grouping(critical_wait="0.05s"), limit, sent)
    route = Route(name="oncall", channels=["outbox"])
    async with asyncio.timeout(2):  # the one token
        await grouper.add(route, None, notice("gpu-0 quarantined", Severity.CRITICAL, node="gpu-0"))
    held = asyncio.ensure_future(
        grouper.add(
            route,
            None,
            notice("gpu-5 quarantined", Severity.CRITICAL, node="gpu-5", incident="i/5"),
        )
    )
    await asyncio.sleep(0.2)  # past critical_wait: waiting for a token
    assert not held.done()
    ended = notice("gpu-5 released", Severity.INFO, node="gpu-5", incident="i/5", resolves=True)
    ending = asyncio.ensure_future(grouper.add(route, None, ended))
    await grouper.close(1.0)  # the waiting page leaves
    [(_, _, last)] = [g for g in sent.groups if "gpu-5 quarantined" in g[1]]
    assert last.resolved_first == {last.entries[0].event.id}
    assert last.storm is None  # nothing new in it: not counted as a page of a storm
    await asyncio.gather(held, ending)


async def test_digests_never_spend_the_pages_tokens_and_a_page_storm_becomes_one_message() -> None:
    sent = Sent()
    limit = RateLimitSettings(per_hour=1, burst=2)
    grouper = Grouper(grouping(group_wait="0s", group_interval="0s"), limit, sent)
    route = Route(name="oncall", channels=["outbox"])
    digests = []
    for i in range(3):  # the digest's tokens: two, then it waits an hour
        add = grouper.add(route, None, notice(f"idle {i}", Severity.INFO))
        digests.append(asyncio.ensure_future(add))
        if i < 2:  # each its own digest: sent before the next one comes
            async with asyncio.timeout(2):
                await digests[-1]
    pages = [
        notice(f"gpu-{i} quarantined", Severity.CRITICAL, node=f"gpu-{i}", incident=f"n/{i}")
        for i in range(6)
    ]
    for page in pages[:2]:  # the pages' own two tokens, one page each
        async with asyncio.timeout(2):
            await grouper.add(route, None, page)
    rest = [asyncio.ensure_future(grouper.add(route, None, p)) for p in pages[2:]]
    await asyncio.sleep(0.6)  # past critical_wait: over the limit, they keep collecting
    assert not any(f.done() for f in rest)
    assert sum(f.done() for f in digests) == 2
    await grouper.close(1.0)
    critical = [t for t in sent.titles() if t[0].startswith("gpu-")]
    assert critical[:2] == [["gpu-0 quarantined"], ["gpu-1 quarantined"]]
    assert critical[2:] == [[f"gpu-{i} quarantined" for i in range(2, 6)]]  # one message


async def test_each_users_notices_are_their_own_message_without_an_address() -> None:
    sent = Sent()
    grouper = Grouper(grouping(group_wait="0.05s"), RateLimitSettings(burst=1), sent)
    users = Route(name="users", channels=["outbox"], to_owner=True)
    sessions = [f"user:ml-{n}/{n}-explore-0" for n in ("alice", "bob", "carol", "dave")]
    waits = [
        grouper.add(users, None, notice(f"{s} idle", Severity.WARNING, audience=s))
        for s in sessions
    ]
    async with asyncio.timeout(2):  # one token each: nobody waits for another's
        await asyncio.gather(*waits)
    groups = [g for _, _, g in sent.groups]
    assert sorted(g.who for g in groups) == sorted(sessions)
    assert all(len(g.entries) == 1 and g.personal for g in groups)
    assert {g.addressee for g in groups} >= {
        "the owner of ml-alice/alice-explore-0 (no address on record)"
    }


def test_a_users_notice_takes_only_to_owner_routes_whatever_their_order(tmp_path: Path) -> None:
    path = tmp_path / "routes.yaml"
    path.write_text(
        "routes:\n"
        "  - {name: page, match: {severity: [critical]}, channels: [chat], continue: true}\n"
        "  - {name: users, to_owner: true, match: {audience: [user]}, channels: [mail]}\n"
        "  - {name: oncall, channels: [mail]}\n"
    )
    routes = load_routes(path)
    user = Notification(
        severity=Severity.CRITICAL, topic="security", title="t", audience="user:a/b"
    )
    assert [r.name for r in routes.select(Facts.of(user, Audience.parse(user.audience)))] == [
        "users"
    ]
    oncall = Notification(severity=Severity.CRITICAL, topic="security", title="t")
    assert [r.name for r in routes.select(Facts.of(oncall, Audience("oncall")))] == [
        "page",
        "oncall",
    ]


def test_a_to_owner_route_may_not_send_on_oncalls_channels(tmp_path: Path) -> None:
    path = tmp_path / "routes.yaml"
    path.write_text("routes:\n  - {name: users, to_owner: true, channels: [mail, team-chat]}\n")
    routes = load_routes(path)
    routes.check_personal({"mail": "email", "team-chat": "webhook"})  # a hook may address a user
    with pytest.raises(RoutingError, match=r"route 'users' sends users' notices .* on team-chat"):
        routes.check_personal({"mail": "email", "team-chat": "chat"})


def test_resolving_notices_can_be_routed_apart(tmp_path: Path) -> None:
    path = tmp_path / "routes.yaml"
    path.write_text(
        "routes:\n"
        "  - {name: page, match: {severity: [critical]}, channels: [am], continue: true}\n"
        "  - {name: page-ends, match: {resolves: true}, channels: [am], continue: true}\n"
        "  - {name: oncall, channels: [outbox]}\n"
    )
    routes = load_routes(path)
    release = Notification(severity=Severity.INFO, topic="gpu-health", title="r", resolves=True)
    idle = Notification(severity=Severity.INFO, topic="idle-session", title="i")
    assert [r.name for r in routes.select(Facts.of(release, Audience("oncall")))] == [
        "page-ends",
        "oncall",
    ]
    assert [r.name for r in routes.select(Facts.of(idle, Audience("oncall")))] == ["oncall"]


def test_a_critical_notice_waits_at_most_a_second() -> None:
    assert GroupingSettings().critical_wait.total_seconds() == 0.5
    with pytest.raises(ValidationError, match="at most 1s"):
        GroupingSettings.model_validate({"critical_wait": "2s"})


def test_alertmanager_resolution_keeps_the_alerts_labels() -> None:
    assert matcher("incident", 'a/"b"\\c') == 'incident="a/\\"b\\"\\\\c"'
    active: dict[str, Any] = {
        "labels": {"alertname": "NodewardGpuHealth", "incident": "gpu-health/node/n"},
        "annotations": {"summary": "n quarantined"},
        "startsAt": "2026-11-30T10:00:00Z",
        "endsAt": "2026-11-30T11:00:00Z",
        "status": {"state": "active"},
    }
    now = datetime(2026, 11, 30, 10, 5, tzinfo=UTC)
    assert resolved(active, now) == {
        "labels": active["labels"],
        "annotations": active["annotations"],
        "startsAt": "2026-11-30T10:00:00Z",
        "endsAt": "2026-11-30T10:05:00Z",
    }


def test_pages_have_a_consumer_of_their_own() -> None:
    def of(*subjects: str) -> list[tuple[str, list[str]]]:
        return lanes(NotifierSettings(subjects=list(subjects)))

    assert of("notify.>") == [
        ("notifier-critical", ["notify.critical.>"]),
        ("notifier", ["notify.info.>", "notify.warning.>"]),
    ]
    assert of("notify.*.t-1", "notify.critical.security") == [
        ("notifier-critical", ["notify.critical.t-1", "notify.critical.security"]),
        ("notifier", ["notify.info.t-1", "notify.warning.t-1"]),
    ]
    assert of("notify.warning.power-limit") == [("notifier", ["notify.warning.power-limit"])]
    # Subjects whose severity cannot be told apart: one consumer, as before.
    assert of("notify.>", "alerts.>") == [("notifier", ["notify.>", "alerts.>"])]
