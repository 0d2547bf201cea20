"""ServiceAccount tokens as kube-apiserver issues and checks them: the `token` subresource of
serviceaccounts (TokenRequest), TokenReview, and the bearer-token authenticator behind both.

From kube-apiserver's source:
- `pkg/registry/core/serviceaccount/storage/token.go` (`TokenREST.Create`): the body's name,
  namespace and uid must be the ServiceAccount's (422, and 409 for the uid from 1.34,
  `TokenRequestServiceAccountUIDValidation`); the account must exist (404); audiences default
  to the API server's; a bound object must be a Pod, a Secret or (from 1.31,
  `ServiceAccountTokenNodeBinding`) a Node that exists (404), a pod must run as the account
  (400), any other kind is 400, a `uid` that is not the object's is 409; a pod-bound token
  carries the pod's node, name and uid, from 1.30 (`ServiceAccountTokenPodNodeInfo`; the name
  alone when the node is not found); a pod-bound token for the API server's audiences asking
  3607 s (what the kubelet asks for `kube-api-access`) lives a year with `warnafter` at 3607 s
  (`--service-account-extend-token-expiration`, on by default); the answer is the request
  with `status.token` and `status.expirationTimestamp` (now plus the seconds asked);
- `pkg/apis/authentication/validation` (`ValidateTokenRequest`): 600 s to 2^32 s, else 422 on
  `spec.expirationSeconds`; `pkg/apis/authentication/v1/defaults.go`: 3600 s by default;
- `pkg/serviceaccount/claims.go` (`Claims`, `validator.Validate`) and `jwt.go`: the claims
  (`iss`, `sub`, `aud`, `exp`, `iat`, `nbf`, `jti` from 1.30, the private `kubernetes.io`),
  RS256 with the key id derived from the public key; on review, the issuer, the key, the
  audiences (checked first), then the times with go-jose's 60 s leeway, then the account, the
  secret, the pod or the node: missing, recreated (another uid), or deleted more than 60 s
  ago, each with the authenticator's words;
- `staging/src/k8s.io/apiserver/pkg/authentication/serviceaccount/util.go`: the user
  (`system:serviceaccount:<ns>:<name>`, the account's uid, its groups, and `extra`: pod name
  and uid, node name and uid, `credential-id` `JTI=<jti>`), with `system:authenticated` from
  the authenticated-group adder;
- `pkg/registry/authentication/tokenreview/storage.go`: a review's audiences are the spec's,
  else the API server's; `request/bearertoken`: a token no authenticator recognises is
  `invalid bearer token`; `pkg/kubeapiserver/options/authentication.go`: a success is cached
  for 10 s (`TokenSuccessCacheTTL`), so a token stays good that long after its pod is gone.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from sim.cluster.errors import ApiError, bad_request, invalid
from sim.cluster.resources import require
from sim.cluster.store import Obj, Store

ISSUER = "https://kubernetes.default.svc.cluster.local"
"""The sim's `--service-account-issuer`, as kubeadm sets it; also its API audience."""
GROUP = "authentication.k8s.io"
MIN_EXPIRATION = 10 * 60
MAX_EXPIRATION = 1 << 32
DEFAULT_EXPIRATION = 60 * 60
WARN_ONLY_EXPIRATION = 60 * 60 + 7
"""What the kubelet asks for the `kube-api-access` volume; such a token is extended."""
EXTENDED_EXPIRATION = 24 * 365 * 60 * 60
LEEWAY = 60.0
"""go-jose's `jwt.DefaultLeeway`: for the token's times and for a bound object's deletion."""
CACHE_TTL = 10.0
"""kube-apiserver's `TokenSuccessCacheTTL`: how long a token that authenticated stays so."""
PREFIX = "system:serviceaccount:"
POD_NAME = "authentication.kubernetes.io/pod-name"
POD_UID = "authentication.kubernetes.io/pod-uid"
NODE_NAME = "authentication.kubernetes.io/node-name"
NODE_UID = "authentication.kubernetes.io/node-uid"
CREDENTIAL_ID = "authentication.kubernetes.io/credential-id"
INVALID_BEARER_TOKEN = "invalid bearer token"  # noqa: S105 - an error message
INVALIDATED = "service account token has been invalidated"
_CRYPTO_FAILURE = "go-jose/go-jose: error in cryptographic primitive"
_UNSUPPORTED = "go-jose/go-jose: unknown/unsupported algorithm"
_RSA_ALGS = frozenset({"RS256", "RS384", "RS512", "PS256", "PS384", "PS512"})

_ACCOUNTS = require("", "v1", "serviceaccounts")
_PODS = require("", "v1", "pods")
_SECRETS = require("", "v1", "secrets")
_NODES = require("", "v1", "nodes")


class Refused(Exception):
    """A token of this issuer that does not authenticate; the message is what the API server
    says (a TokenReview's `status.error`)."""


@dataclass(frozen=True)
class User:
    """Who a token is (`user.Info` as the authenticator chain returns it)."""

    username: str
    uid: str
    groups: tuple[str, ...]
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def info(self) -> dict[str, Any]:
        """`UserInfo` as a TokenReview's status writes it (extra's keys sorted, as Go's maps)."""
        out: dict[str, Any] = {"username": self.username}
        if self.uid:
            out["uid"] = self.uid
        if self.groups:
            out["groups"] = list(self.groups)
        if self.extra:
            out["extra"] = {k: list(v) for k, v in sorted(self.extra)}
        return out


@dataclass(frozen=True)
class Authenticated:
    """A token that authenticated: its user and the audiences it was accepted for."""

    user: User
    audiences: tuple[str, ...]


def service_account_groups(namespace: str) -> tuple[str, ...]:
    """The groups of every ServiceAccount of `namespace`, and `system:authenticated`."""
    return ("system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated")


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    """Go's `base64.RawURLEncoding`: no padding, nothing outside the alphabet."""
    if "=" in text:
        raise ValueError("padded")
    try:
        return base64.b64decode(text + "=" * (-len(text) % 4), altchars=b"-_", validate=True)
    except binascii.Error as exc:
        raise ValueError(str(exc)) from None


def _json(value: Any) -> bytes:
    """JSON as go-jose writes merged claims: keys sorted (Go maps), compact."""
    return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False).encode()


def _go_quote(values: Sequence[str]) -> str:
    """`fmt.Sprintf("%q", []string{...})`: `["a" "b"]`."""
    return "[" + " ".join(json.dumps(v, ensure_ascii=False) for v in values) + "]"


def _rfc3339(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _epoch(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


def _gvk(api_version: str, kind: str) -> tuple[str, str]:
    """(group, `gvk.String()`) of a bound object reference (`schema.FromAPIVersionAndKind`)."""
    parts = api_version.split("/") if api_version else []
    if len(parts) == 1:
        group, version = "", parts[0]
    elif len(parts) == 2 and parts[0] and parts[1]:
        group, version = parts
    else:
        group, version = "", ""
    return group, f"{group}/{version}, Kind={kind}"


class Tokens:
    """The sim's token issuer and authenticator, on `store`, for release `1.<minor>`.

    `now()` is its clock (wall time plus `advance`d seconds), for expiry, the deletion grace
    and the success cache; `cache_ttl` 0 turns the cache off."""

    def __init__(
        self, store: Store, minor: int, *, issuer: str = ISSUER, cache_ttl: float = CACHE_TTL
    ) -> None:
        self.store = store
        self.minor = minor
        self.issuer = issuer
        self.audiences: tuple[str, ...] = (issuer,)
        """`--api-audiences`: by default the issuer."""
        self.cache_ttl = cache_ttl
        self.offset = 0.0
        self._key: rsa.RSAPrivateKey | None = None
        self._kid = ""
        self._cache: dict[tuple[str, tuple[str, ...]], tuple[float, Authenticated]] = {}

    # --- clock and key -------------------------------------------------------------------

    def now(self) -> float:
        return time.time() + self.offset

    def advance(self, seconds: float) -> None:
        """Move the token clock on: tokens expire, deletions age, cached successes lapse."""
        self.offset += seconds

    @property
    def key(self) -> rsa.RSAPrivateKey:
        """The signing key (`--service-account-signing-key-file`), made on first use."""
        if self._key is None:
            self._key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
            der = self._key.public_key().public_bytes(
                serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
            )
            self._kid = _b64(hashlib.sha256(der).digest())
        return self._key

    @property
    def kid(self) -> str:
        """The key id tokens carry: the SHA-256 of the public key's DER, base64url."""
        _ = self.key
        return self._kid

    def public_key_pem(self) -> bytes:
        """The public key (`--service-account-key-file`), for whoever verifies tokens offline."""
        return self.key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )

    def sign(self, claims: dict[str, Any]) -> str:
        """A compact RS256 JWS of `claims`, with this issuer's key id."""
        header = _b64(_json({"alg": "RS256", "kid": self.kid}))
        payload = _b64(_json(claims))
        signing_input = f"{header}.{payload}".encode()
        signature = self.key.sign(signing_input, padding.PKCS1v15(), hashes.SHA256())
        return f"{header}.{payload}.{_b64(signature)}"

    # --- TokenRequest --------------------------------------------------------------------

    def request(self, namespace: str, name: str, body: Obj) -> Obj:
        """`POST .../serviceaccounts/<name>/token`: the TokenRequest `body` (decoded) answered
        with its token, or the API server's error."""
        meta = dict(body.get("metadata") or {})
        spec = dict(body.get("spec") or {})
        for field, expected in (("name", name), ("namespace", namespace)):
            if meta.get(field) and meta[field] != expected:
                raise invalid(
                    "TokenRequest",
                    name,
                    GROUP,
                    [
                        (
                            f"metadata.{field}",
                            "FieldValueInvalid",
                            f'Invalid value: "{meta[field]}": must match the service account '
                            f"{field} if specified",
                        )
                    ],
                )
        account = self.store.get(_ACCOUNTS, namespace, name)
        account_uid = account["metadata"]["uid"]
        asked_uid = meta.get("uid")
        if asked_uid and asked_uid != account_uid and self.minor >= 34:
            raise ApiError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on TokenRequest.{GROUP} "{name}": the UID in the '
                f"token request ({asked_uid}) does not match the UID of the service account "
                f"({account_uid})",
                details={"name": name, "group": GROUP, "kind": "TokenRequest"},
            )
        audiences = list(spec.get("audiences") or self.audiences)
        seconds = spec.get("expirationSeconds")
        seconds = DEFAULT_EXPIRATION if seconds is None else int(seconds)
        issued = self.now()
        _validate_expiration(seconds)
        ref = spec.get("boundObjectRef")
        bound = self._bound(namespace, name, ref)
        pod = bound[0]
        exp, warn_after = seconds, 0
        if (
            pod is not None
            and seconds == WARN_ONLY_EXPIRATION
            and set(audiences) <= set(self.audiences)
        ):
            exp, warn_after = EXTENDED_EXPIRATION, seconds
        token = self.sign(
            self._claims(
                account, bound, issued=issued, exp=exp, warn_after=warn_after, audiences=audiences
            )
        )
        out_spec: dict[str, Any] = {"audiences": audiences, "expirationSeconds": seconds}
        if ref is not None:
            out_spec["boundObjectRef"] = ref
        out_spec |= {k: v for k, v in spec.items() if k not in out_spec}
        out_meta = {
            "name": name,
            "namespace": namespace,
            "uid": asked_uid or account_uid,
            "creationTimestamp": _rfc3339(issued),
        }
        out_meta |= {k: v for k, v in meta.items() if k not in out_meta}
        return {
            "kind": "TokenRequest",
            "apiVersion": f"{GROUP}/v1",
            "metadata": out_meta,
            "spec": out_spec,
            "status": {"token": token, "expirationTimestamp": _rfc3339(issued + seconds)},
        }

    def _bound(
        self, namespace: str, account: str, ref: Any
    ) -> tuple[Obj | None, Obj | None, Obj | None]:
        """The (pod, node, secret) a token is bound to, checked as `TokenREST.Create` does."""
        if ref is None:
            return None, None, None
        if not isinstance(ref, dict):
            raise bad_request("spec.boundObjectRef must be an object")
        kind, ref_name = str(ref.get("kind") or ""), str(ref.get("name") or "")
        group, shown = _gvk(str(ref.get("apiVersion") or ""), kind)
        pod = node = secret = None
        if group == "" and kind == "Pod":
            pod = self.store.get(_PODS, namespace, ref_name)
            if (pod.get("spec") or {}).get("serviceAccountName") != account:
                raise bad_request(
                    f'cannot bind token for serviceaccount "{account}" to pod running with '
                    "different serviceaccount name."
                )
            uid = pod["metadata"]["uid"]
            node_name = (pod.get("spec") or {}).get("nodeName")
            if self.minor >= 30 and node_name:
                node = self.store.find(_NODES, "", node_name) or {"metadata": {"name": node_name}}
        elif group == "" and kind == "Node":
            if self.minor < 31:
                raise bad_request(
                    'cannot bind token to a Node object as the "ServiceAccountTokenNodeBinding" '
                    "feature-gate is disabled"
                )
            node = self.store.get(_NODES, "", ref_name)
            uid = node["metadata"]["uid"]
        elif group == "" and kind == "Secret":
            secret = self.store.get(_SECRETS, namespace, ref_name)
            uid = secret["metadata"]["uid"]
        else:
            raise bad_request(f"cannot bind token to object of type {shown}")
        asked = ref.get("uid")
        if asked and asked != uid:
            raise ApiError(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {kind} "{ref_name}": the UID in the bound '
                f"object reference ({asked}) does not match the UID in record. The object might "
                "have been deleted and then recreated",
                details={"name": ref_name, "kind": kind},
            )
        return pod, node, secret

    def _claims(
        self,
        account: Obj,
        bound: tuple[Obj | None, Obj | None, Obj | None],
        *,
        issued: float,
        exp: int,
        warn_after: int,
        audiences: list[str],
    ) -> dict[str, Any]:
        """The public and private claims of `serviceaccount.Claims`; `bound`: the (pod, node,
        secret) the token is bound to."""
        pod, node, secret = bound
        meta = account["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        at = int(issued)

        def ref(obj: Obj) -> dict[str, str]:
            m = obj["metadata"]
            return {k: m[k] for k in ("name", "uid") if m.get(k)}

        private: dict[str, Any] = {
            "namespace": namespace,
            "serviceaccount": {"name": name, "uid": meta["uid"]},
        }
        if pod is not None:
            private["pod"] = ref(pod)
            if node is not None:
                private["node"] = ref(node)
        elif secret is not None:
            private["secret"] = ref(secret)
        elif node is not None:
            private["node"] = ref(node)
        if warn_after:
            private["warnafter"] = at + warn_after
        claims: dict[str, Any] = {
            "iss": self.issuer,
            "sub": f"{PREFIX}{namespace}:{name}",
            "aud": audiences,
            "exp": at + exp,
            "iat": at,
            "nbf": at,
            "kubernetes.io": private,
        }
        if self.minor >= 30:
            claims["jti"] = str(uuid.uuid4())
        return claims

    # --- authentication ------------------------------------------------------------------

    def authenticate(
        self, token: str, audiences: Sequence[str] | None = None
    ) -> Authenticated | None:
        """The token's user if it is a valid token of this issuer for `audiences` (default:
        the API server's); None if it is not this issuer's token at all; `Refused`, with the
        authenticator's words, if it is and does not authenticate."""
        requested = tuple(audiences) if audiences else self.audiences
        now = self.now()
        cached = self._cache.get((token, requested))
        if cached is not None and cached[0] > now:
            return cached[1]
        parsed = self._parse(token)
        if parsed is None:
            return None
        header, claims, signing_input, signature = parsed
        self._verify(header, signing_input, signature)
        if claims.get("iss") != self.issuer:
            raise Refused(f'token issuer "{claims.get("iss")}" is invalid')
        aud = claims.get("aud")
        token_audiences = tuple([aud] if isinstance(aud, str) else aud or ()) or self.audiences
        accepted = tuple(a for a in requested if a in token_audiences)
        if not accepted:
            raise Refused(
                f"token audiences {_go_quote(token_audiences)} is invalid for the target "
                f"audiences {_go_quote(requested)}"
            )
        user = self._validate(claims, now)
        found = Authenticated(user, accepted)
        if self.cache_ttl > 0:
            if len(self._cache) > 4096:
                self._cache = {k: v for k, v in self._cache.items() if v[0] > now}
            self._cache[(token, requested)] = (now + self.cache_ttl, found)
        return found

    def _parse(self, token: str) -> tuple[dict[str, Any], dict[str, Any], bytes, bytes] | None:
        """Header, claims, signing input and signature of a compact JWS whose `iss` is this
        issuer (`hasCorrectIssuer`, `jwt.ParseSigned`); None for anything else."""
        if token.strip().startswith("{"):
            return None
        parts = token.split(".")
        if len(parts) != 3:
            return None
        try:
            header = json.loads(_unb64(parts[0]))
            claims = json.loads(_unb64(parts[1]))
            signature = _unb64(parts[2])
        except ValueError:
            return None
        if not isinstance(header, dict) or not isinstance(claims, dict):
            return None
        if claims.get("iss") != self.issuer:
            return None
        return header, claims, f"{parts[0]}.{parts[1]}".encode(), signature

    def _verify(self, header: dict[str, Any], signing_input: bytes, signature: bytes) -> None:
        kid = header.get("kid")
        if kid and kid != self.kid:
            raise Refused("invalid signature, no keys found")
        alg = header.get("alg")
        if alg not in _RSA_ALGS:
            raise Refused(_UNSUPPORTED)
        if alg != "RS256":
            raise Refused(_CRYPTO_FAILURE)  # this issuer signs RS256 only
        try:
            self.key.public_key().verify(
                signature, signing_input, padding.PKCS1v15(), hashes.SHA256()
            )
        except InvalidSignature:
            raise Refused(_CRYPTO_FAILURE) from None

    def _validate(self, claims: dict[str, Any], now: float) -> User:
        """`validator.Validate`: the token's times, then what it is bound to, as they stand."""

        def number(key: str) -> float | None:
            value = claims.get(key)
            return float(value) if isinstance(value, int | float) else None

        nbf, exp, iat = number("nbf"), number("exp"), number("iat")
        if nbf is not None and now + LEEWAY < nbf:
            raise Refused("service account token is not valid yet")
        if exp is not None and now - LEEWAY > exp:
            raise Refused("service account token has expired")
        if iat is not None and now + LEEWAY < iat:
            raise Refused("service account token is issued in the future")
        private = claims.get("kubernetes.io") or {}
        if not isinstance(private, dict):
            raise Refused("service account token claims could not be validated")
        namespace = str(private.get("namespace") or "")

        def ref(key: str) -> dict[str, str] | None:
            value = private.get(key)
            if not isinstance(value, dict):
                return None
            return {"name": str(value.get("name") or ""), "uid": str(value.get("uid") or "")}

        account_ref = ref("serviceaccount") or {"name": "", "uid": ""}
        deleted_before = now - LEEWAY

        def deleted(obj: Obj) -> bool:
            stamp = obj["metadata"].get("deletionTimestamp")
            return bool(stamp) and _epoch(stamp) < deleted_before

        account = self.store.find(_ACCOUNTS, namespace, account_ref["name"])
        if account is None:
            raise Refused(f'serviceaccounts "{account_ref["name"]}" not found')
        if account["metadata"]["uid"] != account_ref["uid"]:
            raise Refused(
                f"service account UID ({account['metadata']['uid']}) does not match claim "
                f"({account_ref['uid']})"
            )
        if deleted(account):
            raise Refused(f"service account {namespace}/{account_ref['name']} has been deleted")
        secret_ref, pod_ref, node_ref = ref("secret"), ref("pod"), ref("node")

        def still_bound(kind: str, rt: Any, where: str, bound: dict[str, str]) -> None:
            """The bound object exists, is the one named (uid), and is not long deleted."""
            obj = self.store.find(rt, where, bound["name"])
            if obj is None:
                raise Refused(INVALIDATED)
            if obj["metadata"]["uid"] != bound["uid"]:
                raise Refused(
                    f"{kind} UID ({obj['metadata']['uid']}) does not match service account "
                    f"{kind} ref claim ({bound['uid']})"
                )
            if deleted(obj):
                raise Refused(INVALIDATED)

        if secret_ref is not None:
            still_bound("secret", _SECRETS, namespace, secret_ref)
        extra: dict[str, tuple[str, ...]] = {}
        if pod_ref is not None:
            still_bound("pod", _PODS, namespace, pod_ref)
            if pod_ref["name"] and pod_ref["uid"]:
                extra[POD_NAME] = (pod_ref["name"],)
                extra[POD_UID] = (pod_ref["uid"],)
        if node_ref is not None and self.minor >= 30:
            if pod_ref is None:
                still_bound("node", _NODES, "", node_ref)
            if node_ref["name"]:
                extra[NODE_NAME] = (node_ref["name"],)
                if node_ref["uid"]:
                    extra[NODE_UID] = (node_ref["uid"],)
        elif node_ref is not None and pod_ref is None:
            raise Refused(
                "token is bound to a Node object but the ServiceAccountTokenNodeBindingValidation "
                "feature gate is disabled"
            )
        jti = claims.get("jti")
        if self.minor >= 30 and isinstance(jti, str) and jti:
            extra[CREDENTIAL_ID] = (f"JTI={jti}",)
        return User(
            f"{PREFIX}{namespace}:{account_ref['name']}",
            account_ref["uid"],
            service_account_groups(namespace),
            tuple(sorted(extra.items())),
        )


def _validate_expiration(seconds: int) -> None:
    """`ValidateTokenRequest`: 422 for a lifetime under 10 minutes or over 2^32 seconds."""
    if seconds < MIN_EXPIRATION:
        message = f"Invalid value: {seconds}: may not specify a duration less than 10 minutes"
    elif seconds > MAX_EXPIRATION:
        message = f"Invalid value: {seconds}: may not specify a duration larger than 2^32 seconds"
    else:
        return
    raise invalid(
        "TokenRequest", "", GROUP, [("spec.expirationSeconds", "FieldValueInvalid", message)]
    )
