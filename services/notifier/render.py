"""Message text from Jinja templates that ship as files a platform team can replace.

The shipped templates live in `services/notifier/templates/`. With `templates_dir` set, a
file of the same name there wins; the others still come from the shipped set. Templates
run in Jinja's sandbox with autoescaping off (the output is plain text or Markdown).

Templates: `subject.txt.j2` (one line), `oncall.txt.j2` and `user.txt.j2` (message text
for on-call and for a session's owner), `chat.md.j2` (chat webhooks). Their context:
`route`, `recipient`, `owner`, `audience` (`oncall`/`user`), `severity`, `notices` (how
many), `items` (each: `note` (the notify.v1 data), `count`, `first_time`, `last_time`,
`event_id`, `node`, `namespace`, `pod`), `subject` (chat), `dry_run`, `support_contact`,
`exempt_label`, `max_lines`, `storm` (a page: `since`, `pages` (this one's number),
`decisions` (each decision said so far, and how often), `topic`; None for a digest);
filters `when` (UTC time) and `relative` ("in 25 minutes").
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from jinja2 import ChoiceLoader, FileSystemLoader, StrictUndefined, TemplateError
from jinja2.sandbox import SandboxedEnvironment

from schemas.base import make_event
from schemas.notify import Notification
from services.notifier.grouping import Entry, Group, Item, fold
from services.notifier.routing import Audience, Route

SHIPPED = Path(__file__).resolve().parent / "templates"
TEMPLATES = ("subject.txt.j2", "oncall.txt.j2", "user.txt.j2", "chat.md.j2")
EXEMPT_LABEL = "nodeward.io/exempt=true"


class TemplateConfigError(ValueError):
    """A template that cannot be loaded or rendered. One line."""


def when(value: datetime | None) -> str:
    if value is None:
        return "unknown"
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def relative(value: datetime | None) -> str:
    if value is None:
        return "unknown"
    seconds = (value - datetime.now(UTC)).total_seconds()
    amount = abs(seconds)
    if amount < 90:
        text = f"{amount:.0f} seconds"
    elif amount < 5400:
        text = f"{amount / 60:.0f} minutes"
    elif amount < 172_800:
        text = f"{amount / 3600:.0f} hours"
    else:
        text = f"{amount / 86400:.0f} days"
    return f"in {text}" if seconds >= 0 else f"{text} ago"


@dataclass(frozen=True)
class Rendered:
    subject: str
    text: str


def _item_context(item: Item) -> dict[str, Any]:
    note = item.note
    entry = item.latest
    node = next((t.name for t in note.targets if t.kind == "Node"), None)
    pod = next((t.name for t in note.targets if t.kind == "Pod"), None)
    namespace = next((t.namespace for t in note.targets if t.namespace), None)
    if entry.audience.kind == "user":
        namespace = namespace or entry.audience.namespace
        pod = pod or entry.audience.name
    return {
        "note": note,
        "count": item.count,
        "first_time": item.first_time,
        "last_time": item.last_time,
        "event_id": entry.event.id,
        "node": node,
        "namespace": namespace,
        "pod": pod,
    }


def _storm(group: Group, items: list[Item]) -> dict[str, Any] | None:
    storm = group.storm
    if storm is None:
        return None
    return {
        "since": storm.since,
        "pages": storm.pages,
        "decisions": sorted(storm.decisions.items(), key=lambda kv: (-kv[1], kv[0])),
        "topic": items[0].note.topic if items else "",
    }


class Templates:
    """Renders a group's messages; every template is checked once at start."""

    def __init__(
        self,
        directory: Path | None = None,
        *,
        support_contact: str = "your platform team",
        max_lines: int = 25,
    ) -> None:
        if directory is not None and not directory.is_dir():
            raise TemplateConfigError(f"templates_dir {directory} is not a directory")
        loaders = [FileSystemLoader(str(directory))] if directory is not None else []
        loaders.append(FileSystemLoader(str(SHIPPED)))
        self.env = SandboxedEnvironment(
            loader=ChoiceLoader(loaders),
            autoescape=False,
            undefined=StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
            keep_trailing_newline=True,
        )
        self.env.filters["when"] = when
        self.env.filters["relative"] = relative
        self.directory = directory
        self.support_contact = support_contact
        self.max_lines = max_lines

    def context(self, group: Group, items: list[Item], *, dry_run: bool) -> dict[str, Any]:
        entries = [e for i in items for e in i.entries]
        user = group.personal  # a user's own notices; on-call's view of them stays on-call's
        return {
            "route": group.route.name,
            "recipient": group.recipient,
            "owner": group.recipient,
            "audience": "user" if user else "oncall",
            "severity": group.severity.value,
            "notices": len(entries),
            "items": [_item_context(i) for i in items],
            "dry_run": dry_run,
            "support_contact": self.support_contact,
            "exempt_label": EXEMPT_LABEL,
            "max_lines": self.max_lines,
            "storm": _storm(group, items),
        }

    def _render(self, name: str, context: dict[str, Any]) -> str:
        try:
            return self.env.get_template(name).render(context)
        except TemplateError as exc:
            where = self.directory or SHIPPED
            raise TemplateConfigError(
                f"template {name} (from {where}): {' '.join(str(exc).split())}"
            ) from None

    def message(self, context: dict[str, Any]) -> Rendered:
        """Subject and text (for mail and the outbox)."""
        subject = " ".join(self._render("subject.txt.j2", context).split())[:250]
        body = "user.txt.j2" if context["audience"] == "user" else "oncall.txt.j2"
        return Rendered(subject, self._render(body, context))

    def chat(self, context: dict[str, Any]) -> str:
        subject = " ".join(self._render("subject.txt.j2", context).split())[:250]
        return self._render("chat.md.j2", {**context, "subject": subject}).strip() + "\n"

    async def check(self) -> None:
        """Render every template with an example notice, so a broken one fails at start."""
        event = make_event(Notification.example(), source="service/notifier")
        for audience in (Audience("oncall"), Audience("user", "ml-team", "jupyter-0")):
            personal = audience.kind == "user"
            group = Group(Route(name="check", channels=["outbox"]), None, 0.0, 0.0, personal)
            group.entries.append(Entry(event, audience, ("outbox",)))
            context = self.context(group, fold(group.entries), dry_run=False)
            self.message(context)
            self.chat(context)
