"""The sim cluster decodes request bodies as a real API server does: unknown and duplicate
fields by the request's `fieldValidation`, wrong types refused, required pod fields checked.

Sources: kube-apiserver `staging/src/k8s.io/apiserver/pkg/endpoints/handlers/create.go` and
`update.go` (a strict decoding error is a 400 `... cannot be handled as a ...` under Strict, a
warning per field under Warn, nothing under Ignore), `patch.go` (`jsonPatcher`: 422 Invalid on
`patch`), `rest.go` (`addStrictDecodingWarnings`, `transformDecodeError`), `fieldValidation`'s
reference in the API conventions (Warn is the default), and `pkg/apis/core/validation`
(`ValidatePodSpec`: containers, their names and images are required).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from nodeward.config import ClusterSettings
from nodeward.kube.client import KubeClient
from sim.cluster import SimCluster
from tests.integration.simkube import kubectl_binaries, kubectl_version, run_kubectl, sim_http

NS = "ml-nlp"


@pytest.fixture(autouse=True)
def _as_a_real_server(sim: SimCluster) -> None:
    """The API server's own behaviour here, also in a run with warnings made failures."""
    sim.warnings_fail = False


def _pod(name: str, **extra: Any) -> dict[str, Any]:
    container = {"name": "main", "image": "busybox", **extra.pop("container", {})}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"containers": [container]},
        **extra,
    }


def _warnings(answer: httpx.Response) -> list[str]:
    return answer.headers.get_list("warning")


async def test_strict_refuses_each_unknown_field_and_stores_nothing(sim: SimCluster) -> None:
    body = _pod("strict", bogus=1, container={"imagePullPolicyy": "Always"})
    async with sim_http(sim) as http:
        answer = await http.post(
            f"/api/v1/namespaces/{NS}/pods", params={"fieldValidation": "Strict"}, json=body
        )
        assert answer.status_code == 400, answer.text
        status = answer.json()
        assert (status["kind"], status["reason"], status["code"]) == ("Status", "BadRequest", 400)
        assert status["message"] == (
            'Pod in version "v1" cannot be handled as a Pod: strict decoding error: '
            'unknown field "spec.containers[0].imagePullPolicyy", unknown field "bogus"'
        )
        assert (await http.get(f"/api/v1/namespaces/{NS}/pods/strict")).status_code == 404


async def test_warn_is_the_default_it_drops_the_field_and_says_so(sim: SimCluster) -> None:
    body = _pod("warned", bogus=1, container={"imagePullPolicyy": "Always"})
    async with sim_http(sim) as http:
        answer = await http.post(f"/api/v1/namespaces/{NS}/pods", json=body)
        assert answer.status_code == 201, answer.text
        assert _warnings(answer) == [  # in the body's order
            '299 - "unknown field \\"spec.containers[0].imagePullPolicyy\\""',
            '299 - "unknown field \\"bogus\\""',
        ]
        stored = (await http.get(f"/api/v1/namespaces/{NS}/pods/warned")).json()
    assert "bogus" not in stored
    assert "imagePullPolicyy" not in stored["spec"]["containers"][0]
    assert stored["spec"]["containers"][0]["image"] == "busybox"
    assert ("POST", f"/api/v1/namespaces/{NS}/pods", 'unknown field "bogus"') in sim.warnings


async def test_ignore_drops_silently(sim: SimCluster) -> None:
    async with sim_http(sim) as http:
        answer = await http.post(
            f"/api/v1/namespaces/{NS}/pods",
            params={"fieldValidation": "Ignore"},
            json=_pod("ignored", bogus=1),
        )
        assert answer.status_code == 201, answer.text
        assert _warnings(answer) == []
        assert "bogus" not in answer.json()


async def test_duplicate_fields_are_strict_errors(sim: SimCluster) -> None:
    raw = (
        '{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"dup","name":"dup"},'
        '"data":{"a":"1"}}'
    )
    async with sim_http(sim) as http:
        answer = await http.post(
            f"/api/v1/namespaces/{NS}/configmaps",
            params={"fieldValidation": "Strict"},
            content=raw,
            headers={"Content-Type": "application/json"},
        )
        assert answer.status_code == 400, answer.text
        assert answer.json()["message"].endswith('duplicate field "metadata.name"')
        answer = await http.post(
            f"/api/v1/namespaces/{NS}/configmaps",
            content=raw,
            headers={"Content-Type": "application/json"},
        )
        assert answer.status_code == 201
        assert _warnings(answer) == ['299 - "duplicate field \\"metadata.name\\""']


@pytest.mark.parametrize("mode", ["Ignore", "Warn", "Strict"])
async def test_a_wrong_type_is_refused_whatever_the_directive(sim: SimCluster, mode: str) -> None:
    body = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "typed"},
        "data": {"a": 1},
    }
    async with sim_http(sim) as http:
        answer = await http.post(
            f"/api/v1/namespaces/{NS}/configmaps", params={"fieldValidation": mode}, json=body
        )
        assert answer.status_code == 400, answer.text
        assert answer.json()["message"] == (
            'ConfigMap in version "v1" cannot be handled as a ConfigMap: json: cannot unmarshal '
            "number into Go struct field ConfigMap.data of type string"
        )
        body = _pod("typed", container={"image": 5})
        answer = await http.post(f"/api/v1/namespaces/{NS}/pods", json=body)
        assert answer.status_code == 400
        assert answer.json()["message"].endswith(
            "cannot unmarshal number into Go struct field Container.spec.containers.image of "
            "type string"
        )


async def test_a_pod_without_containers_is_invalid(sim: SimCluster) -> None:
    async with sim_http(sim) as http:
        answer = await http.post(
            f"/api/v1/namespaces/{NS}/pods",
            json={"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "empty"}, "spec": {}},
        )
        assert answer.status_code == 422, answer.text
        status = answer.json()
        assert status["message"] == 'Pod "empty" is invalid: spec.containers: Required value'
        assert status["details"]["causes"] == [
            {
                "reason": "FieldValueRequired",
                "message": "Required value",
                "field": "spec.containers",
            }
        ]
        answer = await http.post(
            f"/api/v1/namespaces/{NS}/pods", json=_pod("noimage", container={"image": ""})
        )
        assert answer.status_code == 422
        assert "spec.containers[0].image: Required value" in answer.json()["message"]


async def test_a_quantity_may_be_a_number_and_is_kept_as_its_string(sim: SimCluster) -> None:
    body = _pod("sized", container={"resources": {"limits": {"cpu": 1, "memory": "1Gi"}}})
    async with sim_http(sim) as http:
        answer = await http.post(f"/api/v1/namespaces/{NS}/pods", json=body)
    assert answer.status_code == 201, answer.text
    assert answer.json()["spec"]["containers"][0]["resources"]["limits"] == {
        "cpu": "1",
        "memory": "1Gi",
    }


async def test_patches_follow_the_same_directive(sim: SimCluster) -> None:
    merge = {"Content-Type": "application/merge-patch+json"}
    path = "/api/v1/nodes/gpu-h100-01"
    async with sim_http(sim) as http:
        patch = json.dumps({"metadata": {"labels": {"a": "b"}}, "spec": {"unschedulabel": True}})
        answer = await http.patch(
            path, params={"fieldValidation": "Strict"}, content=patch, headers=merge
        )
        assert answer.status_code == 422, answer.text
        status = answer.json()
        assert status["reason"] == "Invalid"
        cause = status["details"]["causes"][0]
        assert cause["field"] == "patch"
        assert cause["message"].endswith(
            'strict decoding error: unknown field "spec.unschedulabel"'
        )
        node = (await http.get(path)).json()
        assert "a" not in node["metadata"].get("labels", {}), "nothing of a refused patch stays"
        answer = await http.patch(path, content=patch, headers=merge)
        assert answer.status_code == 200, answer.text
        assert _warnings(answer) == ['299 - "unknown field \\"spec.unschedulabel\\""']
        assert answer.json()["metadata"]["labels"]["a"] == "b"
        assert "unschedulabel" not in answer.json()["spec"]
        bad = json.dumps({"spec": {"unschedulable": "yes"}})
        answer = await http.patch(path, content=bad, headers=merge)
        assert answer.status_code == 422
        assert "of type bool" in answer.json()["details"]["causes"][0]["message"]


async def test_an_unknown_directive_is_invalid(sim: SimCluster) -> None:
    async with sim_http(sim) as http:
        answer = await http.post(
            f"/api/v1/namespaces/{NS}/pods",
            params={"fieldValidation": "Loud"},
            json=_pod("loud"),
        )
    assert answer.status_code == 422
    assert answer.json()["details"]["causes"][0]["field"] == "fieldValidation"


async def test_nodewards_client_gets_a_misspelt_field_dropped_and_logs_why(
    sim: SimCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """nodeward's client, like the official one, sends no fieldValidation: Warn, as on a real
    cluster. The field is gone from what is stored, and the server's warning is logged."""
    path = sim.write_kubeconfig(tmp_path / "kubeconfig")
    kube = KubeClient.from_settings(ClusterSettings(kubeconfig=path))
    try:
        body = _pod("py") | {"metadata": {"name": "py", "namespace": NS, "labelz": {"a": "b"}}}
        created = await kube.request("POST", f"/api/v1/namespaces/{NS}/pods", body=body)
    finally:
        await kube.close()
    assert "labelz" not in created["metadata"]
    err = capsys.readouterr().err
    assert "kube.api_warning" in err and 'unknown field "metadata.labelz"' in err


async def test_warnings_fail_mode_refuses_what_would_be_dropped(sim: SimCluster) -> None:
    sim.warnings_fail = True
    async with sim_http(sim) as http:
        answer = await http.post(f"/api/v1/namespaces/{NS}/pods", json=_pod("failing", bogus=1))
        assert answer.status_code == 400
        assert 'unknown field "bogus"' in answer.json()["message"]
        answer = await http.post(f"/api/v1/namespaces/{NS}/pods", json=_pod("clean"))
        assert answer.status_code == 201


KUBECTLS = [b for b in kubectl_binaries() if kubectl_version(b)]


@pytest.mark.peer("kubectl")
@pytest.mark.skipif(not KUBECTLS, reason="kubectl is not installed")
@pytest.mark.parametrize("binary", KUBECTLS, ids=[kubectl_version(b) for b in KUBECTLS])
async def test_kubectl_refuses_a_misspelt_manifest(
    sim: SimCluster, tmp_path: Path, binary: str
) -> None:
    """kubectl 1.27 and later ask for `fieldValidation=Strict` and print the server's error;
    older ones validate against /openapi/v2 themselves. Either way nothing is created."""
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(
        f"apiVersion: v1\nkind: Pod\nmetadata: {{name: typo, namespace: {NS}}}\n"
        "spec:\n  containers:\n  - {name: main, image: busybox, imagePullPolicyy: Always}\n"
    )
    rc, _, err = await run_kubectl(sim, tmp_path, "create", "-f", str(manifest), binary=binary)
    assert rc != 0
    assert "imagePullPolicyy" in err
    async with sim_http(sim) as http:
        assert (await http.get(f"/api/v1/namespaces/{NS}/pods/typo")).status_code == 404


async def test_a_status_body_is_written_as_the_api_server_writes_it(sim: SimCluster) -> None:
    """`metav1.Status` in its field order, compact, with the Encoder's trailing newline (what a
    real 1.30+ server answers for a missing pod, byte for byte)."""
    async with sim_http(sim) as http:
        answer = await http.get(f"/api/v1/namespaces/{NS}/pods/nope")
    assert answer.status_code == 404
    assert answer.content == (
        b'{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure",'
        b'"message":"pods \\"nope\\" not found","reason":"NotFound",'
        b'"details":{"name":"nope","kind":"pods"},"code":404}\n'
    )
