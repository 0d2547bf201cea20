"""A user namespace's owner as the directory service keeps it on the namespace, and the
labels by which a namespace and a pod opt in or out of the admission webhook.

The directory service (services/directory) writes these; the admission webhook
(services/admission), the notifier and the accounting report read them. A namespace names its
owner either with the label `nodeward.io/owner=<login>` or, as Kubeflow's profile controller
does, with the annotation `owner=<mail>`; everything else here is written by the directory.
"""

from __future__ import annotations

from collections.abc import Mapping

from schemas.base import Model

# What a namespace says itself (written by people or Kubeflow, read by the directory).
OWNER = "nodeward.io/owner"
"""label: the owner's login (`uid` in LDAP); written back by the directory when it found the
owner by mail"""
KUBEFLOW_OWNER = "owner"
"""annotation: the owner's mail, as Kubeflow's profile controller sets it"""

# What the directory writes on the namespace.
OWNER_UID = "nodeward.io/owner-uid"
"""label: the owner's uidNumber"""
OWNER_GID = "nodeward.io/owner-gid"
"""label: the owner's gidNumber (primary group)"""
GROUP = "nodeward.io/group"
"""label: the owner's primary group's name (`cn` of its posixGroup)"""
EXPERIMENT = "nodeward.io/experiment"
"""label: the owner's experiment / e-group (a configurable LDAP attribute), label-safe"""
OWNER_EMAIL = "nodeward.io/owner-email"
"""annotation: the owner's mail (the notifier's address for the namespace)"""
OWNER_NAME = "nodeward.io/owner-name"
"""annotation: the owner's display name"""
OWNER_GROUPS = "nodeward.io/owner-groups"
"""annotation: every group the owner is in, `name=gidNumber` comma-separated, by name"""
SYNCED_AT = "nodeward.io/directory-synced-at"
"""annotation: when the directory last wrote the owner (RFC 3339)"""
OWNER_LEFT = "nodeward.io/owner-left"
"""annotation: when the directory first found the owner gone (RFC 3339); removed on return"""

DIRECTORY_LABELS = (OWNER_UID, OWNER_GID, GROUP, EXPERIMENT)
"""the labels the directory owns on a namespace (it writes `OWNER` only where it is missing)"""
DIRECTORY_ANNOTATIONS = (OWNER_EMAIL, OWNER_NAME, OWNER_GROUPS, SYNCED_AT, OWNER_LEFT)
"""the annotations the directory owns on a namespace"""

# The admission webhook's opt-in (namespace) and opt-out (pod).
ADMISSION = "nodeward.io/admission"
"""label: `enabled` on a namespace opts its pods in; `disabled` on a pod opts it out"""
ENABLED = "enabled"
DISABLED = "disabled"


class NamespaceOwner(Model):
    """The owner the directory recorded on a namespace (None where it recorded nothing)."""

    login: str | None = None
    uid: int | None = None
    gid: int | None = None
    group: str | None = None
    experiment: str | None = None
    email: str | None = None
    name: str | None = None
    groups: dict[str, int] = {}
    """every group, name -> gidNumber"""
    left: str | None = None

    @classmethod
    def of(cls, labels: Mapping[str, str], annotations: Mapping[str, str]) -> NamespaceOwner:
        """Read from a namespace's labels and annotations; malformed numbers are left out."""
        groups: dict[str, int] = {}
        for part in (annotations.get(OWNER_GROUPS) or "").split(","):
            name, _, number = part.strip().partition("=")
            if name and number.isdigit():
                groups[name] = int(number)
        return cls(
            login=labels.get(OWNER) or None,
            uid=_number(labels.get(OWNER_UID)),
            gid=_number(labels.get(OWNER_GID)),
            group=labels.get(GROUP) or None,
            experiment=labels.get(EXPERIMENT) or None,
            email=annotations.get(OWNER_EMAIL) or None,
            name=annotations.get(OWNER_NAME) or None,
            groups=groups,
            left=annotations.get(OWNER_LEFT) or None,
        )

    def labels(self) -> dict[str, str | None]:
        """The directory's labels for this owner (None: a label to remove); `OWNER` only
        with a login. Values must already be valid label values."""
        written: dict[str, str | None] = {
            OWNER_UID: _text(self.uid),
            OWNER_GID: _text(self.gid),
            GROUP: self.group,
            EXPERIMENT: self.experiment,
        }
        if self.login:
            written[OWNER] = self.login
        return written

    def annotations(self) -> dict[str, str | None]:
        """The directory's annotations for this owner (None: one to remove); `SYNCED_AT`
        and `OWNER_LEFT` are the sync's own."""
        return {
            OWNER_EMAIL: self.email,
            OWNER_NAME: self.name,
            OWNER_GROUPS: self.groups_annotation() or None,
        }

    def groups_annotation(self) -> str:
        """`OWNER_GROUPS`'s value for these groups."""
        return ",".join(f"{name}={gid}" for name, gid in sorted(self.groups.items()))


def _text(value: int | None) -> str | None:
    return None if value is None else str(value)


def _number(value: str | None) -> int | None:
    return int(value) if value is not None and value.isdigit() else None
