"""`services.directory` in the config file: where the LDAP directory is, how to bind, where
its users and groups are and which attributes say what."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from pydantic import Field, model_validator

from nodeward.config import Section
from nodeward.durations import Duration

NAME = "directory"
TOPIC = "directory"


class Attributes(Section):
    """The LDAP attribute names the directory reads (RFC 2307 / inetOrgPerson by default)."""

    login: str = "uid"
    uid: str = "uidNumber"
    gid: str = "gidNumber"
    mail: str = "mail"
    name: list[str] = Field(default_factory=lambda: ["displayName", "cn"], min_length=1)
    """the display name: the first of these the entry has"""
    experiment: str | None = "departmentNumber"
    """the user attribute naming the owner's experiment (e-group); None: only e-groups"""
    group_name: str = "cn"
    group_gid: str = "gidNumber"
    group_members: str = "memberUid"


class DirectorySettings(Section):
    """`services.directory` in the config file. Without `url` the service does nothing."""

    url: str | None = None
    """ldap://host:389 or ldaps://host:636; unset: the service runs idle (nothing to sync)"""
    starttls: bool = False
    """StartTLS on an ldap:// URL (refused with ldaps://)"""
    ca_file: Path | None = None
    """the CA bundle the server's certificate must chain to; the system's if unset"""
    bind_dn: str | None = None
    """the DN to bind as; anonymous if unset"""
    bind_password_file: Path | None = None
    """the bind password, a file (the chart mounts it from a Secret); read at each bind"""
    user_base: str = ""
    user_filter: str = "(objectClass=posixAccount)"
    group_base: str = ""
    group_filter: str = "(objectClass=posixGroup)"
    experiment_group_base: str | None = None
    """an e-group OU: the owner's experiment is the first (by name) of the groups there
    they are a member of, where the `attributes.experiment` attribute gives none"""
    attributes: Attributes = Field(default_factory=Attributes)
    page_size: int = Field(default=200, ge=1)
    """entries per page of a paged search (RFC 2696)"""
    batch: int = Field(default=100, ge=1)
    """owners looked up per search"""
    namespace_selector: str | None = None
    """a label selector narrowing the namespaces synced (every namespace naming an owner if unset)"""
    interval: Duration = timedelta(minutes=10)
    """how often every namespace is synced (a new one at once)"""
    timeout: Duration = timedelta(seconds=30)
    """per LDAP operation (connect, bind, each page)"""
    dry_run: bool = False
    """write nothing to the namespaces and tell no one: what would be written, and an
    owner who would be flagged as gone, are logged (`directory.would_write`,
    `directory.would_flag`)"""
    retry_initial: Duration = timedelta(seconds=1)
    retry_max: Duration = timedelta(minutes=5)
    """an LDAP server down is retried after retry_initial, doubling up to this"""

    @model_validator(mode="after")
    def _tls(self) -> DirectorySettings:
        if self.url is not None:
            scheme = self.url.partition("://")[0].lower()
            if scheme not in ("ldap", "ldaps"):
                raise ValueError(f"url must be ldap:// or ldaps://, not {self.url!r}")
            if self.starttls and scheme == "ldaps":
                raise ValueError("starttls is for ldap:// URLs; ldaps:// is TLS already")
        if self.bind_dn and self.bind_password_file is None:
            raise ValueError("bind_dn needs bind_password_file")
        return self
