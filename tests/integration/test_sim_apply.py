"""Server-side apply and managedFields on the sim cluster, as the API server keeps them.

Sources: `staging/src/k8s.io/apiserver/pkg/endpoints/handlers/patch.go` (`applyPatcher`;
`fieldManager` required for apply, `force` only for apply), `apimachinery/pkg/util/managedfields`
(operations Apply and Update, `managerOrUserAgent`, the conflict error `Apply failed with 1
conflict: conflict with "m" using v1: .data.a`), and the API reference's "Server-Side Apply"
page (fields an applier drops are removed unless another manager owns them; `--force-conflicts`
takes a field over).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest

from sim.cluster import SimCluster
from tests.helpers.kube import manifest
from tests.integration.simkube import run_kubectl, sim_http

NS = "ml-nlp"
CM = f"/api/v1/namespaces/{NS}/configmaps"
APPLY = {"Content-Type": "application/apply-patch+yaml"}


def _config(data: dict[str, str], labels: dict[str, str] | None = None) -> str:
    meta: dict[str, Any] = {"name": "settings"}
    if labels:
        meta["labels"] = labels
    return json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data})


async def _apply(http: httpx.AsyncClient, manager: str, body: str, **query: str) -> httpx.Response:
    return await http.patch(
        f"{CM}/settings", content=body, headers=APPLY, params={"fieldManager": manager, **query}
    )


async def _edit(http: httpx.AsyncClient, data: str, **query: str) -> httpx.Response:
    """A merge patch of the ConfigMap's data, as an operator's edit (not an apply)."""
    return await http.patch(
        f"{CM}/settings",
        content=f'{{"data":{data}}}',
        headers={"Content-Type": "application/merge-patch+json"},
        params=query,
    )


def _managers(obj: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(e["manager"], e["operation"]): e["fieldsV1"] for e in obj["metadata"]["managedFields"]}


async def test_apply_creates_then_owns_and_prunes_what_it_dropped(sim: SimCluster) -> None:
    async with sim_http(sim) as http:
        made = await _apply(http, "gitops", _config({"a": "1", "b": "2"}, {"team": "ml"}))
        assert made.status_code == 201, made.text
        fields = _managers(made.json())[("gitops", "Apply")]
        assert fields == {
            "f:data": {"f:a": {}, "f:b": {}},
            "f:metadata": {"f:labels": {"f:team": {}}},
        }
        again = await _apply(http, "gitops", _config({"a": "1"}))
        assert again.status_code == 200, again.text
        obj = again.json()
        assert obj["data"] == {"a": "1"}, "b was the applier's alone: dropped, it is removed"
        assert "team" not in (obj["metadata"].get("labels") or {})


async def test_another_managers_field_is_a_conflict_unless_forced(sim: SimCluster) -> None:
    async with sim_http(sim) as http:
        await _apply(http, "gitops", _config({"a": "1"}))
        edited = await _edit(http, '{"a":"2"}', fieldManager="operator")
        assert edited.status_code == 200
        managers = _managers(edited.json())
        assert managers[("operator", "Update")] == {"f:data": {"f:a": {}}}
        assert ("gitops", "Apply") not in managers, "its only field was taken from it"
        conflict = await _apply(http, "gitops", _config({"a": "1"}))
        assert conflict.status_code == 409, conflict.text
        status = conflict.json()
        assert status["message"] == (
            'Apply failed with 1 conflict: conflict with "operator" using v1: .data.a'
        )
        assert status["details"]["causes"] == [
            {
                "reason": "FieldManagerConflict",
                "message": 'conflict with "operator" using v1',
                "field": ".data.a",
            }
        ]
        forced = await _apply(http, "gitops", _config({"a": "1"}), force="true")
        assert forced.status_code == 200
        assert forced.json()["data"] == {"a": "1"}
        assert ("operator", "Update") not in _managers(forced.json())


async def test_a_shared_value_is_no_conflict_and_survives_one_owner(sim: SimCluster) -> None:
    async with sim_http(sim) as http:
        await _apply(http, "one", _config({"a": "1", "b": "2"}))
        both = await _apply(http, "two", _config({"a": "1"}))
        assert both.status_code == 200, both.text
        left = await _apply(http, "one", _config({"b": "2"}))
        assert left.json()["data"] == {"a": "1", "b": "2"}, "a is still two's"


async def test_apply_needs_a_field_manager_and_force_needs_apply(sim: SimCluster) -> None:
    async with sim_http(sim) as http:
        answer = await http.patch(f"{CM}/settings", content=_config({}), headers=APPLY)
        assert answer.status_code == 422
        assert answer.json()["details"]["causes"][0]["field"] == "fieldManager"
        await _apply(http, "gitops", _config({"a": "1"}))
        answer = await _edit(http, '{"a":"3"}', force="true")
        assert answer.status_code == 422
        assert answer.json()["details"]["causes"][0]["field"] == "force"


async def test_a_keyed_list_is_owned_item_by_item(sim: SimCluster) -> None:
    pod = manifest(
        "v1",
        "Pod",
        "applied",
        spec={
            "nodeName": "gpu-h100-01",
            "containers": [{"name": "main", "image": "busybox:1.36"}],
        },
    )
    async with sim_http(sim) as http:
        made = await http.patch(
            f"/api/v1/namespaces/{NS}/pods/applied",
            content=json.dumps(pod),
            headers=APPLY,
            params={"fieldManager": "deployer"},
        )
        assert made.status_code == 201, made.text
        fields = _managers(made.json())[("deployer", "Apply")]
        item = fields["f:spec"]["f:containers"]['k:{"name":"main"}']
        assert item == {".": {}, "f:image": {}, "f:name": {}}


@pytest.mark.peer("kubectl")
@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
async def test_kubectl_apply_server_side(sim: SimCluster, tmp_path: Path) -> None:
    manifest = tmp_path / "cm.yaml"

    async def kubectl(*args: str) -> tuple[int, str, str]:
        return await run_kubectl(sim, tmp_path, *args)

    manifest.write_text(
        f"apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: settings, namespace: {NS}}}\n"
        "data: {a: '1', b: '2'}\n"
    )
    rc, out, err = await kubectl("apply", "--server-side", "-f", str(manifest))
    assert rc == 0, err
    assert "serverside-applied" in out
    async with sim_http(sim) as http:
        edited = await _edit(http, '{"a":"9"}', fieldManager="someone")
        assert edited.status_code == 200
    rc, out, err = await kubectl("apply", "--server-side", "-f", str(manifest))
    assert rc != 0 and "conflict" in err and ".data.a" in err
    rc, out, err = await kubectl("apply", "--server-side", "--force-conflicts", "-f", str(manifest))
    assert rc == 0, err
    async with sim_http(sim) as http:
        assert (await http.get(f"{CM}/settings")).json()["data"] == {"a": "1", "b": "2"}
