"""The admission webhook's pure decision (services/admission/policy.py): every rule, the
patch applied and reviewed again (empty: idempotent), refusals in one line, no secret value."""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import jsonpatch
import pytest
from pydantic import ValidationError

from services.admission.policy import (
    BadReview,
    CredentialRef,
    Decision,
    NamespaceView,
    ReviewRequest,
    decide,
    parse_review,
    response,
    volume_name,
)
from services.admission.settings import AdmissionSettings

ROOT = "/var/run/secrets/nodeward.io"
OWNER_LABELS = {
    "nodeward.io/admission": "enabled",
    "nodeward.io/owner": "ada",
    "nodeward.io/owner-uid": "1234",
    "nodeward.io/owner-gid": "500",
}
OWNER_ANNOTATIONS = {"nodeward.io/owner-groups": "physics=500,atlas=600,gpu=700"}
NS = NamespaceView("team-a", OWNER_LABELS, OWNER_ANNOTATIONS)
KRB = CredentialRef("krb", "kerberos")
TOKEN = CredentialRef("token", "oauth2")
CREDS = [TOKEN, KRB]


def pod(**spec: Any) -> dict[str, Any]:
    body = {"containers": [{"name": "main", "image": "python:3.12"}]} | spec
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "team-a"},
        "spec": body,
    }


def request(obj: dict[str, Any], **over: Any) -> ReviewRequest:
    raw = {
        "uid": "u-1",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": "team-a",
        "operation": "CREATE",
        "object": obj,
    } | over
    return ReviewRequest.model_validate(raw)


def settings(**over: Any) -> AdmissionSettings:
    return AdmissionSettings(**over)


def patched(obj: dict[str, Any], decision: Decision) -> dict[str, Any]:
    result: dict[str, Any] = jsonpatch.apply_patch(copy.deepcopy(obj), decision.patch)
    return result


def converge(
    obj: dict[str, Any],
    ns: NamespaceView = NS,
    creds: list[CredentialRef] = CREDS,
    config: AdmissionSettings | None = None,
) -> tuple[dict[str, Any], Decision]:
    """The pod as patched, after checking that reviewing it again changes nothing."""
    config = config or settings()
    first = decide(request(obj), ns, creds, config)
    assert first.allowed, first.message
    after = patched(obj, first)
    again = decide(request(after), ns, creds, config)
    assert again.allowed and again.patch == [], again.patch
    assert again.outcome == "unchanged"
    return after, first


# --- parsing ----------------------------------------------------------------------------


def review_body(**over: Any) -> bytes:
    raw = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "abc", "operation": "CREATE", "object": pod()},
    } | over
    return json.dumps(raw).encode()


def test_a_review_is_parsed() -> None:
    parsed = parse_review(review_body())
    assert parsed.uid == "abc" and parsed.operation == "CREATE" and not parsed.dry_run


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (b"{not json", "not JSON"),
        (b"[]", "not a JSON object"),
        (review_body(apiVersion="admission.k8s.io/v1beta1"), "expected apiVersion"),
        (review_body(kind="Pod"), "expected apiVersion admission.k8s.io/v1 kind AdmissionReview"),
        (review_body(request=None), "has no request"),
        (review_body(request={"operation": "CREATE"}), "has no uid"),
        (review_body(request={"uid": "x", "object": "a string"}), "request.object"),
        (b"\xff\xfe", "not JSON"),
    ],
)
def test_a_malformed_review_is_refused_in_one_line(body: bytes, said: str) -> None:
    with pytest.raises(BadReview) as caught:
        parse_review(body)
    assert said in str(caught.value)
    assert "\n" not in str(caught.value)


# --- what is left alone -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("over", "reason"),
    [
        ({"operation": "UPDATE"}, "not a pod create"),
        ({"resource": {"resource": "configmaps"}}, "not a pod create"),
        ({"subResource": "ephemeralcontainers"}, "a subresource"),
    ],
)
def test_only_a_pod_create_is_touched(over: dict[str, Any], reason: str) -> None:
    decision = decide(request(pod(), **over), NS, CREDS, settings())
    assert (decision.allowed, decision.outcome, decision.reason) == (True, "skipped", reason)
    assert decision.patch == []


def test_a_namespace_that_did_not_opt_in_is_left_alone() -> None:
    ns = NamespaceView("team-a", {**OWNER_LABELS, "nodeward.io/admission": "disabled"})
    decision = decide(request(pod()), ns, CREDS, settings())
    assert decision.outcome == "skipped" and decision.patch == []


def test_a_pod_that_opted_out_is_left_alone_even_asking_root() -> None:
    obj = pod(securityContext={"runAsUser": 0})
    obj["metadata"]["labels"] = {"nodeward.io/admission": "disabled"}
    decision = decide(request(obj), NS, CREDS, settings())
    assert (decision.allowed, decision.outcome) == (True, "skipped")


# --- the mutation ---------------------------------------------------------------------------


def test_credentials_are_mounted_read_only_with_only_what_the_workload_needs() -> None:
    obj = pod(initContainers=[{"name": "fetch", "image": "busybox"}])
    after, decision = converge(obj)
    assert decision.outcome == "mutated"
    volumes = {v["name"]: v for v in after["spec"]["volumes"]}
    assert volumes["nodeward-cred-krb"]["secret"]["secretName"] == "krb"
    assert volumes["nodeward-cred-krb"]["secret"]["items"] == [{"key": "krb5cc", "path": "krb5cc"}]
    assert volumes["nodeward-cred-token"]["secret"]["items"] == [
        {"key": "access_token", "path": "access_token"}
    ]
    # never the refresh token, keytab or client data
    assert "refresh_token" not in json.dumps(after) and "keytab" not in json.dumps(after)
    # the owner's group reads the root-owned files
    assert volumes["nodeward-cred-krb"]["secret"]["defaultMode"] == 0o440
    for where in ("containers", "initContainers"):
        container = after["spec"][where][0]
        assert {m["mountPath"]: m["readOnly"] for m in container["volumeMounts"]} == {
            f"{ROOT}/krb": True,
            f"{ROOT}/token": True,
        }
        env = {e["name"]: e["value"] for e in container["env"]}
        assert env == {
            "KRB5CCNAME": f"FILE:{ROOT}/krb/krb5cc",
            "OAUTH2_TOKEN_FILE": f"{ROOT}/token/access_token",
        }
    assert decision.mutations == {"identity": 4, "volume": 2, "mount": 4, "env": 4}


def test_the_first_secret_of_each_kind_by_name_is_the_one_named_in_env() -> None:
    creds = [CredentialRef("zz-krb", "kerberos"), CredentialRef("aa-krb", "kerberos"), TOKEN]
    after, _ = converge(pod(), creds=creds)
    env = {e["name"]: e["value"] for e in after["spec"]["containers"][0]["env"]}
    assert env["KRB5CCNAME"] == f"FILE:{ROOT}/aa-krb/krb5cc"
    assert len(after["spec"]["volumes"]) == 3


def test_an_env_var_the_container_sets_is_never_overridden() -> None:
    obj = pod(
        containers=[
            {
                "name": "main",
                "image": "x",
                "env": [{"name": "KRB5CCNAME", "value": "FILE:/tmp/mine"}],
            }
        ]
    )
    after, _ = converge(obj, config=settings(oauth2_env="TOKEN_PATH"))
    env = {e["name"]: e["value"] for e in after["spec"]["containers"][0]["env"]}
    assert env == {"KRB5CCNAME": "FILE:/tmp/mine", "TOKEN_PATH": f"{ROOT}/token/access_token"}


def test_existing_lists_are_appended_to_and_nothing_else_moves() -> None:
    obj = pod(
        volumes=[{"name": "data", "emptyDir": {}}],
        containers=[
            {
                "name": "main",
                "image": "x",
                "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                "env": [{"name": "A", "value": "1"}],
            }
        ],
    )
    after, decision = converge(obj)
    assert all(op["op"] == "add" for op in decision.patch)
    assert after["spec"]["volumes"][0] == {"name": "data", "emptyDir": {}}
    assert after["spec"]["containers"][0]["env"][0] == {"name": "A", "value": "1"}
    assert "/spec/volumes/-" in decision.paths


def test_a_pod_that_already_mounts_them_is_left_alone() -> None:
    converge(pod())
    # and one that mounts a Secret at our path itself: no second mount there
    obj = pod(
        volumes=[{"name": "mine", "secret": {"secretName": "krb"}}],
        containers=[
            {
                "name": "main",
                "image": "x",
                "volumeMounts": [{"name": "mine", "mountPath": f"{ROOT}/krb"}],
            }
        ],
    )
    after, _ = converge(obj)
    paths = [m["mountPath"] for m in after["spec"]["containers"][0]["volumeMounts"]]
    assert paths.count(f"{ROOT}/krb") == 1


def test_a_long_or_dotted_secret_name_gets_a_dns_label_volume() -> None:
    long = "a" * 80
    name = volume_name(long)
    assert len(name) <= 63 and name.startswith("nodeward-cred-aaaa")
    assert volume_name("a" * 81) != name  # the hash tells them apart
    dotted = volume_name("my.krb")
    assert "." not in dotted and dotted.startswith("nodeward-cred-my-krb-")
    assert volume_name("krb") == "nodeward-cred-krb"
    after, _ = converge(pod(), creds=[CredentialRef(long, "kerberos")])
    assert after["spec"]["volumes"][0]["name"] == name
    assert after["spec"]["containers"][0]["volumeMounts"][0]["mountPath"] == f"{ROOT}/{long}"


def test_no_credential_secrets_sets_only_the_identity() -> None:
    after, decision = converge(pod(), creds=[])
    assert "volumes" not in after["spec"]
    assert set(decision.mutations) == {"identity"}


# --- identity ---------------------------------------------------------------------------------


def test_identity_is_set_from_the_namespace_owner() -> None:
    after, _ = converge(pod(), creds=[])
    assert after["spec"]["securityContext"] == {
        "runAsUser": 1234,
        "runAsGroup": 500,
        "fsGroup": 500,
        "supplementalGroups": [500, 600, 700],
    }


def test_what_the_pod_sets_itself_stays() -> None:
    obj = pod(securityContext={"runAsGroup": 600, "fsGroup": 700, "seccompProfile": {}})
    after, decision = converge(obj, creds=[])
    assert after["spec"]["securityContext"] == {
        "runAsGroup": 600,
        "fsGroup": 700,
        "seccompProfile": {},
        "runAsUser": 1234,
        "supplementalGroups": [500, 600, 700],
    }
    assert decision.mutations == {"identity": 2}


def test_the_owners_own_uid_is_admitted() -> None:
    obj = pod(
        securityContext={"runAsUser": 1234},
        containers=[{"name": "main", "image": "x", "securityContext": {"runAsUser": 1234}}],
    )
    converge(obj, creds=[])


@pytest.mark.parametrize(
    ("obj", "said"),
    [
        (pod(securityContext={"runAsUser": 0}), "the pod asks runAsUser 0"),
        (
            pod(containers=[{"name": "main", "image": "x", "securityContext": {"runAsUser": 0}}]),
            "container 'main' asks runAsUser 0",
        ),
        (
            pod(
                initContainers=[
                    {"name": "init", "image": "x", "securityContext": {"runAsUser": 999}}
                ]
            ),
            "container 'init' asks runAsUser 999",
        ),
    ],
)
def test_another_uid_is_refused(obj: dict[str, Any], said: str) -> None:
    decision = decide(request(obj), NS, CREDS, settings())
    assert (decision.allowed, decision.code, decision.reason) == (False, 403, "uid")
    assert said in decision.message
    assert "belongs to uid 1234 (ada)" in decision.message
    assert "set it to 1234" in decision.message
    assert "\n" not in decision.message and decision.patch == []


def test_a_namespace_without_an_owner_uid() -> None:
    ns = NamespaceView("team-a", {"nodeward.io/admission": "enabled"})
    after, decision = converge(pod(securityContext={"runAsUser": 0}), ns=ns)
    assert "runAsUser" in after["spec"]["securityContext"]  # nobody to compare with: kept
    assert "identity" not in decision.mutations
    # no fsGroup coming: files every process of the pod reads
    assert after["spec"]["volumes"][0]["secret"]["defaultMode"] == 0o444
    refused = decide(request(pod()), ns, CREDS, settings(require_owner=True))
    assert (refused.allowed, refused.reason) == (False, "owner_unknown")
    assert "nodeward.io/owner-uid" in refused.message


def test_identity_off() -> None:
    after, decision = converge(
        pod(securityContext={"runAsUser": 0}), config=settings(set_identity=False)
    )
    assert after["spec"]["securityContext"] == {"runAsUser": 0}
    assert "identity" not in decision.mutations


# --- reads renewal never reaches --------------------------------------------------------------


def reading_pod() -> dict[str, Any]:
    return pod(
        volumes=[
            {"name": "k", "secret": {"secretName": "krb"}},
            {"name": "p", "projected": {"sources": [{"secret": {"name": "token"}}]}},
            {"name": "other", "secret": {"secretName": "not-a-credential"}},
        ],
        containers=[
            {
                "name": "main",
                "image": "x",
                "volumeMounts": [
                    {"name": "k", "mountPath": "/etc/krb5cc", "subPath": "krb5cc"},
                    {"name": "other", "mountPath": "/etc/other", "subPath": "x"},
                ],
                "env": [
                    {"name": "A", "value": "1"},
                    {
                        "name": "TOKEN",
                        "valueFrom": {"secretKeyRef": {"name": "token", "key": "access_token"}},
                    },
                    {
                        "name": "PLAIN",
                        "valueFrom": {"secretKeyRef": {"name": "not-a-credential", "key": "x"}},
                    },
                ],
            },
            {
                "name": "side",
                "image": "x",
                "envFrom": [{"secretRef": {"name": "krb"}}, {"configMapRef": {"name": "c"}}],
                "volumeMounts": [{"name": "p", "mountPath": "/tok", "subPath": "access_token"}],
            },
        ],
    )


def test_reading_a_credential_by_subpath_or_env_is_refused_naming_the_fix() -> None:
    decision = decide(request(reading_pod()), NS, CREDS, settings())
    assert (decision.allowed, decision.code, decision.reason) == (False, 403, "secret_ref")
    message = decision.message
    assert "container 'main' mounts it by subPath at /etc/krb5cc" in message
    assert "container 'main' reads it into env TOKEN (secretKeyRef)" in message
    assert "container 'side' reads it through envFrom (secretRef)" in message
    assert "container 'side' mounts it by subPath at /tok" in message
    assert f"krb is at {ROOT}/krb/krb5cc with KRB5CCNAME naming it" in message
    assert f"token is at {ROOT}/token/access_token with OAUTH2_TOKEN_FILE naming it" in message
    assert "not-a-credential" not in message and "\n" not in message


def test_reading_a_credential_by_subpath_or_env_is_rewritten_when_asked() -> None:
    config = settings(credential_refs="rewrite")
    after, decision = converge(reading_pod(), config=config)
    main, side = after["spec"]["containers"]
    assert [m["mountPath"] for m in main["volumeMounts"]] == [
        "/etc/other",
        f"{ROOT}/krb",
        f"{ROOT}/token",
    ]
    assert [e["name"] for e in main["env"]] == ["A", "PLAIN", "KRB5CCNAME", "OAUTH2_TOKEN_FILE"]
    assert side["envFrom"] == [{"configMapRef": {"name": "c"}}]
    assert [m["mountPath"] for m in side["volumeMounts"]] == [f"{ROOT}/krb", f"{ROOT}/token"]
    assert decision.mutations["rewrite"] == 4


def test_a_rewritten_reference_names_its_own_secret() -> None:
    creds = [CredentialRef("a-krb", "kerberos"), CredentialRef("b-krb", "kerberos")]
    obj = pod(
        containers=[
            {
                "name": "main",
                "image": "x",
                "env": [
                    {
                        "name": "KRB5CCNAME",
                        "valueFrom": {"secretKeyRef": {"name": "b-krb", "key": "krb5cc"}},
                    }
                ],
            }
        ]
    )
    after, _ = converge(obj, creds=creds, config=settings(credential_refs="rewrite"))
    env = {e["name"]: e["value"] for e in after["spec"]["containers"][0]["env"]}
    assert env == {"KRB5CCNAME": f"FILE:{ROOT}/b-krb/krb5cc"}


def test_a_whole_mount_of_a_credential_is_not_a_stale_read() -> None:
    obj = pod(
        volumes=[{"name": "k", "secret": {"secretName": "krb"}}],
        containers=[
            {"name": "main", "image": "x", "volumeMounts": [{"name": "k", "mountPath": "/k"}]}
        ],
    )
    converge(obj)


# --- the answer -------------------------------------------------------------------------------


def test_the_response_carries_a_base64_json_patch() -> None:
    decision = decide(request(pod()), NS, CREDS, settings())
    answer = response("u-1", decision)
    assert answer["apiVersion"] == "admission.k8s.io/v1" and answer["kind"] == "AdmissionReview"
    body = answer["response"]
    assert (body["uid"], body["allowed"], body["patchType"]) == ("u-1", True, "JSONPatch")
    assert json.loads(base64.b64decode(body["patch"])) == decision.patch


def test_an_empty_patch_is_no_patch_and_a_refusal_a_403_status() -> None:
    unchanged = response("u", decide(request(pod(), operation="DELETE"), NS, CREDS, settings()))
    assert unchanged["response"] == {"uid": "u", "allowed": True}
    refused = response(
        "u", decide(request(pod(securityContext={"runAsUser": 0})), NS, CREDS, settings())
    )
    assert refused["response"]["allowed"] is False
    assert refused["response"]["status"]["code"] == 403
    assert refused["response"]["status"]["reason"] == "Forbidden"


def test_audit_only_admits_unchanged_and_warns_what_it_would_have_done() -> None:
    """The service's `dry_run`: nothing patched or refused, the client told in a warning."""
    mutated = response("u", decide(request(pod()), NS, CREDS, settings()), audit_only=True)
    body = mutated["response"]
    assert (body["allowed"], "patch" in body, "status" in body) == (True, False, False)
    assert body["warnings"][0].startswith("nodeward dry run: would set /spec/")
    refused = decide(request(pod(securityContext={"runAsUser": 0})), NS, CREDS, settings())
    body = response("u", refused, audit_only=True)["response"]
    assert body["allowed"] is True and "status" not in body
    assert body["warnings"] == [f"nodeward dry run: would refuse: {refused.message}"[:256]]
    unchanged = decide(request(pod(), operation="DELETE"), NS, CREDS, settings())
    assert response("u", unchanged, audit_only=True)["response"] == {"uid": "u", "allowed": True}


def test_a_pod_is_named_by_generate_name_before_it_has_a_name() -> None:
    obj = pod()
    obj["metadata"] = {"generateName": "job-", "namespace": "team-a"}
    decision = decide(request(obj), NS, CREDS, settings())
    assert decision.pod == "team-a/job-*"
    assert decide(request(pod()), NS, CREDS, settings()).pod == "team-a/p"


def test_dry_run_is_decided_the_same() -> None:
    wet = decide(request(pod()), NS, CREDS, settings())
    dry = decide(request(pod(), dryRun=True), NS, CREDS, settings())
    assert dry.patch == wet.patch


def test_no_secret_value_can_appear_the_policy_never_sees_one() -> None:
    # The policy's inputs are names and kinds only: a CredentialRef has no data field.
    assert set(CredentialRef.__dataclass_fields__) == {"name", "kind"}
    decision = decide(request(reading_pod()), NS, CREDS, settings())
    assert 'access_token"' not in decision.message  # key names at most, never values


def test_settings_keep_the_deadline_inside_the_timeout() -> None:
    with pytest.raises(ValidationError, match="well inside"):
        AdmissionSettings(deadline="5s", timeout_seconds=5)
    with pytest.raises(ValidationError):
        AdmissionSettings(credential_refs="ignore")
    with pytest.raises(ValidationError):
        AdmissionSettings(oauth2_env="NOT A NAME")
