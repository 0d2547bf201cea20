"""The directory's pure mapping: LDAP entries into a namespace's owner, the owner into a
merge patch of only the directory's keys, label values sanitised."""

from __future__ import annotations

import pytest

from schemas.directory import (
    EXPERIMENT,
    GROUP,
    KUBEFLOW_OWNER,
    OWNER,
    OWNER_EMAIL,
    OWNER_GID,
    OWNER_GROUPS,
    OWNER_LEFT,
    OWNER_NAME,
    OWNER_UID,
    SYNCED_AT,
    NamespaceOwner,
)
from services.directory.mapping import (
    BadEntry,
    Group,
    any_of,
    escape,
    group,
    is_label_value,
    label_value,
    left_patch,
    owner,
    person,
    sync_patch,
    wanted,
)
from services.directory.settings import Attributes, DirectorySettings

ATTRS = Attributes()
NOW = "2026-12-06T04:00:00Z"


def alice(**more: list[str]) -> dict[str, list[str]]:
    return {
        "uid": ["alice"],
        "uidNumber": ["10001"],
        "gidNumber": ["5000"],
        "mail": ["alice@example.org"],
        "displayName": ["Alice Liddell"],
        "cn": ["alice"],
        "departmentNumber": ["ATLAS Tile-Cal"],
        **more,
    }


GROUPS = [
    Group("cn=physics", "physics", 5000, frozenset()),
    Group("cn=gpu-users", "gpu-users", 5100, frozenset({"alice", "bob"})),
    Group("cn=admins", "admins", 5200, frozenset({"bob"})),
]


def test_person_reads_attributes_case_insensitively() -> None:
    entry = {k.upper(): v for k, v in alice().items()}
    found = person("uid=alice,ou=people", entry, ATTRS)
    assert (found.login, found.uid, found.gid) == ("alice", 10001, 5000)
    assert found.mail == "alice@example.org" and found.name == "Alice Liddell"
    assert found.experiment == "ATLAS Tile-Cal"


def test_display_name_falls_back_to_cn() -> None:
    entry = alice()
    del entry["displayName"]
    assert person("uid=alice", entry, ATTRS).name == "alice"


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({"uidNumber": ["ten"]}, "uidNumber 'ten' is not a number"),
        ({"gidNumber": ["-1"]}, "gidNumber '-1' is not a number"),
        ({"uidNumber": []}, "no uidNumber"),
        ({"uid": []}, "no uid"),
    ],
)
def test_bad_entries_are_refused_with_the_reason(change: dict[str, list[str]], said: str) -> None:
    with pytest.raises(BadEntry, match=said) as caught:
        person("uid=alice,ou=people", alice(**change), ATTRS)
    assert str(caught.value).startswith("uid=alice,ou=people: ")


def test_group_with_bad_gid_is_refused() -> None:
    with pytest.raises(BadEntry, match="gidNumber 'x' is not a number"):
        group("cn=g", {"cn": ["g"], "gidNumber": ["x"]}, ATTRS)
    assert group("cn=g", {"cn": ["g"], "memberUid": ["a", " b "]}, ATTRS).members == {"a", "b"}


def test_owner_primary_group_groups_and_experiment() -> None:
    found = owner(person("uid=alice", alice(), ATTRS), GROUPS)
    assert found.login == "alice" and found.uid == 10001 and found.gid == 5000
    assert found.group == "physics"
    assert found.groups == {"physics": 5000, "gpu-users": 5100}
    assert found.experiment == "atlas-tile-cal"


def test_experiment_from_egroups_when_the_attribute_has_none() -> None:
    entry = alice()
    del entry["departmentNumber"]
    egroups = [
        Group("cn=zz", "ZZ Top", 1, frozenset({"alice"})),
        Group("cn=cms", "CMS Ecal", 2, frozenset({"alice"})),
        Group("cn=lhcb", "LHCb", 3, frozenset({"bob"})),
    ]
    assert owner(person("uid=alice", entry, ATTRS), GROUPS, egroups).experiment == "cms-ecal"
    assert owner(person("uid=alice", entry, ATTRS), GROUPS).experiment is None


@pytest.mark.parametrize(
    ("raw", "label"),
    [
        ("ATLAS", "atlas"),
        ("CMS / Tracker", "cms-tracker"),
        ("Ångström Lab", "angstrom-lab"),
        ("--x--", "x"),
        ("a_b.c", "a_b.c"),
        ("***", None),
        ("", None),
        (None, None),
    ],
)
def test_label_values_are_sanitised(raw: str | None, label: str | None) -> None:
    assert label_value(raw) == label
    if label is not None:
        assert is_label_value(label)


def test_long_label_values_stay_distinct_and_valid() -> None:
    one, two = label_value("x" * 80 + "1"), label_value("x" * 80 + "2")
    assert one and two and one != two
    assert len(one) <= 63 and is_label_value(one) and is_label_value(two)


def test_filter_values_are_escaped() -> None:
    assert escape("a*(b)\\") == "a\\2a\\28b\\29\\5c"
    assert any_of("(objectClass=posixAccount)", "uid", ["b", "a*", "b"]) == (
        "(&(objectClass=posixAccount)(|(uid=a\\2a)(uid=b)))"
    )


def test_wanted_label_wins_over_kubeflow_annotation() -> None:
    assert wanted({}, {}) is None
    assert wanted({OWNER: "alice"}, {KUBEFLOW_OWNER: "x@y"}).key() == "uid:alice"  # type: ignore[union-attr]
    by_mail = wanted({}, {KUBEFLOW_OWNER: "Alice@Example.org"})
    assert by_mail is not None and by_mail.key() == "mail:alice@example.org"


def test_sync_patch_touches_only_the_directory_keys_and_only_changes() -> None:
    found = owner(person("uid=alice", alice(), ATTRS), GROUPS)
    labels = {OWNER: "alice", "team": "vision", EXPERIMENT: "old"}
    annotations = {"note": "keep", OWNER_LEFT: NOW}
    patch = sync_patch(labels, annotations, found, now=NOW)
    assert patch.labels == {
        OWNER_UID: "10001",
        OWNER_GID: "5000",
        GROUP: "physics",
        EXPERIMENT: "atlas-tile-cal",
    }
    assert patch.annotations == {
        OWNER_EMAIL: "alice@example.org",
        OWNER_NAME: "Alice Liddell",
        OWNER_GROUPS: "gpu-users=5100,physics=5000",
        OWNER_LEFT: None,
        SYNCED_AT: NOW,
    }
    # Applied, nothing more to do; read back, the same owner.
    labels |= {k: v for k, v in patch.labels.items() if v is not None}
    annotations = {k: v for k, v in (annotations | patch.annotations).items() if v is not None}
    assert not sync_patch(labels, annotations, found, now="later")
    assert NamespaceOwner.of(labels, annotations) == found
    assert labels["team"] == "vision" and annotations["note"] == "keep"


def test_sync_patch_writes_the_login_back_and_removes_what_the_directory_lost() -> None:
    entry = alice()
    del entry["departmentNumber"]
    found = owner(person("uid=alice", entry, ATTRS), GROUPS)
    patch = sync_patch({EXPERIMENT: "atlas"}, {KUBEFLOW_OWNER: "alice@example.org"}, found, now=NOW)
    assert patch.labels[OWNER] == "alice"
    assert patch.labels[EXPERIMENT] is None
    assert OWNER not in sync_patch({OWNER: "alice"}, {}, found, now=NOW).labels


def test_left_patch_flags_once() -> None:
    assert left_patch({}, now=NOW).annotations == {OWNER_LEFT: NOW}
    assert not left_patch({OWNER_LEFT: "earlier"}, now=NOW)


def test_settings_refuse_bad_tls_combinations() -> None:
    with pytest.raises(ValueError, match="ldap:// or ldaps://"):
        DirectorySettings(url="http://x")
    with pytest.raises(ValueError, match="starttls is for ldap://"):
        DirectorySettings(url="ldaps://x", starttls=True)
    with pytest.raises(ValueError, match="bind_password_file"):
        DirectorySettings(url="ldap://x", bind_dn="cn=x")
