"""The notifier's pure logic: routing, audiences, folding, dedup, rate limits, grouping, retries."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from schemas import make_event
from schemas.notify import Notification, Severity
from services.notifier.channels import (
    Attempted,
    ChannelError,
    Outgoing,
    PermanentChannelError,
    RetrySettings,
    alertname,
    deliver,
)
from services.notifier.grouping import (
    Entry,
    Group,
    Grouper,
    GroupingSettings,
    RateLimitSettings,
    RecentSends,
    TokenBucket,
    fold,
)
from services.notifier.owners import DirectoryError, load_directory
from services.notifier.render import Rendered, TemplateConfigError, Templates
from services.notifier.routing import (
    Audience,
    AudienceError,
    Facts,
    Route,
    RoutingError,
    load_routes,
)
from tests.conftest import wait_for
from tests.helpers.notices import note


def facts(n: Notification) -> Facts:
    return Facts.of(n, Audience.parse(n.audience))


ROUTES = """
routes:
  - name: users
    match: {audience: [user]}
    to_owner: true
    channels: [mail]
  - name: vision-nodes
    match: {node: ["gpu-h100-*"], severity: [critical]}
    channels: [pager]
    continue: true
  - name: team-ns
    match: {namespace: ["ml-*"], topic: ["sec*"]}
    channels: [chat]
  - name: rest
    channels: [outbox]
"""


def routes_file(tmp_path: Path, text: str = ROUTES) -> Path:
    path = tmp_path / "routes.yaml"
    path.write_text(text)
    return path


def test_routes_choose_channels_by_severity_topic_namespace_node_and_audience(
    tmp_path: Path,
) -> None:
    routes = load_routes(routes_file(tmp_path))
    routes.check({"mail", "pager", "chat", "outbox"})

    def names(n: Notification) -> list[str]:
        return [r.name for r in routes.select(facts(n))]

    assert names(note(node="gpu-h100-03")) == ["vision-nodes", "rest"]  # continue: true
    assert names(note(node="gpu-h100-03", severity=Severity.WARNING)) == ["rest"]
    assert names(note(node="gpu-a100-01")) == ["rest"]
    assert names(note(topic="security", namespace="ml-vision")) == ["team-ns"]
    assert names(note(topic="security", namespace="other")) == ["rest"]
    assert names(note(audience="user:ml-vision/jupyter-0")) == ["users"]


def test_shipped_routes_load_and_catch_everything() -> None:
    routes = load_routes()
    routes.check({"outbox"})
    assert [r.name for r in routes.select(facts(note()))] == ["oncall"]
    assert [r.name for r in routes.select(facts(note(audience="user:a/b")))] == ["users"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("routes: [", "is not valid YAML"),
        ("routes: []", "routes: List should have at least 1 item"),
        ("routes: [{name: a, channels: [x], colour: red}]", "colour: Extra inputs"),
        ("routes: [{name: 'a b', channels: [outbox]}]", "route names are letters"),
    ],
)
def test_bad_routes_files_are_one_line(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(RoutingError) as info:
        load_routes(routes_file(tmp_path, text))
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_routes_naming_unknown_channels_are_refused(tmp_path: Path) -> None:
    routes = load_routes(routes_file(tmp_path))
    with pytest.raises(
        RoutingError, match=r"route 'vision-nodes' names unknown channel\(s\) pager"
    ):
        routes.check({"mail", "outbox"})


@pytest.mark.parametrize("text", ["", "user:", "user:ns", "user:/x", "user:a/b/c", "team"])
def test_bad_audiences(text: str) -> None:
    with pytest.raises(AudienceError):
        Audience.parse(text)


def test_audiences() -> None:
    assert Audience.parse("oncall") == Audience("oncall")
    assert Audience.parse("user:ml/jupyter-0") == Audience("user", "ml", "jupyter-0")
    assert str(Audience.parse("user:ml/jupyter-0")) == "user:ml/jupyter-0"


def test_owner_directory(tmp_path: Path) -> None:
    path = tmp_path / "owners.yaml"
    path.write_text("ml-a: a@example.org\nml-b: b@example.org\n")
    assert load_directory(path) == {"ml-a": "a@example.org", "ml-b": "b@example.org"}
    assert load_directory(None) == {}
    path.write_text("- a\n")
    with pytest.raises(DirectoryError, match="must map namespace names"):
        load_directory(path)


def sending(flushed: list[Group]) -> Callable[[Group], Awaitable[None]]:
    """A flush that keeps each group in `flushed` and sends every entry on its channels."""

    async def flush(group: Group) -> None:
        flushed.append(group)
        for e in group.entries:
            e.done.set_result(dict.fromkeys(e.channels, "sent"))

    return flush


async def entry(n: Notification, channels: tuple[str, ...] = ("outbox",)) -> Entry:
    return Entry(make_event(n, source="test"), Audience.parse(n.audience), channels)


async def test_fold_groups_repeats_by_dedup_key_and_title() -> None:
    entries = [
        await entry(note("a applied", dedup_key="q/a")),
        await entry(note("b applied", dedup_key="q/b")),
        await entry(note("a applied", dedup_key="q/a")),
        await entry(note("a skipped", dedup_key="q/a")),  # same key, says something else
        await entry(note("no key")),
        await entry(note("no key")),  # without a key, each notice is its own line
    ]
    items = fold(entries)
    assert [(i.note.title, i.count) for i in items] == [
        ("a applied", 2),
        ("b applied", 1),
        ("a skipped", 1),
        ("no key", 1),
        ("no key", 1),
    ]


def test_recent_sends_recognise_a_repeat_only_within_the_window() -> None:
    now = [0.0]
    recent = RecentSends(600, clock=lambda: now[0])
    first = note("gpu-1 quarantined", dedup_key="q/gpu-1", body="xid 79")
    recent.sent("oncall", first, "ev-1")
    assert recent.repeat_of("oncall", first) == "ev-1"
    assert recent.repeat_of("other-route", first) is None
    changed = note("gpu-1 quarantined", dedup_key="q/gpu-1", body="xid 48")
    assert recent.repeat_of("oncall", changed) is None
    now[0] = 601
    assert recent.repeat_of("oncall", first) is None


def test_token_bucket() -> None:
    bucket = TokenBucket(RateLimitSettings(per_hour=3600, burst=2), now=0.0)
    assert bucket.wait_time(0.0) == 0
    bucket.take()
    bucket.take()
    assert bucket.wait_time(0.0) == pytest.approx(1.0)
    assert bucket.wait_time(0.5) == pytest.approx(0.5)
    assert bucket.wait_time(1.0) == 0


def fast(**grouping: Any) -> GroupingSettings:
    return GroupingSettings.model_validate(
        {"group_wait": "0.05s", "group_interval": "0s", "dedup_window": "0s"} | grouping
    )


async def test_grouper_sends_one_group_per_route_and_recipient() -> None:
    flushed: list[Group] = []
    flush = sending(flushed)

    grouper = Grouper(fast(), RateLimitSettings(per_hour=1000, burst=100), flush)
    a, b = Route(name="a", channels=["outbox"]), Route(name="b", channels=["outbox"])
    waits = [grouper.add(a, None, await entry(note(f"n{i}"))) for i in range(50)]
    waits += [grouper.add(b, None, await entry(note(f"m{i}"))) for i in range(10)]
    waits += [grouper.add(b, "x@example.org", await entry(note("for x")))]
    results = await asyncio.gather(*waits)
    assert all(r == {"outbox": "sent"} for r in results)
    assert sorted((g.route.name, g.recipient or "", len(g.entries)) for g in flushed) == [
        ("a", "", 50),
        ("b", "", 10),
        ("b", "x@example.org", 1),
    ]


async def test_grouper_joins_a_redelivery_to_the_pending_notice() -> None:
    flushed: list[Group] = []
    flush = sending(flushed)

    grouper = Grouper(fast(), RateLimitSettings(), flush)
    route = Route(name="a", channels=["outbox"])
    first = await entry(note("n"))
    again = Entry(first.event, first.audience, first.channels)
    results = await asyncio.gather(grouper.add(route, None, first), grouper.add(route, None, again))
    assert results == [{"outbox": "sent"}] * 2
    assert [len(g.entries) for g in flushed] == [1]


async def test_rate_limited_recipient_keeps_collecting_until_a_token_is_free() -> None:
    flushed: list[Group] = []
    flush = sending(flushed)

    # One message, then one more every 0.5 s (7200 an hour).
    grouper = Grouper(fast(), RateLimitSettings(per_hour=7200, burst=1), flush)
    route = Route(name="a", channels=["outbox"])
    await grouper.add(route, "u@example.org", await entry(note("first")))
    later = [grouper.add(route, "u@example.org", await entry(note(f"n{i}"))) for i in range(5)]
    started = asyncio.get_running_loop().time()
    await asyncio.gather(*later)
    assert [len(g.entries) for g in flushed] == [1, 5]  # the five waited for the token together
    assert asyncio.get_running_loop().time() - started >= 0.3


async def test_a_failing_flush_fails_its_entries_for_redelivery() -> None:
    async def flush(group: Group) -> None:
        raise RuntimeError("boom")

    grouper = Grouper(fast(), RateLimitSettings(), flush)
    with pytest.raises(Exception, match="not settled"):
        await grouper.add(Route(name="a", channels=["outbox"]), None, await entry(note("n")))


async def test_close_sends_open_groups_at_once() -> None:
    flushed: list[Group] = []
    flush = sending(flushed)

    grouper = Grouper(fast(group_wait="1h"), RateLimitSettings(), flush)
    route = Route(name="a", channels=["outbox"])
    waiting = asyncio.ensure_future(grouper.add(route, None, await entry(note("n"))))
    await wait_for(lambda: grouper.waiting == 1, timeout=2, what="the notice held in its group")
    assert not waiting.done()
    await grouper.close(2.0)
    assert await waiting == {"outbox": "sent"}


class Flaky:
    name = "flaky"
    external = True

    def __init__(self, failures: int, permanent: bool = False) -> None:
        self.failures = failures
        self.permanent = permanent
        self.calls = 0

    async def send(self, out: Outgoing) -> None:
        self.calls += 1
        if self.calls <= self.failures:
            raise (PermanentChannelError if self.permanent else ChannelError)("down")


OUT = Outgoing("r", None, False, Severity.INFO, [], Rendered("s", "t"), "c", False)


async def test_deliver_retries_with_exponential_back_off() -> None:
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    retry = RetrySettings(attempts=5, initial="1s", max="5s")  # type: ignore[arg-type]
    assert await deliver(Flaky(3), OUT, retry, sleep=sleep) == Attempted(True, 4)
    assert slept == [1.0, 2.0, 4.0]
    slept.clear()
    failures: list[tuple[int, str, bool]] = []
    result = await deliver(
        Flaky(10), OUT, retry, sleep=sleep, on_failure=lambda *a: failures.append(a)
    )
    assert result == Attempted(False, 5, "down")
    assert slept == [1.0, 2.0, 4.0, 5.0]
    assert len(failures) == 5
    permanent = await deliver(Flaky(10, permanent=True), OUT, retry, sleep=sleep)
    assert permanent == Attempted(False, 1, "down", permanent=True)


def test_alertname() -> None:
    assert alertname("gpu-health") == "NodewardGpuHealth"
    assert alertname("idle_session") == "NodewardIdleSession"


async def test_templates_check_and_a_broken_replacement(tmp_path: Path) -> None:
    await Templates().check()
    (tmp_path / "chat.md.j2").write_text("{{ items[0].nope.title }}")
    with pytest.raises(TemplateConfigError, match=r"template chat.md.j2 \(from .*\):"):
        await Templates(tmp_path).check()
    with pytest.raises(TemplateConfigError, match="is not a directory"):
        Templates(tmp_path / "missing")


def test_settled_marks_keep_to_kv_key_characters() -> None:
    from services.notifier.state import SETTLED

    assert SETTLED.key("01a228f2-9ea8-7a77", "oncall") == "ev.01a228f2-9ea8-7a77.oncall"
    odd = SETTLED.key("id with spaces/and.dots*", "oncall")
    assert odd.startswith("ev.h-") and odd.endswith(".oncall") and " " not in odd


async def test_a_full_house_sends_every_open_group_at_once() -> None:
    flushed: list[Group] = []
    flush = sending(flushed)

    grouper = Grouper(fast(group_wait="1h"), RateLimitSettings(), flush, capacity=5)
    a, b = Route(name="a", channels=["outbox"]), Route(name="b", channels=["outbox"])
    waits = [grouper.add(a, None, await entry(note(f"n{i}"))) for i in range(4)]
    waits.append(grouper.add(b, None, await entry(note("fifth"))))
    async with asyncio.timeout(5):
        await asyncio.gather(*waits)
    assert sorted(len(g.entries) for g in flushed) == [1, 4]
