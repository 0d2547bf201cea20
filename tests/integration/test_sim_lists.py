"""The sim cluster's lists are consistent as the API server's are (etcd range reads at a revision).

Sources: `staging/src/k8s.io/apiserver/pkg/storage/etcd3/store.go` (`GetList`: every page at the
first page's revision, `remainingItemCount` without selectors, 410 for a compacted continue
token with a fresh inconsistent one), `storage/continue.go` (the token), and
`apimachinery/pkg/apis/meta/internalversion/validation` (`ValidateListOptions`), as the API
reference's "Efficient detection of changes" and "Retrieving large results sets in chunks"
describe them.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest

from sim.cluster import SimCluster
from tests.integration.simkube import run_kubectl, sim_http

NS = "chunks"
PODS = f"/api/v1/namespaces/{NS}/pods"


async def _seeded(http: httpx.AsyncClient, count: int = 5) -> None:
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}
    assert (await http.post("/api/v1/namespaces", json=namespace)).status_code == 201
    for i in range(count):
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"p{i}"},
            "spec": {"containers": [{"name": "main", "image": "busybox:1.36"}]},
        }
        assert (await http.post(PODS, json=pod)).status_code == 201


def _names(body: dict[str, Any]) -> list[str]:
    return [i["metadata"]["name"] for i in body["items"]]


async def test_every_page_is_read_at_the_first_pages_revision(sim: SimCluster) -> None:
    async with sim_http(sim) as http:
        await _seeded(http)
        first = (await http.get(PODS, params={"limit": 2})).json()
        rv = first["metadata"]["resourceVersion"]
        assert _names(first) == ["p0", "p1"]
        assert first["metadata"]["remainingItemCount"] == 3
        # between the pages: one pod deleted, one made
        await http.delete(f"{PODS}/p3", params={"gracePeriodSeconds": "0"})
        late = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p9"},
            "spec": {"containers": [{"name": "main", "image": "busybox:1.36"}]},
        }
        await http.post(PODS, json=late)
        names = _names(first)
        cont = first["metadata"]["continue"]
        while cont:
            page = (await http.get(PODS, params={"limit": 2, "continue": cont})).json()
            assert page["metadata"]["resourceVersion"] == rv, "the same snapshot on every page"
            names += _names(page)
            cont = page["metadata"].get("continue", "")
        assert names == ["p0", "p1", "p2", "p3", "p4"], "the list as it was at the first page"
        fresh = (await http.get(PODS)).json()
        assert _names(fresh) == ["p0", "p1", "p2", "p4", "p9"]
        assert int(fresh["metadata"]["resourceVersion"]) > int(rv)


async def test_a_compacted_continue_is_410_with_a_token_that_goes_on(sim: SimCluster) -> None:
    async with sim_http(sim) as http:
        await _seeded(http)
        first = (await http.get(PODS, params={"limit": 2})).json()
        await http.delete(f"{PODS}/p4", params={"gracePeriodSeconds": "0"})
        sim.store.compact()
        answer = await http.get(
            PODS, params={"limit": 2, "continue": first["metadata"]["continue"]}
        )
        assert answer.status_code == 410
        status = answer.json()
        assert status["reason"] == "Expired"
        assert status["message"].startswith("The provided continue parameter is too old")
        onward = (
            await http.get(PODS, params={"limit": 10, "continue": status["metadata"]["continue"]})
        ).json()
        assert _names(onward) == ["p2", "p3"], "the rest, as it is now"


async def test_resource_version_match(sim: SimCluster) -> None:
    async with sim_http(sim) as http:
        await _seeded(http, 2)
        before = (await http.get(PODS)).json()["metadata"]["resourceVersion"]
        await http.delete(f"{PODS}/p0", params={"gracePeriodSeconds": "0"})
        exact = await http.get(
            PODS, params={"resourceVersion": before, "resourceVersionMatch": "Exact"}
        )
        assert _names(exact.json()) == ["p0", "p1"]
        assert exact.json()["metadata"]["resourceVersion"] == before
        newer = await http.get(
            PODS, params={"resourceVersion": before, "resourceVersionMatch": "NotOlderThan"}
        )
        assert _names(newer.json()) == ["p1"]
        alone = await http.get(PODS, params={"resourceVersionMatch": "Exact"})
        assert alone.status_code == 422
        assert "forbidden unless resourceVersion is provided" in alone.json()["message"]
        future = await http.get(
            PODS, params={"resourceVersion": "99999999", "resourceVersionMatch": "NotOlderThan"}
        )
        assert future.status_code == 504
        assert future.json()["message"].startswith("Too large resource version")
        sim.store.compact()
        gone = await http.get(
            PODS, params={"resourceVersion": before, "resourceVersionMatch": "Exact"}
        )
        assert gone.status_code == 410
        assert gone.json()["message"].startswith("too old resource version")


async def test_bad_and_conflicting_continue(sim: SimCluster) -> None:
    async with sim_http(sim) as http:
        await _seeded(http, 3)
        cont = (await http.get(PODS, params={"limit": 1})).json()["metadata"]["continue"]
        both = await http.get(PODS, params={"continue": cont, "resourceVersion": "5"})
        assert both.status_code == 400
        assert (await http.get(PODS, params={"continue": "garbage!"})).status_code == 400


@pytest.mark.peer("kubectl")
@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
async def test_kubectl_chunked_get_lists_everything(sim: SimCluster, tmp_path: Path) -> None:
    async with sim_http(sim) as http:
        await _seeded(http, 7)
    rc, out, err = await run_kubectl(
        sim, tmp_path, "get", "pods", "-n", NS, "--chunk-size=2", "-o", "name"
    )
    assert rc == 0, err
    assert out.split() == [f"pod/p{i}" for i in range(7)]
