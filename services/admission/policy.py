"""The webhook's decision, pure: an AdmissionReview in, the answer and its JSONPatch out.

`parse_review` reads a request body (`BadReview`, one line, for anything that is not an
`admission.k8s.io/v1` AdmissionReview with a request and its uid); `decide` takes the
review's request, what the cache knows of its namespace (`NamespaceView`) and of the
namespace's credential Secrets (`CredentialRef`: a name and a kind, never data) and the
settings, and says what to do (`Decision`); `response` is the AdmissionReview answered.

For a pod CREATE in an opted-in namespace (label `nodeward.io/admission=enabled`) whose pod
did not opt out (label `nodeward.io/admission=disabled`):

- a uid asked by the pod or any of its containers other than the owner's (0 included) is
  refused (403), and so, by default, is a credential Secret read by `subPath`,
  `env[].valueFrom.secretKeyRef` or `envFrom[].secretRef` (renewal never reaches those;
  `credential_refs: rewrite` replaces them with the whole-volume mount and its file variable);
- runAsUser, runAsGroup, fsGroup and supplementalGroups are set from the namespace's owner
  where the pod sets none;
- each credential Secret is mounted read-only, in every container and initContainer, at
  `<mount_root>/<secret>/`, projecting only `krb5cc` (kerberos) or `access_token` (oauth2):
  the refresh token and keytab never reach the pod; `KRB5CCNAME` and the OAuth2 token-file
  variable name the first of each kind (by name) unless the container sets them.

Whatever is already there is left alone, so the pod as patched reviewed again yields an
empty patch (`reinvocationPolicy: IfNeeded`).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from schemas.directory import ADMISSION, DISABLED, ENABLED, NamespaceOwner
from services.admission.settings import AdmissionSettings

API_VERSION = "admission.k8s.io/v1"
KRB5_ENV = "KRB5CCNAME"
VOLUME_PREFIX = "nodeward-cred-"
Kind = Literal["kerberos", "oauth2"]
KINDS: tuple[Kind, ...] = ("kerberos", "oauth2")
PROJECTED_KEY: dict[Kind, str] = {"kerberos": "krb5cc", "oauth2": "access_token"}
"""The one key of each kind a pod gets: never the refresh token, keytab or client data."""
MUTATION_KINDS = ("volume", "mount", "env", "identity", "rewrite")
"""The `kind` label of the mutation counter: a fixed set."""
Outcome = Literal["mutated", "unchanged", "skipped", "refused"]
OUTCOMES: tuple[Outcome, ...] = get_args(Outcome)
RefusalReason = Literal["uid", "secret_ref", "owner_unknown"]
REFUSAL_REASONS: tuple[RefusalReason, ...] = get_args(RefusalReason)
"""The `reason` label of the refusal counter: a fixed set."""
_CONTAINER_LISTS = ("initContainers", "containers")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class BadReview(ValueError):
    """A body that is not an AdmissionReview this webhook can answer (the 400's one line)."""


class _Loose(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class GroupVersionKind(_Loose):
    group: str = ""
    version: str = ""
    kind: str = ""


class GroupVersionResource(_Loose):
    group: str = ""
    version: str = ""
    resource: str = ""


class ReviewRequest(_Loose):
    """The part of `AdmissionReview.request` the webhook reads."""

    uid: str = Field(min_length=1)
    kind: GroupVersionKind = GroupVersionKind()
    resource: GroupVersionResource = GroupVersionResource()
    sub_resource: str | None = Field(default=None, alias="subResource")
    name: str | None = None
    namespace: str | None = None
    operation: str = ""
    object: dict[str, Any] | None = None
    dry_run: bool = Field(default=False, alias="dryRun")


class AdmissionReview(_Loose):
    api_version: Literal["admission.k8s.io/v1"] = Field(alias="apiVersion")
    kind: Literal["AdmissionReview"]
    request: ReviewRequest


def parse_review(body: bytes) -> ReviewRequest:
    """The request of an `admission.k8s.io/v1` AdmissionReview body; `BadReview` otherwise."""
    try:
        raw = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadReview(f"body is not JSON: {' '.join(str(exc).split())}") from None
    if not isinstance(raw, dict):
        raise BadReview("body is not a JSON object")
    if raw.get("apiVersion") != API_VERSION or raw.get("kind") != "AdmissionReview":
        raise BadReview(
            f"expected apiVersion {API_VERSION} kind AdmissionReview, "
            f"got {str(raw.get('apiVersion'))[:64]!r} {str(raw.get('kind'))[:64]!r}"
        )
    if not isinstance(raw.get("request"), dict):
        raise BadReview("AdmissionReview has no request")
    if not raw["request"].get("uid"):
        raise BadReview("AdmissionReview request has no uid")
    try:
        return AdmissionReview.model_validate(raw).request
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"])
        raise BadReview(f"malformed AdmissionReview: {where}: {first['msg']}") from None


@dataclass(frozen=True)
class NamespaceView:
    """What the cache keeps of a namespace: its labels and the annotations the owner is
    read from."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)

    @property
    def opted_in(self) -> bool:
        return self.labels.get(ADMISSION) == ENABLED

    @functools.cached_property
    def owner(self) -> NamespaceOwner:
        """Read once per namespace version (the cache keeps the view until it changes)."""
        return NamespaceOwner.of(self.labels, self.annotations)


@dataclass(frozen=True, order=True)
class CredentialRef:
    """A credential Secret of the namespace, by name and kind (its data is never read)."""

    name: str
    kind: Kind


@dataclass(frozen=True)
class Decision:
    """What the webhook answers, and what the log and the metrics say about it."""

    allowed: bool
    outcome: Outcome
    patch: list[dict[str, Any]] = field(default_factory=list)
    mutations: Mapping[str, int] = field(default_factory=dict)
    """per mutation kind (`MUTATION_KINDS`), how many changes"""
    code: int = 200
    message: str = ""
    reason: str = ""
    """a refusal's reason (`uid`, `secret_ref`, `owner_unknown`) or why it was skipped"""
    pod: str = ""
    """namespace/name, or namespace/generateName* before the API server names it"""

    @property
    def paths(self) -> list[str]:
        return [op["path"] for op in self.patch]


WARNING_MOST = 256
"""A warning is cut here (the API server truncates longer ones)."""


def response(uid: str, decision: Decision, *, audit_only: bool = False) -> dict[str, Any]:
    """The AdmissionReview answering request `uid` with `decision`. `audit_only` (the
    service's `dry_run`): allowed and unchanged, with a warning the client sees saying what
    would have been done."""
    if audit_only:
        said = {
            "refused": f"would refuse: {decision.message}",
            "mutated": f"would set {', '.join(dict.fromkeys(decision.paths))}",
        }.get(decision.outcome)
        quiet: dict[str, Any] = {"uid": uid, "allowed": True}
        if said:
            quiet["warnings"] = [f"nodeward dry run: {said}"[:WARNING_MOST]]
        return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": quiet}
    answer: dict[str, Any] = {"uid": uid, "allowed": decision.allowed}
    if not decision.allowed:
        answer["status"] = {
            "code": decision.code,
            "reason": "Forbidden" if decision.code == 403 else "BadRequest",
            "message": decision.message,
        }
    elif decision.patch:
        answer["patchType"] = "JSONPatch"
        answer["patch"] = base64.b64encode(json.dumps(decision.patch).encode()).decode()
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": answer}


def volume_name(secret: str) -> str:
    """`nodeward-cred-<secret>`, a DNS label: a name too long, or with dots, is cut and
    given a short hash of the whole name, so two Secrets never share a volume."""
    plain = VOLUME_PREFIX + secret
    if len(plain) <= 63 and _DNS_LABEL.match(plain):
        return plain
    digest = hashlib.sha256(secret.encode()).hexdigest()[:8]
    stem = re.sub(r"[^a-z0-9-]", "-", secret.lower())[: 63 - len(VOLUME_PREFIX) - 9]
    return f"{VOLUME_PREFIX}{stem.strip('-') or 'x'}-{digest}"


def mount_path(settings: AdmissionSettings, secret: str) -> str:
    return f"{settings.mount_root.rstrip('/')}/{secret}"


def file_path(settings: AdmissionSettings, cred: CredentialRef) -> str:
    return f"{mount_path(settings, cred.name)}/{PROJECTED_KEY[cred.kind]}"


def env_value(settings: AdmissionSettings, cred: CredentialRef) -> str:
    """What `KRB5CCNAME` (`FILE:` and the ccache) or the token-file variable is set to."""
    path = file_path(settings, cred)
    return f"FILE:{path}" if cred.kind == "kerberos" else path


def env_name(settings: AdmissionSettings, kind: Kind) -> str:
    return KRB5_ENV if kind == "kerberos" else settings.oauth2_env


def pod_name(request: ReviewRequest, pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    namespace = request.namespace or meta.get("namespace") or ""
    name = request.name or meta.get("name")
    return f"{namespace}/{name}" if name else f"{namespace}/{meta.get('generateName') or ''}*"


def skipped(reason: str, pod: str = "") -> Decision:
    return Decision(True, "skipped", reason=reason, pod=pod)


def decide(
    request: ReviewRequest,
    namespace: NamespaceView,
    credentials: Sequence[CredentialRef],
    settings: AdmissionSettings,
) -> Decision:
    """The answer to one review (see the module's docstring)."""
    if request.operation != "CREATE" or request.resource.resource != "pods":
        return skipped("not a pod create")
    if request.sub_resource:
        return skipped("a subresource")
    pod = request.object or {}
    who = pod_name(request, pod)
    if not namespace.opted_in:
        return skipped("namespace not opted in", who)
    if ((pod.get("metadata") or {}).get("labels") or {}).get(ADMISSION) == DISABLED:
        return skipped("pod opted out", who)
    spec = pod.get("spec") or {}
    owner = namespace.owner
    creds = sorted(credentials)
    by_name = {c.name: c for c in creds}

    if settings.set_identity:
        refusal = _identity_refusal(spec, owner, namespace.name, settings, who)
        if refusal is not None:
            return refusal
    reads = _secret_reads(spec, by_name)
    if reads and settings.credential_refs == "refuse":
        return _refuse(who, "secret_ref", _secret_ref_message(who, reads, by_name, settings))

    plan = _Plan()
    if settings.set_identity and owner.uid is not None:
        _identity(spec, owner, plan)
    if creds:
        fs_group = (spec.get("securityContext") or {}).get("fsGroup") is not None or (
            settings.set_identity and owner.uid is not None and owner.gid is not None
        )
        _credentials(spec, creds, reads, settings, plan, fs_group=fs_group)
    if not plan.ops:
        return Decision(True, "unchanged", pod=who)
    return Decision(True, "mutated", plan.ops, dict(plan.counts), pod=who)


# --- identity ---------------------------------------------------------------------------


def _containers(spec: Mapping[str, Any], *, ephemeral: bool = False) -> list[tuple[str, int, Any]]:
    lists = (*_CONTAINER_LISTS, "ephemeralContainers") if ephemeral else _CONTAINER_LISTS
    return [
        (where, i, c)
        for where in lists
        for i, c in enumerate(spec.get(where) or [])
        if isinstance(c, dict)
    ]


def _identity_refusal(
    spec: Mapping[str, Any],
    owner: NamespaceOwner,
    namespace: str,
    settings: AdmissionSettings,
    who: str,
) -> Decision | None:
    if owner.uid is None:
        if settings.require_owner:
            return _refuse(
                who,
                "owner_unknown",
                f"pod {who}: namespace {namespace} has no owner uid recorded (label "
                "nodeward.io/owner-uid, written by the directory service); ask the platform "
                "team to register the namespace's owner",
            )
        return None
    asked: list[tuple[str, Any]] = []
    pod_uid = (spec.get("securityContext") or {}).get("runAsUser")
    if pod_uid is not None:
        asked.append(("the pod", pod_uid))
    for _, _, c in _containers(spec, ephemeral=True):
        uid = (c.get("securityContext") or {}).get("runAsUser")
        if uid is not None:
            asked.append((f"container {c.get('name')!r}", uid))
    wrong = [(what, uid) for what, uid in asked if uid != owner.uid]
    if not wrong:
        return None
    said = ", ".join(f"{what} asks runAsUser {uid}" for what, uid in wrong)
    return _refuse(
        who,
        "uid",
        f"pod {who}: {said}, but namespace {namespace} belongs to uid {owner.uid}"
        f"{f' ({owner.login})' if owner.login else ''}; remove runAsUser (it is set to "
        f"{owner.uid} for you) or set it to {owner.uid}",
    )


def _identity(spec: Mapping[str, Any], owner: NamespaceOwner, plan: _Plan) -> None:
    context = spec.get("securityContext")
    wanted: dict[str, Any] = {"runAsUser": owner.uid}
    if owner.gid is not None:
        wanted |= {"runAsGroup": owner.gid, "fsGroup": owner.gid}
    groups = sorted(set(owner.groups.values()))
    if groups:
        wanted["supplementalGroups"] = groups
    if not isinstance(context, dict):
        plan.add("/spec/securityContext", wanted, "identity", len(wanted))
        return
    for key, value in wanted.items():
        if context.get(key) in (None, []):
            plan.add(f"/spec/securityContext/{key}", value, "identity")


# --- credential Secrets -----------------------------------------------------------------


@dataclass(frozen=True)
class _Read:
    """One way a container reads a credential Secret that renewal never reaches."""

    where: str  # containers | initContainers
    index: int
    container: str
    secret: str
    how: Literal["subPath", "secretKeyRef", "envFrom"]
    detail: str  # the mount path, the variable


def _volume_secrets(volume: Mapping[str, Any]) -> set[str]:
    """The Secrets a volume shows: a `secret` volume's, or a `projected` one's."""
    found = set()
    secret = volume.get("secret")
    if isinstance(secret, dict) and secret.get("secretName"):
        found.add(str(secret["secretName"]))
    projected = volume.get("projected")
    if isinstance(projected, dict):
        for source in projected.get("sources") or []:
            ref = (source or {}).get("secret") if isinstance(source, dict) else None
            if isinstance(ref, dict) and ref.get("name"):
                found.add(str(ref["name"]))
    return found


def _secret_reads(spec: Mapping[str, Any], creds: Mapping[str, CredentialRef]) -> list[_Read]:
    volumes = {
        str(v.get("name")): _volume_secrets(v)
        for v in spec.get("volumes") or []
        if isinstance(v, dict)
    }
    reads: list[_Read] = []
    for where, i, c in _containers(spec):
        name = str(c.get("name"))
        for m in c.get("volumeMounts") or []:
            if not isinstance(m, dict) or not (m.get("subPath") or m.get("subPathExpr")):
                continue
            for secret in sorted(volumes.get(str(m.get("name")), set()) & creds.keys()):
                reads.append(_Read(where, i, name, secret, "subPath", str(m.get("mountPath"))))
        for e in c.get("env") or []:
            ref = ((e or {}).get("valueFrom") or {}).get("secretKeyRef") or {}
            if isinstance(ref, dict) and ref.get("name") in creds:
                reads.append(_Read(where, i, name, ref["name"], "secretKeyRef", str(e["name"])))
        for e in c.get("envFrom") or []:
            ref = (e or {}).get("secretRef") or {}
            if isinstance(ref, dict) and ref.get("name") in creds:
                reads.append(_Read(where, i, name, ref["name"], "envFrom", "envFrom"))
    return reads


def _secret_ref_message(
    who: str, reads: list[_Read], creds: Mapping[str, CredentialRef], settings: AdmissionSettings
) -> str:
    said = []
    for r in reads:
        how = {
            "subPath": f"mounts it by subPath at {r.detail}",
            "secretKeyRef": f"reads it into env {r.detail} (secretKeyRef)",
            "envFrom": "reads it through envFrom (secretRef)",
        }[r.how]
        said.append(f"container {r.container!r} {how}")
    secrets = sorted({r.secret for r in reads})
    fixes = "; ".join(
        f"{s} is at {file_path(settings, creds[s])} with "
        f"{env_name(settings, creds[s].kind)} naming it"
        for s in secrets
    )
    return (
        f"pod {who}: credential Secret {', '.join(secrets)}: {'; '.join(said)}; nodeward "
        "renews these Secrets in place and an env value or a subPath file never sees the "
        f"renewal. Remove the reference and read the file instead: {fixes}"
    )


def _credentials(
    spec: Mapping[str, Any],
    creds: list[CredentialRef],
    reads: list[_Read],
    settings: AdmissionSettings,
    plan: _Plan,
    *,
    fs_group: bool,
) -> None:
    volumes = [v for v in spec.get("volumes") or [] if isinstance(v, dict)]
    names = {v.get("name") for v in volumes}
    # each credential's volume name and mount path, worked out once
    mine_at = {c.name: (volume_name(c.name), mount_path(settings, c.name)) for c in creds}
    new_volumes = list(volumes)
    for cred in creds:
        if mine_at[cred.name][0] in names:
            continue
        key = PROJECTED_KEY[cred.kind]
        secret: dict[str, Any] = {
            "secretName": cred.name,
            "items": [{"key": key, "path": key}],
            # a kerberos Secret holding only a keytab gets its krb5cc from nodeward later
            "optional": True,
            # root-owned files: the owner's group (fsGroup) reads them, or everyone in the pod
            "defaultMode": 0o440 if fs_group else 0o444,
        }
        new_volumes.append({"name": mine_at[cred.name][0], "secret": secret})
    plan.list_at("/spec/volumes", _is_list(spec, "volumes"), volumes, new_volumes, "volume")

    first = {k: next((c for c in creds if c.kind == k), None) for k in KINDS}
    rewrite = settings.credential_refs == "rewrite"
    for where, i, c in _containers(spec):
        base = f"/spec/{where}/{i}"
        mine = [r for r in reads if (r.where, r.index) == (where, i)] if rewrite else []
        mounts = [m for m in c.get("volumeMounts") or [] if isinstance(m, dict)]
        env = [e for e in c.get("env") or [] if isinstance(e, dict)]
        env_from = [e for e in c.get("envFrom") or [] if isinstance(e, dict)]
        kept_mounts = [m for m in mounts if not any(_is_read(r, m, spec) for r in mine)]
        kept_env = [e for e in env if not any(_is_env_read(r, e) for r in mine)]
        kept_from = [e for e in env_from if not any(_is_from_read(r, e) for r in mine)]
        rewritten = (len(mounts) - len(kept_mounts)) + (len(env) - len(kept_env))
        rewritten += len(env_from) - len(kept_from)
        taken_names = {m.get("name") for m in kept_mounts}
        taken_paths = {str(m.get("mountPath", "")).rstrip("/") for m in kept_mounts}
        for cred in creds:
            volume, path = mine_at[cred.name]
            if volume in taken_names or path in taken_paths:
                continue
            kept_mounts.append({"name": volume, "mountPath": path, "readOnly": True})
        set_names = {e.get("name") for e in kept_env}
        referenced = [next(c for c in creds if c.name == r.secret) for r in mine]
        for kind in KINDS:
            # a rewritten reference's own Secret, else the first of the kind by name
            chosen = next((c for c in referenced if c.kind == kind), first[kind])
            name = env_name(settings, kind)
            if chosen is None or name in set_names:
                continue
            kept_env.append({"name": name, "value": env_value(settings, chosen)})
        if rewritten:
            plan.counts["rewrite"] += rewritten
        plan.list_at(
            f"{base}/volumeMounts", _is_list(c, "volumeMounts"), mounts, kept_mounts, "mount"
        )
        plan.list_at(f"{base}/env", _is_list(c, "env"), env, kept_env, "env")
        plan.list_at(f"{base}/envFrom", _is_list(c, "envFrom"), env_from, kept_from, None)


def _is_list(obj: Mapping[str, Any], key: str) -> bool:
    return isinstance(obj.get(key), list)


def _is_read(read: _Read, mount: Mapping[str, Any], spec: Mapping[str, Any]) -> bool:
    if read.how != "subPath" or not (mount.get("subPath") or mount.get("subPathExpr")):
        return False
    if str(mount.get("mountPath")) != read.detail:
        return False
    volume: Mapping[str, Any] = next(
        (v for v in spec.get("volumes") or [] if v.get("name") == mount.get("name")), {}
    )
    return read.secret in _volume_secrets(volume)


def _is_env_read(read: _Read, env: Mapping[str, Any]) -> bool:
    ref = (env.get("valueFrom") or {}).get("secretKeyRef") or {}
    return (
        read.how == "secretKeyRef"
        and env.get("name") == read.detail
        and ref.get("name") == read.secret
    )


def _is_from_read(read: _Read, env_from: Mapping[str, Any]) -> bool:
    return read.how == "envFrom" and (env_from.get("secretRef") or {}).get("name") == read.secret


def _refuse(who: str, reason: RefusalReason, message: str) -> Decision:
    return Decision(False, "refused", code=403, message=message, reason=reason, pod=who)


class _Plan:
    """The JSONPatch being built and the changes counted per kind."""

    def __init__(self) -> None:
        self.ops: list[dict[str, Any]] = []
        self.counts: Counter[str] = Counter()

    def add(self, path: str, value: Any, kind: str, count: int = 1) -> None:
        self.ops.append({"op": "add", "path": path, "value": value})
        self.counts[kind] += count

    def list_at(
        self, path: str, present: bool, old: list[Any], new: list[Any], kind: str | None
    ) -> None:
        """Patch the list at `path` from `old` to `new`: items appended when `new` only
        extends it, else the whole list replaced."""
        if new == old:
            return
        if kind is not None:
            self.counts[kind] += sum(1 for item in new if item not in old)
        if not present:
            self.ops.append({"op": "add", "path": path, "value": new})
        elif new[: len(old)] == old:
            self.ops.extend({"op": "add", "path": f"{path}/-", "value": v} for v in new[len(old) :])
        else:
            self.ops.append({"op": "replace", "path": path, "value": new})
