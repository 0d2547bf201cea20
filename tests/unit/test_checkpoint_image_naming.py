"""Checkpoint image names, tags, retention policy and the registry client's pure parts."""

from __future__ import annotations

import base64
import json
import re
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from services.maintenance.image import (
    ImageRecord,
    ImageSettings,
    archive_time,
    checkpoint_annotations,
    component,
    expired,
    image_ref,
    node_path,
    repository,
    tag,
    tag_time,
)
from services.maintenance.registry import (
    AuthFileError,
    Credentials,
    credentials_for,
    parse_challenge,
    split_reference,
)

# distribution's reference grammar for one path component
COMPONENT = re.compile(r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*")
AT = datetime(2026, 3, 4, 12, 20, 30, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("trainer-0-worker", "trainer-0-worker"),
        ("Trainer_0.Worker", "trainer_0.worker"),
        ("a..b", "a-b"),
        ("a._b", "a-b"),
        ("a__b", "a__b"),
        ("a---b", "a---b"),
        ("-lead.", "lead"),
        ("ns/with:odd@chars", "ns-with-odd-chars"),
        ("___", "x"),
    ],
)
def test_component_is_a_valid_repository_path_component(text: str, expected: str) -> None:
    assert component(text) == expected
    assert COMPONENT.fullmatch(expected)


def test_long_component_is_cut_with_a_hash_of_the_whole() -> None:
    long_a, long_b = "p" * 200 + "a", "p" * 200 + "b"
    a, b = component(long_a), component(long_b)
    assert len(a) <= 96 and COMPONENT.fullmatch(a)
    assert a != b


def test_repository_per_namespace_and_tag_from_the_checkpoint_time() -> None:
    assert repository("reg.example.com/ckpt/", "Team-A", "trainer-0", "worker") == (
        "reg.example.com/ckpt/team-a/trainer-0-worker"
    )
    later = AT.astimezone(timezone(timedelta(hours=2)))
    assert tag(later) == "20260304122030"
    assert image_ref("127.0.0.1:5000", "ns", "p", "c", AT) == "127.0.0.1:5000/ns/p-c:20260304122030"
    with pytest.raises(ValueError, match="timezone"):
        tag(datetime(2026, 3, 4))


def test_tag_time_reads_only_our_tags() -> None:
    assert tag_time("20260304122030") == AT
    assert tag_time("latest") is None
    assert tag_time("20261399000000") is None


def test_archive_time_from_the_kubelet_archive_name() -> None:
    name = "/var/lib/kubelet/checkpoints/checkpoint-p_ns-c-2026-03-04T12:20:30Z.tar"
    assert archive_time(name) == AT
    assert archive_time("checkpoint-p_ns-c-2026-03-04T14:20:30+02:00.tar") == AT
    assert archive_time("checkpoint-p_ns-c.tar") is None


def test_annotations_name_the_container_for_cri_o_and_checkpointctl() -> None:
    notes = checkpoint_annotations("worker", pod="p", namespace="ns", node="n1", image="img:1")
    assert notes["io.kubernetes.cri-o.annotations.checkpoint.name"] == "worker"
    assert notes["org.criu.checkpoint.container.name"] == "worker"
    assert notes["org.criu.checkpoint.pod.namespace"] == "ns"
    assert notes["org.criu.checkpoint.rootfsImageName"] == "img:1"
    assert "org.criu.checkpoint.time" not in notes


def _records(*minutes: int) -> list[ImageRecord]:
    return [ImageRecord(f"t{m}", AT + timedelta(minutes=m)) for m in minutes]


def test_expired_keeps_the_newest() -> None:
    now = AT + timedelta(hours=1)
    records = _records(3, 0, 2, 1)
    assert [r.tag for r in expired(records, 2, None, now)] == ["t0", "t1"]
    assert expired(records, 4, None, now) == []
    assert expired([], 1, timedelta(days=7), now) == []


def test_expired_drops_what_is_older_than_max_age_even_within_keep() -> None:
    records = _records(0, 10, 20)
    now = AT + timedelta(minutes=25)
    assert [r.tag for r in expired(records, 3, timedelta(minutes=10), now)] == ["t0", "t10"]
    assert [r.tag for r in expired(records, 1, timedelta(minutes=30), now)] == ["t0", "t10"]


def test_settings_defaults_and_bounds() -> None:
    settings = ImageSettings()
    assert settings.keep == 3 and settings.max_age == timedelta(days=7)
    assert ImageSettings(max_age="2d").max_age == timedelta(days=2)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="keep"):
        ImageSettings(keep=0)
    assert node_path("/state/nodes/{node}", "n1", "/var/lib/x") == Path("/state/nodes/n1/var/lib/x")


def test_split_reference() -> None:
    assert split_reference("127.0.0.1:5000/a/b:20260304122030") == (
        "127.0.0.1:5000",
        "a/b",
        "20260304122030",
    )
    assert split_reference("docker://reg/a@sha256:ab") == ("reg", "a", "sha256:ab")
    for bad in ("reg", "reg/a", "reg:5000/a"):
        with pytest.raises(ValueError):
            split_reference(bad)


def test_parse_bearer_challenge() -> None:
    scheme, params = parse_challenge(
        'Bearer realm="https://auth.example.com/token",service="registry.example.com",'
        'scope="repository:ns/p-c:pull,push"'
    )
    assert scheme == "bearer"
    assert params == {
        "realm": "https://auth.example.com/token",
        "service": "registry.example.com",
        "scope": "repository:ns/p-c:pull,push",
    }
    assert parse_challenge('Basic realm="nodeward"') == ("basic", {"realm": "nodeward"})


def _authfile(tmp_path: Path, auths: dict[str, object]) -> Path:
    path = tmp_path / "auth.json"
    path.write_text(json.dumps({"auths": auths}))
    return path


def test_credentials_for_the_longest_matching_key(tmp_path: Path) -> None:
    def auth(user: str) -> dict[str, str]:
        return {"auth": base64.b64encode(f"{user}:pw-{user}".encode()).decode()}

    path = _authfile(
        tmp_path,
        {
            "https://reg.example.com/v2/": auth("host"),
            "reg.example.com/ckpt/team-a": auth("team"),
            "other.example.com": {"username": "u", "password": "p"},
        },
    )
    assert credentials_for(path, "reg.example.com", "ckpt/team-a/p-c") == Credentials(
        "team", "pw-team"
    )
    assert credentials_for(path, "reg.example.com", "ckpt/team-b/p-c") == Credentials(
        "host", "pw-host"
    )
    assert credentials_for(path, "other.example.com") == Credentials("u", "p")
    assert credentials_for(path, "nowhere.example.com") is None
    assert "pw-" not in repr(credentials_for(path, "reg.example.com"))


def test_a_bad_authfile_is_refused_without_quoting_it(tmp_path: Path) -> None:
    path = tmp_path / "auth.json"
    path.write_text('{"auths": {"reg": {"auth": "c2VjcmV0LW5vLWNvbG9u"}}}')  # secret-no-colon
    with pytest.raises(AuthFileError) as err:
        credentials_for(path, "reg")
    assert "secret" not in str(err.value)
    path.write_text("not json secret")
    with pytest.raises(AuthFileError, match="not JSON") as err:
        credentials_for(path, "reg")
    assert "secret" not in str(err.value)
