"""The Falco response through `nodeward up`: the ingest URL and its token are in
endpoints.json, and POSTing the "Drop and execute new binary in container" sample isolates
that one pod (not its sibling replica) and tells someone, within 2 s."""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from nodeward.config import ClusterSettings
from nodeward.kube.client import KubeClient
from tests.conftest import REPO, wait_for
from tests.e2e.test_cli import NODEWARD
from tests.integration.falco_fixtures import DROP_AND_EXECUTE, samples, sidekick_subject

pytestmark = pytest.mark.timeout(120)

BOB = "bob-llm-finetune-6d5f9c7b8d-q8wzr"
SIBLING = "bob-llm-finetune-6d5f9c7b8d-x2kfp"


async def test_posting_the_sample_isolates_the_one_pod_within_2s(tmp_path: Path) -> None:
    state = tmp_path / "state"
    log = (tmp_path / "up.log").open("w")
    env = {k: v for k, v in os.environ.items() if not k.startswith("NODEWARD_")}
    proc = subprocess.Popen(
        [*NODEWARD, "up", "--state-dir", str(state), "--scenario", "none", "--quiet", "--nodes=1"],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=REPO,
        env=env,
    )
    kube: KubeClient | None = None
    try:
        endpoints_file = state / "endpoints.json"
        await wait_for(endpoints_file.exists, timeout=60, interval=0.1, what="endpoints.json")
        endpoints = json.loads(endpoints_file.read_text())
        url, token_file = endpoints["falco_ingest_url"], Path(endpoints["falco_token_file"])
        assert token_file.parent == state.resolve()
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        token = token_file.read_text().strip()
        # The banner follows endpoints.json: wait for it before reading it.
        await wait_for(
            lambda: "Ctrl-C stops everything" in (tmp_path / "up.log").read_text(),
            timeout=30,
            what="the banner",
        )
        printed = (tmp_path / "up.log").read_text()
        assert f"POST alerts to {url}" in printed and str(token_file) in printed
        assert token not in printed  # the token itself is never printed or logged

        # The shipped seed holds the sample alerts' pods: bob's and its sibling replica.
        kube = KubeClient.from_settings(ClusterSettings(kubeconfig=state / "kubeconfig"))
        listed = await kube.request("GET", "/api/v1/namespaces/user-bob/pods")
        assert {p["metadata"]["name"] for p in listed["items"]} == {BOB, SIBLING}

        async def ready() -> bool:
            async with httpx.AsyncClient() as client:
                answer = await client.get(endpoints["metrics"]["falco"] + "/readyz", timeout=2)
            return answer.status_code == 200

        await wait_for(ready, timeout=20, what="the falco service ready")
        outbox = Path(endpoints["outbox"])
        before = set(outbox.glob("*.txt"))
        alert = next(a for a in samples() if a["rule"] == DROP_AND_EXECUTE)
        began = time.monotonic()
        async with httpx.AsyncClient() as client:
            answer = await client.post(
                url, json=alert, headers={"Authorization": f"Bearer {token}"}, timeout=5
            )
        assert answer.status_code == 200, answer.text

        async def isolated() -> list[str] | None:
            try:
                policy = await kube.request(  # type: ignore[union-attr]
                    "GET",
                    "/apis/networking.k8s.io/v1/namespaces/user-bob/networkpolicies/nodeward-isolate",
                )
            except Exception:  # noqa: BLE001 - not there yet
                return None
            labels = policy["spec"]["podSelector"]["matchLabels"]
            selector = ",".join(f"{k}={v}" for k, v in labels.items())
            pods = await kube.request(  # type: ignore[union-attr]
                "GET", "/api/v1/namespaces/user-bob/pods", query={"labelSelector": selector}
            )
            names = sorted(p["metadata"]["name"] for p in pods["items"])
            return names or None

        assert await wait_for(isolated, timeout=2, what="the isolating NetworkPolicy") == [BOB]

        def noticed() -> list[Path]:
            return [f for f in set(outbox.glob("*.txt")) - before if BOB in f.read_text()]

        notices = await wait_for(
            noticed, timeout=max(0.1, 2 - (time.monotonic() - began)), what="a notice in the outbox"
        )
        assert any("isolate" in f.read_text() for f in notices)
        print(f"policy and notice {time.monotonic() - began:.2f}s after the POST")
    finally:
        if kube is not None:
            await kube.close()
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=30)
        log.close()
        assert code == 0, (tmp_path / "up.log").read_text()[-2000:]


async def test_service_falco_alone_needs_credentials_then_serves(
    tmp_path: Path, nats_url: str
) -> None:
    from sim.cluster import SimCluster
    from sim.falco_samples import sample_seed

    async with SimCluster(sample_seed(), port=0) as sim:
        kubeconfig = sim.write_kubeconfig(tmp_path / "kubeconfig", identity="falco")
        base = [*NODEWARD, "service", "falco", "--nats", nats_url, "--kubeconfig", str(kubeconfig)]
        env = {k: v for k, v in os.environ.items() if not k.startswith("NODEWARD_")}
        env |= {"NODEWARD_SERVICES__FALCO__INGEST__PORT": "0", "NODEWARD_DAEMON__PORT": "0"}
        refused = subprocess.run(
            base, capture_output=True, text=True, env=env, timeout=60, cwd=REPO
        )
        assert refused.returncode == 1
        assert refused.stderr.count("\n") == 1 and "token_file" in refused.stderr, refused.stderr

        token = tmp_path / "token"
        token.write_text("a-long-enough-token-for-falco\n")
        bad = subprocess.run(
            base,
            capture_output=True,
            text=True,
            env=env | {"NODEWARD_SERVICES__FALCO__RULES_FILE": str(tmp_path / "none.yaml")},
            timeout=60,
            cwd=REPO,
        )
        assert bad.returncode == 1 and "none.yaml" in bad.stderr and bad.stderr.count("\n") == 1

        log = (tmp_path / "service.log").open("w")
        config = tmp_path / "config.yaml"
        falco = {
            "consumer": "falco-alone",
            # Only the alert posted here, not what other tests left on the session's NATS.
            "subjects": [sidekick_subject(samples()[0])],
            "ingest": {"port": 0, "token_file": str(token)},
        }
        config.write_text(json.dumps({"services": {"falco": falco}}))
        base = [*base, "--config", str(config)]
        loud = [*NODEWARD, "--log-level", "info", *base[len(NODEWARD) :]]
        proc = subprocess.Popen(loud, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        try:

            def listening() -> str | None:
                for line in (tmp_path / "service.log").read_text().splitlines():
                    found = re.search(r"http://127\.0\.0\.1:\d+/", line)
                    if "falco.ingest_listening" in line and found:
                        return found.group(0)
                return None

            url = await wait_for(listening, timeout=30, interval=0.1, what="the ingest listening")
            async with httpx.AsyncClient() as client:
                answer = await client.post(
                    url,
                    json=samples()[0],
                    headers={"Authorization": "Bearer a-long-enough-token-for-falco"},
                    timeout=5,
                )
            assert answer.status_code == 200, answer.text
        finally:
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(timeout=30)
            log.close()
        assert code == 0, (tmp_path / "service.log").read_text()[-2000:]
