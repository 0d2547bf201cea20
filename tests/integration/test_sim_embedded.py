"""The hook `nodeward up` uses: start the sim cluster, write <state-dir>/kubeconfig, one identity per service."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from launch.access import ACCOUNTS, DECLARED
from nodeward.kube import Cluster, Forbidden
from sim.cluster import SeedError, embedded_cluster


async def test_embedded_cluster_writes_kubeconfig_with_every_identity(tmp_path: Path) -> None:
    async with embedded_cluster(tmp_path / "state") as embedded:
        assert embedded.kubeconfig == tmp_path / "state" / "kubeconfig"
        config = yaml.safe_load(embedded.kubeconfig.read_text())
        assert config["current-context"] == "nodeward-admin"
        assert {c["name"] for c in config["contexts"]} == {"nodeward-admin"} | {
            f"nodeward-{s}" for s in ACCOUNTS
        }
        assert config["clusters"][0]["cluster"]["server"] == embedded.url
        async with Cluster.connect(
            embedded.settings_for("cordon"), access=ACCOUNTS["cordon"]
        ) as cordon:
            assert await cordon.nodes.add_taint(
                "gpu-h100-01", "nodeward.io/gpu-unhealthy", "NoSchedule"
            )
        async with Cluster.connect(embedded.settings_for("credentials")) as unguarded:
            with pytest.raises(Forbidden):
                await unguarded.nodes.get("gpu-h100-01")
        async with Cluster.connect(embedded.settings_for()) as admin:
            assert len(await admin.pods.list()) == 42
        with pytest.raises(KeyError):
            embedded.settings_for("nope")


async def test_embedded_cluster_with_a_bad_seed(tmp_path: Path) -> None:
    seed = tmp_path / "seed.yaml"
    seed.write_text(
        "pods:\n  - {name: a, namespace: x, node: n}\n  - {name: a, namespace: x, node: n}\n"
    )
    with pytest.raises(SeedError, match="already exists"):
        async with embedded_cluster(tmp_path / "state", seed=seed):
            pass


async def test_without_deploy_files_the_roles_come_from_the_declared_access(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sim.cluster import rbac

    monkeypatch.setattr(rbac, "default_rbac_dir", lambda: None)
    async with embedded_cluster(tmp_path, access=DECLARED) as embedded:
        assert set(embedded.sim.identities) == {"admin", *ACCOUNTS}
        async with Cluster.connect(embedded.settings_for("credentials")) as credentials:
            with pytest.raises(Forbidden):
                await credentials.nodes.get("gpu-h100-01")
            assert await credentials.leases.try_acquire("credentials", "me")
