"""The auth callout's pure parts: NATS JWTs as nats-io/jwt makes them, and which grants a
ServiceAccount token gets (tests/integration/test_auth_callout.py runs it against a real
nats-server and the sim cluster's TokenReview)."""

from __future__ import annotations

import base64
import json
import os
import time
from typing import Any

import nkeys
import pytest

from launch.access import AGENT_GRANTS, GRANTS, READERS
from nodeward.bus.token import expiry
from nodeward.callout import identities, jwt, xkey
from nodeward.callout.identities import (
    NODE_NAME,
    POD_NAME,
    POD_UID,
    Refused,
    Reviewed,
    Rules,
    bound_pod,
    node_of,
)
from nodeward.callout.service import Callout, request_of
from nodeward.config import AuthCalloutSettings
from nodeward.nats_auth import permissions_document
from schemas.tokens import token


def _pair(prefix: int) -> nkeys.KeyPair:
    return nkeys.from_seed(bytearray(nkeys.encode_seed(os.urandom(32), prefix)))


def _payload(text: str) -> dict[str, Any]:
    part = text.split(".")[1]
    return dict(json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))))


@pytest.fixture(scope="module")
def rules() -> Rules:
    document = identities.PermissionsDocument.model_validate(
        permissions_document(GRANTS, AGENT_GRANTS, READERS)
    )
    return Rules(document, namespace="gpu-ops", release="nw")


def _sa(name: str, namespace: str = "gpu-ops", **extra: list[str]) -> Reviewed:
    return Reviewed(f"system:serviceaccount:{namespace}:{name}", dict(extra))


def test_a_jwt_round_trips_and_is_signed_by_its_issuer() -> None:
    issuer = _pair(nkeys.PREFIX_BYTE_ACCOUNT)
    text = jwt.encode({"sub": "UABC", "nats": {"type": "user"}}, issuer, now=1000)
    head = json.loads(base64.urlsafe_b64decode(text.split(".")[0] + "=="))
    assert head == {"typ": "JWT", "alg": "ed25519-nkey"}
    claims = jwt.decode(text, now=1000)
    assert claims["iss"] == issuer.public_key.decode()
    assert claims["iat"] == 1000 and claims["nats"] == {"type": "user", "version": 2}
    assert len(claims["jti"]) == 52  # base32 of SHA-512/256, no padding


def test_a_tampered_or_expired_jwt_is_refused() -> None:
    issuer = _pair(nkeys.PREFIX_BYTE_ACCOUNT)
    text = jwt.encode({"sub": "UABC", "exp": 2000}, issuer, now=1000)
    head, _, sig = text.split(".")
    forged = dict(_payload(text), sub="UOTHER")
    forged_body = base64.urlsafe_b64encode(json.dumps(forged).encode()).rstrip(b"=").decode()
    with pytest.raises(jwt.JwtError, match="signature"):
        jwt.decode(f"{head}.{forged_body}.{sig}", now=1000)
    with pytest.raises(jwt.JwtError, match="expired"):
        jwt.decode(text, now=2001)
    with pytest.raises(jwt.JwtError, match="3 chunks"):
        jwt.decode("not-a-jwt")


def test_a_request_must_be_the_servers_authorization_request() -> None:
    server = _pair(nkeys.PREFIX_BYTE_SERVER)
    good = {
        "aud": "nats-authorization-request",
        "sub": "A",
        "nats": {"type": "authorization_request", "user_nkey": "UX"},
    }
    assert request_of(jwt.encode(good, server).encode())["user_nkey"] == "UX"
    with pytest.raises(jwt.JwtError, match="not an authorization request"):
        request_of(jwt.encode({**good, "aud": "elsewhere"}, server).encode())


def test_services_readers_provision_and_operators_map_by_service_account(rules: Rules) -> None:
    cordon = rules.fixed(rules.account(_sa("nw-cordon")))
    assert cordon.user == "nodeward-cordon"
    assert cordon.permissions == rules.document.services["cordon"].permissions
    assert rules.fixed("nw-console").user == "nodeward-console"
    assert rules.fixed("nw-provision").user == "nodeward-admin"
    operator = rules.fixed("nw-operator")
    assert operator.user == "nodeward-operator"
    assert "$KV.>" in operator.permissions["publish"]["deny"]


@pytest.mark.parametrize(
    ("reviewed", "why"),
    [
        (Reviewed("alice", {}), "not a ServiceAccount"),
        (_sa("nw-cordon", namespace="default"), "not in namespace gpu-ops"),
    ],
)
def test_a_token_of_no_nodeward_account_is_refused(
    rules: Rules, reviewed: Reviewed, why: str
) -> None:
    with pytest.raises(Refused, match=why):
        rules.account(reviewed)


@pytest.mark.parametrize("account", ["nw-nosuch", "other-cordon", "nwcordon", "nw-", "nw-agent-x"])
def test_an_account_without_grants_is_refused(rules: Rules, account: str) -> None:
    with pytest.raises(Refused, match="has no NATS grants"):
        rules.fixed(account)


def test_an_agent_gets_its_own_nodes_subjects_only(rules: Rules) -> None:
    grant = rules.agent("dgx-a100.rack7")
    mine = token("dgx-a100.rack7")
    text = json.dumps(grant.permissions)
    assert "__NODE__" not in text and mine in text
    assert grant.user == f"agent-{mine}"
    assert f"_INBOX_{mine}.>" in grant.permissions["subscribe"]["allow"]
    assert all(mine in s or "{" not in s for s in grant.permissions["publish"]["allow"])
    claims = grant.user_claims()
    assert claims["pub"]["allow"] == grant.permissions["publish"]["allow"]
    assert (claims["subs"], claims["data"], claims["payload"]) == (-1, -1, -1)


def _pod(uid: str = "u1", node: str = "n1", **extra: Any) -> dict[str, Any]:
    pod: dict[str, Any] = {
        "metadata": {"name": "nw-agent-abc", "uid": uid},
        "spec": {"nodeName": node},
        "status": {"phase": "Running"},
    }
    for key, value in extra.items():
        section, _, field = key.partition("__")
        pod[section][field] = value
    return pod


def test_an_agent_token_binds_to_the_node_of_its_running_pod() -> None:
    reviewed = _sa("nw-agent", **{POD_NAME: ["nw-agent-abc"], POD_UID: ["u1"], NODE_NAME: ["n1"]})
    assert bound_pod(reviewed) == ("nw-agent-abc", "u1")
    assert node_of(_pod(), "u1", reviewed) == "n1"


@pytest.mark.parametrize(
    ("pod", "why"),
    [
        (_pod(uid="u2"), "not the one the token was bound to"),
        (_pod(status__phase="Failed"), "has terminated"),
        (_pod(status__phase="Succeeded"), "has terminated"),
        (_pod(metadata__deletionTimestamp="2026-12-04T00:00:00Z"), "being deleted"),
        (_pod(node=""), "not bound to a node"),
        (_pod(node="n2"), "runs on n2, its token says n1"),
    ],
)
def test_an_agent_token_is_refused_when_its_pod_is_not_that_running_pod(
    pod: dict[str, Any], why: str
) -> None:
    reviewed = _sa("nw-agent", **{POD_NAME: ["nw-agent-abc"], POD_UID: ["u1"], NODE_NAME: ["n1"]})
    with pytest.raises(Refused, match=why):
        node_of(pod, "u1", reviewed)


def test_an_agent_token_not_bound_to_a_pod_is_refused() -> None:
    with pytest.raises(Refused, match="bound to its pod"):
        bound_pod(_sa("nw-agent"))


def test_a_users_jwt_is_placed_in_the_account_and_ends_with_its_token(rules: Rules) -> None:
    issuer = _pair(nkeys.PREFIX_BYTE_ACCOUNT)
    user = _pair(nkeys.PREFIX_BYTE_USER).public_key.decode()
    callout = Callout(AuthCalloutSettings(), issuer, rules, cluster=None)  # type: ignore[arg-type]
    soon = time.time() + 300
    claims = jwt.decode(callout.user_jwt(rules.agent("n1"), user, soon))
    assert claims["sub"] == user and claims["aud"] == "NODEWARD"
    assert claims["exp"] == int(soon)
    assert claims["name"] == "agent-n1" and claims["nats"]["type"] == "user"
    later = jwt.decode(callout.user_jwt(rules.agent("n1"), user, None))
    assert later["exp"] == pytest.approx(time.time() + 3600, abs=5)
    reply = jwt.decode(callout.response(user, "NSERVER", error="no").decode())
    assert reply["aud"] == "NSERVER" and reply["nats"]["error"] == "no"
    assert "jwt" not in reply["nats"]


def test_in_operator_mode_a_signing_key_names_its_account(rules: Rules) -> None:
    account = _pair(nkeys.PREFIX_BYTE_ACCOUNT).public_key.decode()
    signer = _pair(nkeys.PREFIX_BYTE_ACCOUNT)
    callout = Callout(AuthCalloutSettings(account=account), signer, rules, cluster=None)  # type: ignore[arg-type]
    claims = jwt.decode(callout.user_jwt(rules.fixed("nw-cordon"), "UX", None))
    assert "aud" not in claims
    assert claims["nats"]["issuer_account"] == account


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a.eyJleHAiOjEyM30.c", 123.0),  # {"exp":123}
        ("a.eyJleHAiOnRydWV9.c", None),  # {"exp":true}
        ("a.eyJzdWIiOiJ4In0.c", None),  # no exp
        ("opaque-legacy-token", None),
        ("a.!!!.c", None),
    ],
)
def test_a_token_files_end_is_its_jwt_exp(text: str, expected: float | None) -> None:
    assert expiry(text) == expected


def test_curve_keys_and_sealed_boxes_are_nkeys_own() -> None:
    """`SX...` seeds, `X...` keys, and `xkv1` boxes that only the two keys open."""
    ours, theirs = xkey.decode_seed(xkey.new_seed()), xkey.decode_seed(xkey.new_seed())
    seed = xkey.encode_seed(ours)
    assert seed.startswith("SX") and len(seed) == 58
    assert xkey.decode_seed(seed) == ours
    ours_public, theirs_public = xkey.public_key(ours), xkey.public_key(theirs)
    assert ours_public.startswith("X") and len(ours_public) == 56
    sealed = xkey.seal(b"request", theirs, ours_public)
    assert sealed.startswith(b"xkv1") and b"request" not in sealed
    assert xkey.open_sealed(sealed, ours, theirs_public) == b"request"
    stranger = xkey.decode_seed(xkey.new_seed())
    with pytest.raises(xkey.XkeyError, match="does not open"):
        xkey.open_sealed(sealed, stranger, theirs_public)
    with pytest.raises(xkey.XkeyError, match="not a curve seed"):
        xkey.decode_seed(nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER).decode())
    with pytest.raises(xkey.XkeyError, match="not an xkv1"):
        xkey.open_sealed(b"eyJhbGciOi...", ours, theirs_public)
