"""Benchmark: what signing in through the NATS auth callout costs, against static nkey users.

Two real nats-servers in one run: one with `auth_callout` (the chart's default mode, the
block of `nodeward.nats_auth.callout_authorization`) and nodeward's callout daemon in
this process, asking the sim cluster (in process, over HTTPS) for each TokenReview and
pod; the other with one nkey user per agent (the chart's `nkeys` mode, no callout). For
each: the connect time of `--sequential` agents one after another (p50, p95), and a herd of
`--herd` agents connecting at once, as after a NATS restart (time until all are in, p95
of each). `--rounds` rounds, medians printed, with the ratio callout / nkeys.

Usage: python bench/auth_callout.py [--sequential 50] [--herd 200] [--rounds 3]
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import nats
import nkeys

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchlib import options

from launch.access import AGENT_GRANTS, GRANTS, READERS
from nodeward.bus.server import EmbeddedNats
from nodeward.callout.service import build
from nodeward.config import AuthCalloutSettings, BusSettings, ClusterSettings, Settings
from nodeward.logs import configure_logging
from nodeward.nats_auth import (
    agent_inbox,
    callout_authorization,
    node_agent_nkey,
    permissions_document,
    render_authorization,
    write_seed,
)
from sim.cluster import SimCluster

NAMESPACE = "nodeward"


async def _tokens(sim: SimCluster, count: int) -> list[tuple[str, str]]:
    """(node, pod-bound token) for `count` agent pods spread over the sim's nodes."""
    import ssl

    context = ssl.create_default_context(cadata=sim.tls.ca_pem.decode())
    headers = {"Authorization": f"Bearer {sim.identities['admin'].token}"}
    out = []
    async with httpx.AsyncClient(base_url=sim.url, verify=context, headers=headers) as http:
        nodes = [n["metadata"]["name"] for n in (await http.get("/api/v1/nodes")).json()["items"]]
        for i in range(count):
            node = nodes[i % len(nodes)]
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"nodeward-agent-{i}"},
                "spec": {
                    "serviceAccountName": "nodeward-agent",
                    "nodeName": node,
                    "containers": [{"name": "agent", "image": "nodeward:bench"}],
                },
            }
            made = (await http.post(f"/api/v1/namespaces/{NAMESPACE}/pods", json=pod)).json()
            ref = {
                "kind": "Pod",
                "apiVersion": "v1",
                "name": made["metadata"]["name"],
                "uid": made["metadata"]["uid"],
            }
            request = {
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {"audiences": ["nats"], "expirationSeconds": 3600, "boundObjectRef": ref},
            }
            answer = await http.post(
                f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/nodeward-agent/token", json=request
            )
            out.append((node, answer.json()["status"]["token"]))
    return out


async def _connect(url: str, inbox: str, **login: Any) -> float:
    began = time.perf_counter()
    nc = await nats.connect(
        url, inbox_prefix=inbox, allow_reconnect=False, connect_timeout=30, **login
    )
    took = time.perf_counter() - began
    await nc.close()
    return took


async def _measure(
    url: str, logins: list[tuple[str, dict[str, Any]]], sequential: int
) -> dict[str, float]:
    one = [await _connect(url, agent_inbox(node), **login) for node, login in logins[:sequential]]
    began = time.perf_counter()
    herd = await asyncio.gather(
        *(_connect(url, agent_inbox(node), **login) for node, login in logins)
    )
    wall = time.perf_counter() - began
    return {
        "sequential_p50_ms": statistics.median(one) * 1000,
        "sequential_p95_ms": statistics.quantiles(one, n=20)[-1] * 1000,
        "herd_all_in_s": wall,
        "herd_p95_ms": statistics.quantiles(herd, n=20)[-1] * 1000,
    }


async def one_round(tmp: Path, sequential: int, herd: int) -> dict[str, dict[str, float]]:
    async with SimCluster(port=0) as sim:
        tokens = await _tokens(sim, herd)
        issuer = write_seed(tmp / "issuer.nk", nkeys.PREFIX_BYTE_ACCOUNT)
        user = write_seed(tmp / "user.nk", nkeys.PREFIX_BYTE_USER)
        (tmp / "callout.conf").write_text(callout_authorization(issuer, user))
        permissions = tmp / "permissions.json"
        permissions.write_text(json.dumps(permissions_document(GRANTS, AGENT_GRANTS, READERS)))
        seeds = []
        for i, (node, _) in enumerate(tokens):
            path = tmp / f"agent-{i}.nk"
            seeds.append((node, path, write_seed(path, nkeys.PREFIX_BYTE_USER)))
        users = [node_agent_nkey(node, public, AGENT_GRANTS) for node, _, public in seeds]
        (tmp / "nkeys.conf").write_text(render_authorization(users))
        callout_server = await EmbeddedNats(
            tmp / "callout-nats", config_file=tmp / "callout.conf"
        ).start()
        nkeys_server = await EmbeddedNats(
            tmp / "nkeys-nats", config_file=tmp / "nkeys.conf"
        ).start()
        settings = Settings(
            bus=BusSettings(url=callout_server.url, nkey_seed_file=tmp / "user.nk"),
            cluster=ClusterSettings(
                kubeconfig=sim.write_kubeconfig(tmp / "kubeconfig", identity="auth-callout")
            ),
            auth_callout=AuthCalloutSettings(
                issuer_seed_file=tmp / "issuer.nk",
                permissions_file=permissions,
                namespace=NAMESPACE,
            ),
        )
        daemon = await build(settings)
        await daemon.start()
        for _ in range(600):  # the callout subscribed: at most 30 s
            if (await daemon.readiness()).ready:
                break
            await asyncio.sleep(0.05)
        else:
            raise SystemExit("the callout did not become ready")
        try:
            callout = await _measure(
                callout_server.url, [(node, {"token": token}) for node, token in tokens], sequential
            )
            static = await _measure(
                nkeys_server.url,
                [(node, {"nkeys_seed": str(path)}) for node, path, _ in seeds],
                sequential,
            )
        finally:
            await daemon.stop()
            await callout_server.stop()
            await nkeys_server.stop()
        return {"callout": callout, "nkeys": static}


def main() -> None:
    parser = options(__doc__.splitlines()[0], sequential=50, herd=200, rounds=3)
    args = parser.parse_args()
    configure_logging("error")
    rounds = []
    for _ in range(args.rounds):
        with tempfile.TemporaryDirectory() as tmp:
            rounds.append(asyncio.run(one_round(Path(tmp), args.sequential, args.herd)))
    print(
        f"auth callout vs static nkey users: {args.sequential} sequential, a herd of {args.herd}; medians of {args.rounds}"
    )
    for key in rounds[0]["callout"]:
        callout = statistics.median(r["callout"][key] for r in rounds)
        static = statistics.median(r["nkeys"][key] for r in rounds)
        print(
            f"  {key:20} callout {callout:9.1f}   nkeys {static:9.1f}   ratio {callout / static:6.1f}"
        )


if __name__ == "__main__":
    main()
