"""Pure: LDAP entries into a namespace's owner, and that owner into the merge patch of the
namespace's labels and annotations (the directory's keys only). No I/O.

Label values are sanitised (`label_value`): a Kubernetes label value is at most 63
characters of `[A-Za-z0-9._-]`, starting and ending alphanumeric. Accents are folded to
ASCII, the value lowercased, every run of other characters made one `-`, the ends
trimmed; a value still longer than 63 keeps its first 54 characters and a `-` and 8 hex
digits of its SHA-256 (distinct names stay distinct). Nothing left: no label.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from schemas.directory import (
    DIRECTORY_LABELS,
    KUBEFLOW_OWNER,
    OWNER,
    OWNER_LEFT,
    SYNCED_AT,
    NamespaceOwner,
)
from services.directory.settings import Attributes

Entry = Mapping[str, Sequence[str]]
"""An LDAP entry's attributes, each with its values (strings)."""

_LABEL = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_NOT_LABEL = re.compile(r"[^a-z0-9._-]+")
MAX_LABEL = 63


class BadEntry(ValueError):
    """An entry that cannot be read (a uidNumber that is not a number, no login): skipped."""


@dataclass(frozen=True)
class Person:
    dn: str
    login: str
    uid: int
    gid: int
    mail: str | None
    name: str | None
    experiment: str | None


@dataclass(frozen=True)
class Group:
    dn: str
    name: str
    gid: int | None
    members: frozenset[str] = field(default_factory=frozenset)


@dataclass(frozen=True)
class Wanted:
    """Whom a namespace names as its owner: a login (label), else a mail (Kubeflow)."""

    login: str | None
    mail: str | None

    def key(self) -> str:
        return f"uid:{self.login}" if self.login else f"mail:{(self.mail or '').lower()}"


@dataclass(frozen=True)
class Patch:
    """What to merge into a namespace's labels and annotations (None removes a key)."""

    labels: dict[str, str | None]
    annotations: dict[str, str | None]

    def __bool__(self) -> bool:
        return bool(self.labels or self.annotations)


def is_label_value(text: str) -> bool:
    return len(text) <= MAX_LABEL and bool(_LABEL.match(text))


def label_value(text: str | None) -> str | None:
    """`text` as a valid label value (see the module's docstring); None if nothing is left."""
    if text is None:
        return None
    folded = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode().lower()
    value = _NOT_LABEL.sub("-", folded).strip("-._")
    if len(value) > MAX_LABEL:
        digest = hashlib.sha256(text.encode()).hexdigest()[:8]
        value = f"{value[:54].rstrip('-._')}-{digest}"
    return value or None


def escape(value: str) -> str:
    """`value` as an RFC 4515 filter assertion value."""
    out = []
    for ch in value:
        if ch in "*()\\\0":
            out.append(f"\\{ord(ch):02x}")
        else:
            out.append(ch)
    return "".join(out)


def any_of(base_filter: str, attribute: str, values: Iterable[str]) -> str:
    """`(&base_filter(|(attribute=v1)(attribute=v2)...))`."""
    alternatives = "".join(f"({attribute}={escape(v)})" for v in sorted(set(values)))
    return f"(&{base_filter}(|{alternatives}))"


def _values(entry: Entry, attribute: str) -> Sequence[str]:
    wanted = attribute.lower()
    for key, values in entry.items():
        if key.lower() == wanted:
            return [str(v) for v in values]
    return []


def _first(entry: Entry, attribute: str) -> str | None:
    values = _values(entry, attribute)
    return values[0].strip() if values and values[0].strip() else None


def _number(entry: Entry, dn: str, attribute: str) -> int | None:
    raw = _first(entry, attribute)
    if raw is None:
        return None
    if not raw.isdigit():
        raise BadEntry(f"{dn}: {attribute} {raw!r} is not a number")
    return int(raw)


def _required(entry: Entry, dn: str, attribute: str) -> int:
    number = _number(entry, dn, attribute)
    if number is None:
        raise BadEntry(f"{dn}: no {attribute}")
    return number


def person(dn: str, entry: Entry, attrs: Attributes) -> Person:
    """A user entry read; `BadEntry` if it has no login or its uid or gid numbers are not numbers."""
    login = _first(entry, attrs.login)
    if login is None:
        raise BadEntry(f"{dn}: no {attrs.login}")
    uid = _required(entry, dn, attrs.uid)
    gid = _required(entry, dn, attrs.gid)
    name = next((v for a in attrs.name if (v := _first(entry, a))), None)
    return Person(
        dn=dn,
        login=login,
        uid=uid,
        gid=gid,
        mail=_first(entry, attrs.mail),
        name=name,
        experiment=_first(entry, attrs.experiment) if attrs.experiment else None,
    )


def group(dn: str, entry: Entry, attrs: Attributes) -> Group:
    """A group entry read; `BadEntry` without a name or with a gidNumber that is no number."""
    name = _first(entry, attrs.group_name)
    if name is None:
        raise BadEntry(f"{dn}: no {attrs.group_name}")
    gid = _number(entry, dn, attrs.group_gid)
    members = frozenset(v.strip() for v in _values(entry, attrs.group_members) if v.strip())
    return Group(dn=dn, name=name, gid=gid, members=members)


def wanted(labels: Mapping[str, str], annotations: Mapping[str, str]) -> Wanted | None:
    """Whom the namespace names as its owner (the label wins over Kubeflow's annotation);
    None for a namespace that names none."""
    login = (labels.get(OWNER) or "").strip() or None
    mail = (annotations.get(KUBEFLOW_OWNER) or "").strip() or None
    if login is None and mail is None:
        return None
    return Wanted(login=login, mail=mail)


def owner(who: Person, groups: Iterable[Group], egroups: Iterable[Group] = ()) -> NamespaceOwner:
    """The owner as the directory writes it: the primary group is the group with the
    person's gidNumber; `groups`, every group the person is in (primary or `memberUid`);
    the experiment, the person's attribute, else the first e-group (by name) they are in.
    Label values sanitised; a login that is no label value is not written back."""
    mine = {g.name: g for g in groups if g.gid == who.gid or who.login in g.members}
    primary = next((g for g in mine.values() if g.gid == who.gid), None)
    experiment = who.experiment or next(
        (g.name for g in sorted(egroups, key=lambda g: g.name) if who.login in g.members), None
    )
    listed = {
        name: g.gid for name, g in mine.items() if g.gid is not None and not set(name) & set(",=")
    }
    return NamespaceOwner(
        login=who.login if is_label_value(who.login) else None,
        uid=who.uid,
        gid=who.gid,
        group=label_value(primary.name) if primary else None,
        experiment=label_value(experiment),
        email=who.mail,
        name=who.name,
        groups=listed,
    )


def sync_patch(
    labels: Mapping[str, str], annotations: Mapping[str, str], found: NamespaceOwner, *, now: str
) -> Patch:
    """The merge patch that makes the namespace show `found`: only the directory's keys,
    only those that change (`SYNCED_AT` with them), `OWNER_LEFT` removed. The owner label
    is written only where the namespace has none (found by Kubeflow's mail)."""
    want_labels = {k: v for k, v in found.labels().items() if k in DIRECTORY_LABELS}
    if not labels.get(OWNER) and found.login:
        want_labels[OWNER] = found.login
    want_annotations = {**found.annotations(), OWNER_LEFT: None}
    patch = Patch(_changes(labels, want_labels), _changes(annotations, want_annotations))
    if patch:
        patch.annotations[SYNCED_AT] = now
    return patch


def left_patch(annotations: Mapping[str, str], *, now: str) -> Patch:
    """Flag the owner gone (`OWNER_LEFT`, first time only); every other key stays as the
    directory last wrote it."""
    if annotations.get(OWNER_LEFT):
        return Patch({}, {})
    return Patch({}, {OWNER_LEFT: now})


def _changes(current: Mapping[str, str], want: Mapping[str, str | None]) -> dict[str, str | None]:
    return {
        k: v for k, v in want.items() if current.get(k) != v and (v is not None or k in current)
    }
