"""`nodeward report --by group|experiment` as a user runs it: the accounting service's
rollups charged by the namespaces' directory labels, read from the cluster."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

from nodeward.config import ClusterSettings
from nodeward.kube import Cluster
from nodeward.kube.client import KubeClient
from schemas.directory import EXPERIMENT, GROUP
from services.accounting.report import UNKNOWN
from services.accounting.state import hour_of
from tests.conftest import wait_for
from tests.integration.accounting_fixtures import EnvFactory
from tests.integration.test_accounting import KWH, _approx, _inject

pytestmark = [pytest.mark.timeout(90)]


async def test_report_by_group_and_experiment(accounting_env: EnvFactory, tmp_path: Path) -> None:
    env = await accounting_env()
    await env.start()
    hour = hour_of(datetime.now(UTC)) - timedelta(hours=3)
    await _inject(env, hour)
    await wait_for(env.settled, timeout=30, what="every event handled")
    admin = env.sim.write_kubeconfig(tmp_path / "kubeconfig-admin")
    async with Cluster(KubeClient.from_settings(ClusterSettings(kubeconfig=admin))) as cluster:
        await cluster.namespaces.merge_metadata(
            env.ns1, labels={GROUP: "physics", EXPERIMENT: "atlas"}
        )
    config = tmp_path / "config-with-cluster.yaml"
    config.write_text(
        yaml.safe_dump(
            yaml.safe_load(env.config.read_text()) | {"cluster": {"kubeconfig": str(admin)}}
        )
    )
    env.config = config
    until = hour + timedelta(hours=1)
    for by, labelled in (("group", "physics"), ("experiment", "atlas")):
        code, out, err = await env.report(
            "--since", hour.isoformat(), "--until", until.isoformat(), "--by", by,
            "--format", "csv",
        )  # fmt: skip
        assert code == 0, err
        rows = {row[by]: row for row in csv.DictReader(io.StringIO(out))}
        assert set(rows) == {labelled, UNKNOWN}, rows
        assert float(rows[labelled]["energy_kwh"]) == _approx(6 * 162_000 / KWH)
        assert float(rows[UNKNOWN]["energy_kwh"]) == _approx(6 * 312_000 / KWH)
        assert float(rows[labelled]["gpu_hours"]) == _approx(2.0)
        assert float(rows[labelled]["co2e_kg"]) == _approx(6 * 162_000 / KWH * 100 / 1000)
