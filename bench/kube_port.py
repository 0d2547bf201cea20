"""Benchmark: the kube port's quarantine rate, this tree's client against a baseline's.

The sim cluster (`nodeward sim cluster`, its own process, seeded with `--nodes` GPU nodes)
serves the Kubernetes API over HTTPS with its RBAC. One process drives it through the
port, `Cluster.nodes.mark` as the cordon service quarantines: one GET and one PATCH
(strategic merge, with the resourceVersion read) per node, a taint, cordon and an
annotation, `--concurrency` of them in flight, each node marked once per round (then
unmarked, untimed, for the next round). For each client (before: `nodeward/kube/client.py`
at `--baseline`, default e6d5841, on the loop's default executor; now: this tree, on its
own pool of `--pool` threads, each size given) and round it reports quarantines per
second, and prints the medians with the ratio, and the CPU share of a core each process
used while the rounds ran (which one is the limit).

Usage: python bench/kube_port.py [--nodes 500] [--concurrency 64] [--rounds 5]
                                 [--baseline REV] [--pool 32 8]
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchlib import module_at, options, sim_cluster_command  # noqa: E402 - bench/, as python runs it

from nodeward.config import ClusterSettings  # noqa: E402
from nodeward.kube import Cluster  # noqa: E402
from nodeward.kube.client import KubeClient  # noqa: E402
from nodeward.logs import configure_logging  # noqa: E402
from sim.cluster.resize import resize_seed  # noqa: E402
from sim.cluster.seed import load_seed  # noqa: E402

TAINT = "nodeward.io/bench-quarantine"


def baseline(rev: str) -> ModuleType:
    """`nodeward/kube/client.py` as it was at git revision `rev`, as a module of its own."""
    return module_at(rev, "nodeward/kube/client.py", "kube_client_baseline")


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of process `pid` so far (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def round_of(cluster: Cluster, names: list[str], concurrency: int) -> float:
    """Every node in `names` quarantined once, `concurrency` at a time: quarantines/s."""
    gate = asyncio.Semaphore(concurrency)

    async def one(name: str) -> None:
        async with gate:
            await cluster.nodes.mark(
                name,
                add_taints=[(TAINT, "NoSchedule")],
                unschedulable=True,
                annotations={"nodeward.io/bench": "quarantined"},
            )

    start = time.perf_counter()
    await asyncio.gather(*(one(n) for n in names))
    rate = len(names) / (time.perf_counter() - start)

    async def undo(name: str) -> None:
        async with gate:
            await cluster.nodes.remove_taint(name, TAINT)
            await cluster.nodes.set_unschedulable(name, False)

    await asyncio.gather(*(undo(n) for n in names))
    return rate


async def measure(
    clients: dict[str, Any], settings: ClusterSettings, names: list[str], args: Any, sim_pid: int
) -> dict[str, tuple[float, float, float]]:
    """Per client: median quarantines/s, and the CPU share of a core of this process and
    of the sim cluster over its timed rounds."""
    ports = {label: Cluster(make(settings)) for label, make in clients.items()}
    rates: dict[str, list[float]] = {label: [] for label in clients}
    cpu: dict[str, list[tuple[float, float, float]]] = {label: [] for label in clients}
    try:
        for port in ports.values():  # warm: connections, the sim's caches
            await round_of(port, names[: args.concurrency], args.concurrency)
        for _ in range(args.rounds):
            for label, port in ports.items():
                me, sim, wall = time.process_time(), cpu_seconds(sim_pid), time.perf_counter()
                rates[label].append(await round_of(port, names, args.concurrency))
                cpu[label].append(
                    (
                        time.process_time() - me,
                        cpu_seconds(sim_pid) - sim,
                        time.perf_counter() - wall,
                    )
                )
    finally:
        for port in ports.values():
            await port.close()
    out = {}
    for label in clients:
        mine = sum(c[0] for c in cpu[label]) / sum(c[2] for c in cpu[label])
        theirs = sum(c[1] for c in cpu[label]) / sum(c[2] for c in cpu[label])
        out[label] = (statistics.median(rates[label]), mine, theirs)
    return out


def main() -> None:
    parser = options(__doc__.split("\n\n")[0], nodes=500, concurrency=64, rounds=5)
    parser.add_argument("--baseline", default="e6d5841", help="git revision of 'before'")
    parser.add_argument(
        "--pool", type=int, nargs="+", default=[32], help="now's cluster.concurrency (each)"
    )
    args = parser.parse_args()
    configure_logging("warning", "console")
    before = baseline(args.baseline)
    with tempfile.TemporaryDirectory() as tmp:
        seed = resize_seed(load_seed(None), args.nodes)
        seed_file = Path(tmp) / "seed.yaml"
        seed_file.write_text(yaml.safe_dump(seed.model_dump(mode="json", exclude_none=True)))
        kubeconfig = Path(tmp) / "kubeconfig"
        proc = subprocess.Popen(
            sim_cluster_command(seed_file, kubeconfig),
            cwd=REPO,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stdout is not None
            while not proc.stdout.readline().startswith("identities:"):
                if proc.poll() is not None:
                    raise SystemExit("the sim cluster did not start")
            settings = ClusterSettings(kubeconfig=kubeconfig)
            names = [n.name for n in seed.nodes if n.gpu is not None and n.gpu.count > 0]
            clients: dict[str, Any] = {
                "before": lambda s: before.KubeClient.from_settings(s, user_agent="bench/before")
            }
            for pool in args.pool:
                clients[f"now/{pool}"] = lambda s, p=pool: KubeClient.from_settings(
                    s.model_copy(update={"concurrency": p}), user_agent="bench/now"
                )
            got = asyncio.run(measure(clients, settings, names, args, proc.pid))
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    print(
        f"kube port: {len(names)} nodes quarantined (GET + PATCH) per round, "
        f"{args.concurrency} in flight, medians of {args.rounds} rounds"
    )
    print(f"{'client':>8} {'quarantines/s':>14} {'CPU bench':>10} {'CPU sim':>8}")
    for label, (rate, mine, theirs) in got.items():
        print(f"{label:>8} {rate:>14.0f} {mine:>9.0%} {theirs:>8.0%}")
    for label, (rate, _, _) in got.items():
        if label != "before":
            print(f"ratio {label}/before: {rate / got['before'][0]:.2f}x")


if __name__ == "__main__":
    main()
