"""The LDAP directory read with bonsai (asyncio, over OpenLDAP's libldap): one connection
per pass, bound as `bind_dn` (its password read from its file at each bind), TLS by
ldaps:// or StartTLS against `ca_file`, every search paged (RFC 2696).

Only the daemon imports this module (`services.directory.service` at setup): bonsai is the
`ldap` extra, and a missing bonsai stops the service's start in one line, nothing else.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import bonsai

from services.directory.mapping import (
    BadEntry,
    Entry,
    Group,
    Person,
    Wanted,
    any_of,
    escape,
    group,
    person,
)
from services.directory.settings import DirectorySettings

T = TypeVar("T")


class DirectoryError(Exception):
    """The directory could not be read (unreachable, bind refused, TLS, a failed search); one
    line. `cause`: `unreachable`, `bind`, `tls`, `search` or `config`."""

    def __init__(self, cause: str, message: str) -> None:
        super().__init__(" ".join(message.split()))
        self.cause = cause


@dataclass
class Lookup:
    """What one pass found for the owners it asked about."""

    by_login: dict[str, Person] = field(default_factory=dict)
    by_mail: dict[str, Person] = field(default_factory=dict)
    bad: dict[str, str] = field(default_factory=dict)
    """a wanted key (`uid:x`, `mail:y`) -> why its entry was skipped"""
    groups: list[Group] = field(default_factory=list)
    egroups: list[Group] = field(default_factory=list)
    bad_groups: list[str] = field(default_factory=list)

    def find(self, who: Wanted) -> Person | None:
        if who.login:
            return self.by_login.get(who.login)
        return self.by_mail.get((who.mail or "").lower())


def _chunks(values: Sequence[T], size: int) -> Iterable[Sequence[T]]:
    for start in range(0, len(values), size):
        yield values[start : start + size]


def _entry(found: Any) -> tuple[str, Entry]:
    """bonsai's entry as (dn, attribute -> string values); bonsai turns numbers into ints,
    so every value is made a string again for the mapping to judge."""
    values = {
        str(k): [v.decode(errors="replace") if isinstance(v, bytes) else str(v) for v in vs]
        for k, vs in dict(found).items()
        if str(k).lower() != "dn"
    }
    return str(found.dn), values


class Directory:
    """Reads the owners the namespaces name, their groups and e-groups."""

    def __init__(self, settings: DirectorySettings) -> None:
        if settings.url is None:
            raise DirectoryError("config", "services.directory.url is not set")
        self.settings = settings
        self.url: str = settings.url

    def _client(self) -> bonsai.LDAPClient:
        s = self.settings
        client = bonsai.LDAPClient(self.url, tls=s.starttls)
        if s.ca_file is not None:
            client.set_ca_cert(str(s.ca_file))
        client.set_cert_policy("demand")
        client.set_auto_page_acquire(True)
        client.set_server_chase_referrals(False)
        if s.bind_dn:
            client.set_credentials("SIMPLE", user=s.bind_dn, password=self._password())
        return client

    def _password(self) -> str:
        path = self.settings.bind_password_file
        if path is None:
            raise DirectoryError("config", "bind_dn is set but bind_password_file is not")
        try:
            return path.read_text().rstrip("\r\n")
        except OSError as exc:
            raise DirectoryError(
                "config", f"cannot read the bind password file {path}: {exc.strerror}"
            ) from None

    async def lookup(self, wanted: Iterable[Wanted]) -> Lookup:
        """Every wanted owner's entry, their groups and e-groups, over one connection.
        `DirectoryError` if the directory cannot be read; a bad entry is in `bad`."""
        s, attrs = self.settings, self.settings.attributes
        wanted = list(wanted)
        logins = sorted({w.login for w in wanted if w.login})
        mails = sorted({(w.mail or "").lower() for w in wanted if not w.login and w.mail})
        found = Lookup()
        conn = await self._connect()
        try:
            user_attrs = [attrs.login, attrs.uid, attrs.gid, attrs.mail, *attrs.name]
            if attrs.experiment:
                user_attrs.append(attrs.experiment)
            for attribute, values in ((attrs.login, logins), (attrs.mail, mails)):
                for chunk in _chunks(values, s.batch):
                    filter_ = any_of(s.user_filter, attribute, chunk)
                    async for dn, entry in self._search(conn, s.user_base, filter_, user_attrs):
                        self._person(found, dn, entry)
            people = list(
                {p.dn: p for p in (*found.by_login.values(), *found.by_mail.values())}.values()
            )
            group_attrs = [attrs.group_name, attrs.group_gid, attrs.group_members]
            keys = [(attrs.group_members, p.login) for p in people]
            keys += [(attrs.group_gid, str(p.gid)) for p in people]
            seen: set[str] = set()
            for pairs in _chunks(sorted(set(keys)), s.batch):
                alternatives = "".join(f"({a}={escape(v)})" for a, v in pairs)
                filter_ = f"(&{s.group_filter}(|{alternatives}))"
                async for dn, entry in self._search(conn, s.group_base, filter_, group_attrs):
                    if dn not in seen:
                        seen.add(dn)
                        self._group(found.groups, found, dn, entry)
            if s.experiment_group_base:
                members = sorted({p.login for p in people})
                for chunk in _chunks(members, s.batch):
                    filter_ = any_of(s.group_filter, attrs.group_members, chunk)
                    base = s.experiment_group_base
                    async for dn, entry in self._search(conn, base, filter_, group_attrs):
                        self._group(found.egroups, found, dn, entry)
        finally:
            conn.close()
        return found

    def _person(self, found: Lookup, dn: str, entry: Entry) -> None:
        attrs = self.settings.attributes
        try:
            who = person(dn, entry, attrs)
        except BadEntry as exc:
            for key in _keys(entry, attrs.login, attrs.mail):
                found.bad[key] = str(exc)
            return
        found.by_login[who.login] = who
        if who.mail:
            found.by_mail[who.mail.lower()] = who

    def _group(self, into: list[Group], found: Lookup, dn: str, entry: Entry) -> None:
        try:
            into.append(group(dn, entry, self.settings.attributes))
        except BadEntry as exc:
            found.bad_groups.append(str(exc))

    async def _connect(self) -> Any:
        timeout = self.settings.timeout.total_seconds()
        try:
            return await self._client().connect(is_async=True, timeout=timeout)
        except bonsai.AuthenticationError as exc:
            raise DirectoryError(
                "bind",
                f"LDAP bind as {self.settings.bind_dn} to {self.url} refused ({exc}): "
                "check the bind password Secret",
            ) from None
        except (bonsai.ConnectionError, bonsai.TimeoutError) as exc:
            how = "StartTLS" if self.settings.starttls else self.url.partition(":")[0]
            raise DirectoryError(
                "unreachable", f"LDAP server {self.url} not reachable over {how}: {exc}"
            ) from None
        except bonsai.LDAPError as exc:
            cause = "tls" if "tls" in str(exc).lower() or "ssl" in str(exc).lower() else "bind"
            raise DirectoryError(cause, f"LDAP connect to {self.url} failed: {exc}") from None

    async def _search(
        self, conn: Any, base: str, filter_: str, attributes: list[str]
    ) -> AsyncIterator[tuple[str, Entry]]:
        timeout = self.settings.timeout.total_seconds()
        try:
            results = await conn.paged_search(
                base,
                bonsai.LDAPSearchScope.SUBTREE,
                filter_,
                attributes,
                timeout=timeout,
                page_size=self.settings.page_size,
            )
            async for found in results:
                yield _entry(found)
        except bonsai.NoSuchObjectError:
            raise DirectoryError("search", f"LDAP base {base!r} does not exist") from None
        except (bonsai.ConnectionError, bonsai.TimeoutError) as exc:
            raise DirectoryError("unreachable", f"LDAP server {self.url} lost: {exc}") from None
        except bonsai.LDAPError as exc:
            raise DirectoryError("search", f"LDAP search under {base!r} failed: {exc}") from None


def _keys(entry: Entry, login_attr: str, mail_attr: str) -> list[str]:
    """The wanted keys an entry could answer (for a bad entry: whose namespace to skip)."""
    keys = []
    for key, values in entry.items():
        if key.lower() == login_attr.lower():
            keys += [f"uid:{v.strip()}" for v in values]
        elif key.lower() == mail_attr.lower():
            keys += [f"mail:{v.strip().lower()}" for v in values]
    return keys
