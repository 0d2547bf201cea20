"""The sim cluster's ServiceAccount token issuer and authenticator, without a server.

Sources: `pkg/serviceaccount/jwt.go` (`keyIDFromPublicKey`, `AuthenticateToken`'s order:
issuer, key, audiences, then the claims), `pkg/serviceaccount/claims.go` (`Validate`: go-jose's
60 s leeway on `nbf`, `exp` and `iat`), kube-apiserver's token success cache (10 s, successes
only), and the protobuf TokenRequest `kubectl create token` sends.
"""

from __future__ import annotations

import base64
import hashlib
import json

import pytest
from cryptography.hazmat.primitives import serialization

from sim.cluster import load_seed
from sim.cluster.protobuf import decode
from sim.cluster.resources import require
from sim.cluster.seed import apply_seed
from sim.cluster.store import Store
from sim.cluster.tokens import CACHE_TTL, ISSUER, Refused, Tokens
from tests.helpers.kube import request_body

PODS = require("", "v1", "pods")
NS = "ml-nlp"

# `kubectl create token default -n ml-nlp --duration 20m --audience nats --audience b
# --bound-object-kind Pod --bound-object-name agent --bound-object-uid u-1` (kubectl v1.32.4)
CREATE_TOKEN = bytes.fromhex(
    "6b3873000a280a1861757468656e7469636174696f6e2e6b38732e696f2f7631120c546f6b656e5265717565"
    "7374123d0a100a0012001a0022002a0032003800420012230a046e6174730a01621a150a03506f6412027631"
    "1a056167656e742203752d3120b0091a040a0012001a002200"
)


@pytest.fixture
def store() -> Store:
    store = Store()
    apply_seed(store, load_seed())
    store.create(
        PODS,
        NS,
        {
            "metadata": {"name": "agent"},
            "spec": {
                "serviceAccountName": "default",
                "nodeName": "gpu-h100-01",
                "containers": [{"name": "main", "image": "busybox:1.36"}],
            },
        },
    )
    return store


def _issue(tokens: Tokens, **spec: object) -> str:
    bound = {"boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "agent"}}
    answer = tokens.request(NS, "default", {"spec": bound | spec})
    return str(answer["status"]["token"])


def _refusal(tokens: Tokens, token: str, audiences: list[str] | None = None) -> str:
    with pytest.raises(Refused) as refused:
        tokens.authenticate(token, audiences)
    return str(refused.value)


def test_the_key_id_is_the_digest_of_the_public_key(store: Store) -> None:
    tokens = Tokens(store, 37)
    der = tokens.key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    expected = base64.urlsafe_b64encode(hashlib.sha256(der).digest()).rstrip(b"=").decode()
    assert tokens.kid == expected
    header = _issue(tokens).split(".")[0]
    assert base64.urlsafe_b64decode(header + "==") == (
        f'{{"alg":"RS256","kid":"{expected}"}}'.encode()
    )


def test_times_are_checked_with_a_minute_of_leeway(store: Store) -> None:
    tokens = Tokens(store, 37, cache_ttl=0)
    token = _issue(tokens)
    tokens.advance(-50)  # issued 50 s "in the future": within the leeway
    assert tokens.authenticate(token) is not None
    tokens.advance(-30)
    assert _refusal(tokens, token) == "service account token is not valid yet"
    tokens.advance(80 + 3600 + 50)
    assert tokens.authenticate(token) is not None
    tokens.advance(30)
    assert _refusal(tokens, token) == "service account token has expired"


def test_audiences_are_checked_before_the_times(store: Store) -> None:
    tokens = Tokens(store, 37, cache_ttl=0)
    token = _issue(tokens, audiences=["a", "b"])
    tokens.advance(2 * 3600)
    assert _refusal(tokens, token, ["c"]) == (
        'token audiences ["a" "b"] is invalid for the target audiences ["c"]'
    )
    tokens.advance(-2 * 3600)
    found = tokens.authenticate(token, ["c", "b", "a"])
    assert found is not None and found.audiences == ("b", "a"), "in the order asked"


def test_only_successes_are_cached_and_only_for_ten_seconds(store: Store) -> None:
    tokens = Tokens(store, 37)
    token = _issue(tokens)
    assert _refusal(tokens, token, ["nats"]).startswith("token audiences")
    assert tokens.authenticate(token) is not None
    store.delete(PODS, NS, "agent", grace_period=0)
    assert tokens.authenticate(token) is not None, "cached"
    assert _refusal(tokens, token, ["other", ISSUER]) == (
        "service account token has been invalidated"
    ), "another audience is another cache entry"
    tokens.advance(CACHE_TTL)
    assert _refusal(tokens, token) == "service account token has been invalidated"


def test_what_is_not_this_issuers_token_is_none(store: Store) -> None:
    tokens = Tokens(store, 37)
    header, payload, signature = _issue(tokens).split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=="))
    other = base64.urlsafe_b64encode(
        json.dumps(claims | {"iss": "https://elsewhere"}).encode()
    ).rstrip(b"=")
    assert tokens.authenticate("not.a.token") is None
    assert tokens.authenticate(f"{header}.{other.decode()}.{signature}") is None
    assert tokens.authenticate(f"{header}.{payload}=.{signature}") is None, "padded"
    none_alg = base64.urlsafe_b64encode(b'{"alg":"none"}').rstrip(b"=").decode()
    assert _refusal(tokens, f"{none_alg}.{payload}.") == (
        "go-jose/go-jose: unknown/unsupported algorithm"
    )


def test_kubectls_protobuf_token_request() -> None:
    assert decode(CREATE_TOKEN) == request_body(
        "authentication.k8s.io/v1",
        "TokenRequest",
        spec={
            "audiences": ["nats", "b"],
            "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": "agent", "uid": "u-1"},
            "expirationSeconds": 1200,
        },
    )


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field (every length here is under 128)."""
    return bytes([number << 3 | 2, len(payload)]) + payload


def test_a_protobuf_token_review() -> None:
    """`TokenReviewSpec`: token 1, audiences 2 (`k8s.io/api/authentication/v1/types.go`)."""
    spec = _field(1, b"a.b.c") + _field(2, b"nats") + _field(2, b"other")
    review = _field(1, b"") + _field(2, spec)
    type_meta = _field(1, b"authentication.k8s.io/v1") + _field(2, b"TokenReview")
    body = b"k8s\x00" + _field(1, type_meta) + _field(2, review)
    assert decode(body) == request_body(
        "authentication.k8s.io/v1",
        "TokenReview",
        spec={"token": "a.b.c", "audiences": ["nats", "other"]},
    )
