"""Benchmark: what the sim cluster's strictness costs per write, this tree against a baseline.

The sim cluster now decodes every body against the served schemas, defaults and admits
pods, tracks field ownership (managedFields) on every write and deletes pods gracefully.
Each tree's sim cluster (this one, and `--baseline`, default 63c7f99, before issue 33's work)
runs in a fresh interpreter with `--nodes` GPU nodes, and is driven over HTTPS as nodeward's
services drive it: a cordon-style strategic-merge PATCH of a node (taint, cordon and
annotation, then taken off) and a pod created then deleted at once (`gracePeriodSeconds=0`).
For each round it reports the median latency of each kind of write and the CPU time per write
of the one process that runs the sim and drives it; the medians over rounds are printed with
their ratios.

Usage: python bench/sim_writes.py [--nodes 200] [--writes 300] [--rounds 3] [--baseline REV]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import ssl
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchlib import options

REPO = Path(__file__).resolve().parents[1]


def _child(tree: Path, nodes: int, writes: int) -> dict[str, float]:
    sys.path.insert(0, str(tree))
    import httpx

    from sim.cluster import SimCluster, load_seed
    from sim.cluster.resize import resize_seed

    async def main() -> dict[str, float]:
        seed = resize_seed(load_seed(), nodes)
        async with SimCluster(seed, port=0) as sim:
            context = ssl.create_default_context(cadata=sim.tls.ca_pem.decode())
            token = sim.identities["admin"].token
            async with httpx.AsyncClient(
                base_url=sim.url, verify=context, headers={"Authorization": f"Bearer {token}"}
            ) as http:
                names = [
                    n["metadata"]["name"] for n in (await http.get("/api/v1/nodes")).json()["items"]
                ]
                smp = {"Content-Type": "application/strategic-merge-patch+json"}
                # the first write of a tree may load its schemas: not timed
                await http.patch(f"/api/v1/nodes/{names[0]}", content="{}", headers=smp)
                patch_ms, create_ms = [], []
                cpu0 = time.process_time()
                for i in range(writes):
                    node = names[i % len(names)]
                    mark = {
                        "metadata": {"annotations": {"nodeward.io/bench": str(i)}},
                        "spec": {
                            "unschedulable": i % 2 == 0,
                            "taints": [{"key": "nodeward.io/bench", "effect": "NoSchedule"}]
                            if i % 2 == 0
                            else None,
                        },
                    }
                    began = time.perf_counter()
                    answer = await http.patch(
                        f"/api/v1/nodes/{node}", content=json.dumps(mark), headers=smp
                    )
                    patch_ms.append((time.perf_counter() - began) * 1000)
                    assert answer.status_code == 200, answer.text
                    pod = {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "metadata": {"name": f"bench-{i}"},
                        "spec": {
                            "nodeName": node,
                            "containers": [{"name": "main", "image": "busybox:1.36"}],
                        },
                    }
                    began = time.perf_counter()
                    made = await http.post("/api/v1/namespaces/default/pods", json=pod)
                    create_ms.append((time.perf_counter() - began) * 1000)
                    assert made.status_code == 201, made.text
                    await http.delete(
                        f"/api/v1/namespaces/default/pods/bench-{i}",
                        params={"gracePeriodSeconds": "0"},
                    )
                cpu = time.process_time() - cpu0
        return {
            "patch_ms": statistics.median(patch_ms),
            "create_ms": statistics.median(create_ms),
            "cpu_ms_per_write": cpu * 1000 / (3 * writes),
        }

    return asyncio.run(main())


def main() -> None:
    parser = options(__doc__.splitlines()[0], nodes=200, writes=300, rounds=3)
    parser.add_argument("--baseline", default="63c7f99")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        os.environ["NODEWARD_LOG_LEVEL"] = "warning"
        print(json.dumps(_child(args.child, args.nodes, args.writes)))
        return
    sys.path.insert(0, str(Path(__file__).parent))
    from benchlib import exported

    argv = ["--nodes", str(args.nodes), "--writes", str(args.writes)]
    results: dict[str, list[dict[str, float]]] = {"baseline": [], "now": []}
    with exported(args.baseline) as old:
        for _ in range(args.rounds):
            for label, tree in (("baseline", old), ("now", REPO)):
                env = os.environ | {"PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
                out = subprocess.run(
                    [sys.executable, __file__, *argv, "--child", str(tree)],
                    capture_output=True,
                    text=True,
                    check=True,
                    env=env,
                )
                got = json.loads(out.stdout.strip().splitlines()[-1])
                results[label].append(got)
                print(f"{label:8} " + "  ".join(f"{k} {v:.2f}" for k, v in got.items()))
    print(f"\nmedians over {args.rounds} rounds ({args.nodes} nodes, {args.writes} writes each):")
    for key in ("patch_ms", "create_ms", "cpu_ms_per_write"):
        before = statistics.median(r[key] for r in results["baseline"])
        now = statistics.median(r[key] for r in results["now"])
        print(f"  {key:17} baseline {before:7.2f}  now {now:7.2f}  ratio {now / before:5.2f}")


if __name__ == "__main__":
    main()
