"""Benchmark: `nodeward up --nodes N --scenario none` at fleet size, this tree against a
baseline tree in the same run.

For each tree it starts `nodeward up` (its own state dir, the breaker opened wide so every
injection may quarantine), and measures:

- time to ready: from the start to every daemon's `/readyz` answering 200;
- CPU: the share of a core `up` and its children used over the watch (from /proc);
- the cordon service's lag on the GPU stream, sampled every 2 s for `--watch` seconds
  through consumer info: messages pending (not yet delivered plus delivered and not acked)
  and, in seconds, how long ago the oldest of them was stored; the heartbeat consumer's
  too where the tree has one;
- XID 79 → taint: `--injections` XID 79s on distinct nodes, one at a time, each sent with
  `sim.inject.<node>` and timed until the node shows the taint `nodeward.io/gpu-unhealthy`
  in the Kubernetes API (polled every 20 ms; not within `--deadline`: counted as missed).

The baseline is a git ref exported with `git archive` into a temp dir (default `main`) and
run with the same interpreter.

`--replicas 1,2 --partitions 4` measures this tree once per replica count, with the streams
in that many partitions (`bus.partitions`): `up` runs one cordon replica, and each further
one is `nodeward service cordon` in a process of its own on the same NATS and sim cluster
(its CPU reported apart), measured once the replicas hold their share of the partitions.
Lag is then summed over the partitions' durables (`cordon-p<i>`; the age is of the oldest
message at or after the lowest ack floor, an upper bound), and events/s is what the
consumers acknowledged over the watch. Usage:

    python bench/fleet.py [--nodes 256] [--watch 60] [--injections 5] [--baseline main]
                          [--no-baseline] [--replicas 1,2 --partitions 4] [--storm 10]

`--storm S`: the injections are a storm instead (e.g. `--injections 50` for 1 % of 5,000
nodes): spread evenly over S seconds, concurrent, each timed until a watch on nodes shows
its taint (p50, p99, max), with the cordon consumers' lag sampled during it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fleet_split
from benchlib import exported, options
from fleetlib import REPO, TAINT, cpu_seconds, group, lease_holders

WIDE_BREAKER = {
    "NODEWARD_SERVICES__CORDON__BREAKER__MAX_NODES": "1000",
    "NODEWARD_SERVICES__CORDON__BREAKER__MAX_PERCENT": "100",
    # and the rate limit: a storm measures the path, not the policy's pacing
    "NODEWARD_SERVICES__CORDON__RATE_LIMIT__PER_MINUTE": "1000000",
    "NODEWARD_SERVICES__CORDON__RATE_LIMIT__BURST": "100000",
}


@dataclass
class Result:
    tree: str
    ready_s: float | None = None
    cpu_pct: float | None = None
    lag: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    taint_s: list[float] = field(default_factory=list)
    missed: int = 0
    error: str | None = None
    rate: dict[str, float] = field(default_factory=dict)  # group -> acked events/s
    extra_cpu_pct: list[float] = field(default_factory=list)  # per extra cordon replica


def _ready(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(f"{url}/readyz", timeout=2) as reply:
            return bool(reply.status == 200)
    except OSError:
        return False


async def holders(js: Any, partitions: int) -> set[str]:
    """Who holds the cordon's partition leases now."""
    return set((await lease_holders(js, "cordon", partitions)).values())


async def _measure(
    tree: Path, name: str, args: argparse.Namespace, *, replicas: int = 1, partitions: int = 1
) -> Result:
    import nats

    from nodeward.config import ClusterSettings
    from nodeward.kube import Cluster
    from nodeward.kube.client import KubeClient

    result = Result(name)
    state = Path(tempfile.mkdtemp(prefix=f"nodeward-fleet-{name}-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("NODEWARD_")}
    env |= WIDE_BREAKER | {"PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
    if partitions > 1:
        env["NODEWARD_BUS__PARTITIONS"] = str(partitions)
    extra: list[subprocess.Popen[bytes]] = []
    began = time.monotonic()
    command = ["up", "--state-dir", str(state / "s"), "--nodes", str(args.nodes)]
    proc = subprocess.Popen(  # noqa: ASYNC220 - fork+exec is quick; it runs the whole case
        [sys.executable, "-m", "launch", *command, "--scenario", "none", "--quiet"],
        cwd=state,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=(state / "up.log").open("w"),
    )
    try:
        endpoints_file = state / "s" / "endpoints.json"
        while True:
            if proc.poll() is not None:
                result.error = f"up exited {proc.returncode}; see {state / 'up.log'}"
                return result
            if endpoints_file.exists():
                endpoints = json.loads(endpoints_file.read_text())
                if all(_ready(u) for u in endpoints["metrics"].values()):
                    break
            if time.monotonic() - began > args.ready_timeout and endpoints_file.exists():
                print(f"  {name}: not ready within {args.ready_timeout:g} s; measured as is")
                break
            await asyncio.sleep(0.5)
        if time.monotonic() - began <= args.ready_timeout:
            result.ready_s = time.monotonic() - began
            print(f"  {name}: ready in {result.ready_s:.1f} s", flush=True)
        nc = await nats.connect(endpoints["nats_url"])
        js = nc.jetstream()
        for i in range(1, replicas):
            extra.append(
                subprocess.Popen(  # noqa: ASYNC220 - a replica for the whole case
                    [
                        *(sys.executable, "-m", "launch", "service", "cordon"),
                        *("--nats", endpoints["nats_url"]),
                        *("--kubeconfig", endpoints["kubeconfig"]),
                    ],
                    cwd=state,
                    env=env
                    | {
                        "NODEWARD_CLUSTER__CONTEXT": "nodeward-cordon",
                        "NODEWARD_DAEMON__PORT": "0",
                    },
                    stdout=subprocess.DEVNULL,
                    stderr=(state / f"cordon-{i}.log").open("w"),
                )
            )
        if replicas > 1:
            shared = time.monotonic()
            while len(await holders(js, partitions)) < replicas:
                if time.monotonic() - shared > 120:
                    result.error = f"the partitions were not shared; see {state}"
                    return result
                await asyncio.sleep(0.5)
            print(f"  {name}: partitions shared in {time.monotonic() - shared:.1f} s", flush=True)
        groups = (("GPU", "cordon"), ("HEARTBEATS", "cordon-heartbeats"))
        acked0: dict[str, int] = {}
        cpu0 = cpu_seconds(proc.pid)
        extra0 = [cpu_seconds(p.pid) for p in extra]
        watch_began = time.monotonic()
        while time.monotonic() - watch_began < args.watch:
            for stream, consumer in groups:
                sample = await group(js, stream, consumer)
                if sample is not None:
                    key = f"{stream}/{consumer}"
                    result.lag.setdefault(key, []).append(sample[:2])
                    acked0.setdefault(key, sample[2])
                    span = time.monotonic() - watch_began
                    if span > 0:
                        result.rate[key] = (sample[2] - acked0[key]) / span
            await asyncio.sleep(2)
        spent = time.monotonic() - watch_began
        result.cpu_pct = 100 * (cpu_seconds(proc.pid) - cpu0) / spent
        result.extra_cpu_pct = [
            100 * (cpu_seconds(p.pid) - c0) / spent for p, c0 in zip(extra, extra0, strict=True)
        ]
        kube = Cluster(
            KubeClient.from_settings(ClusterSettings(kubeconfig=Path(endpoints["kubeconfig"])))
        )
        listed = await kube.nodes.list(label_selector="nvidia.com/gpu.present=true")
        # Device-plugin nodes: there an XID 79 quarantines the node (on a DRA node it
        # taints the one device, and the node stays in service).
        plugin = [n for n in listed if "nvidia.com/gpu" in n.get("status", {}).get("capacity", {})]
        nodes = [n["metadata"]["name"] for n in plugin][-args.injections :]
        if args.storm:
            await _storm(nc, js, kube, nodes, groups, result, args)
        for node in nodes if not args.storm else []:
            result_s = await _inject_and_time(nc, kube, node, args.deadline)
            if result_s is None:
                result.missed += 1
                print(f"  {name}: {node} not tainted within {args.deadline:g} s", flush=True)
            else:
                result.taint_s.append(result_s)
        await nc.close()
        await kube.close()
        return result
    finally:
        for p in [*extra, proc]:
            p.send_signal(signal.SIGINT)
        for p in [*extra, proc]:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()


async def _tainted(kube: Any, node: str) -> bool:
    from nodeward.kube.nodes import taints_of

    return any(t.get("key") == TAINT for t in taints_of(await kube.nodes.get(node)))


async def _storm(
    nc: Any,
    js: Any,
    kube: Any,
    nodes: list[str],
    groups: tuple[tuple[str, str], ...],
    result: Result,
    args: argparse.Namespace,
) -> None:
    """`nodes` each get an XID 79, spread evenly over `--storm` seconds; each is timed until
    a watch on nodes shows its taint, and the cordon consumers' lag is sampled meanwhile."""
    from nodeward.kube.nodes import taints_of

    sent: dict[str, float] = {}
    tainted: dict[str, float] = {}
    listing = await kube.nodes.listing()

    async def watch() -> None:
        async for event in kube.nodes.watch(resource_version=listing.resource_version):
            node = event.object.get("metadata", {}).get("name")
            hit = any(t.get("key") == TAINT for t in taints_of(event.object))
            if hit and node in sent and node not in tainted:
                tainted[node] = time.monotonic()

    async def sample() -> None:
        while True:
            for stream, consumer in groups:
                with contextlib.suppress(Exception):
                    got = await group(js, stream, consumer)
                    if got is not None:
                        result.lag.setdefault(f"{stream}/{consumer} (storm)", []).append(got[:2])
            await asyncio.sleep(2)

    async def inject(node: str, at: float) -> None:
        await asyncio.sleep(max(0.0, at - time.monotonic()))
        sent[node] = time.monotonic()
        request = json.dumps({"gpu": 0, "xid": 79}).encode()
        with contextlib.suppress(Exception):  # counted as missed below
            await nc.request(f"sim.inject.{node}", request, timeout=args.deadline)

    tasks = [asyncio.create_task(watch()), asyncio.create_task(sample())]
    began, step = time.monotonic(), args.storm / max(len(nodes), 1)
    await asyncio.gather(*(inject(n, began + i * step) for i, n in enumerate(nodes)))
    end = time.monotonic() + args.deadline
    while len(tainted) < len(nodes) and time.monotonic() < end:  # noqa: ASYNC110 - the watch's
        await asyncio.sleep(0.1)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    result.taint_s = [tainted[n] - sent[n] for n in nodes if n in tainted]
    result.missed = len(nodes) - len(result.taint_s)
    if result.missed:
        print(f"  not tainted: {', '.join(n for n in nodes if n not in tainted)}", flush=True)


async def _inject_and_time(nc: Any, kube: Any, node: str, deadline: float) -> float | None:
    began = time.monotonic()
    request = json.dumps({"gpu": 0, "xid": 79}).encode()
    await nc.request(f"sim.inject.{node}", request, timeout=deadline)
    while time.monotonic() - began < deadline:
        if await _tainted(kube, node):
            return time.monotonic() - began
        await asyncio.sleep(0.02)
    return None


def _report(r: Result, args: argparse.Namespace) -> list[str]:
    if r.error:
        return [f"{r.tree}: {r.error}"]
    ready = (
        f"ready in {r.ready_s:.1f} s"
        if r.ready_s is not None
        else f"not every daemon ready within {args.ready_timeout:g} s"
    )
    lines = [
        f"{r.tree}: {ready}; {r.cpu_pct:.0f} % of a core (up and its children) over"
        f" {args.watch:g} s"
    ]
    if r.extra_cpu_pct:
        lines.append(
            "  further cordon replicas: "
            + ", ".join(f"{c:.0f} % of a core" for c in r.extra_cpu_pct)
        )
    for consumer, samples in r.lag.items():
        counts = [c for c, _ in samples]
        ages = [a for _, a in samples if a == a]
        tail = samples[-len(samples) // 2 :]  # the second half: steady state
        lines.append(
            f"  lag {consumer}: pending max {max(counts)}, last {counts[-1]}, median of the"
            f" second half {statistics.median(c for c, _ in tail):.0f}; oldest pending max"
            f" {max(ages, default=0):.1f} s, last {samples[-1][1]:.1f} s"
            + (f"; {r.rate[consumer]:.0f} events/s acked" if consumer in r.rate else "")
        )
    if r.taint_s:
        ordered = sorted(r.taint_s)
        p99 = ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]
        lines.append(
            f"  XID 79 -> taint over {len(r.taint_s)} injection(s)"
            + (f" in a {args.storm:g} s storm" if args.storm else "")
            + f": median {statistics.median(r.taint_s):.2f} s, p99 {p99:.2f} s,"
            f" max {max(r.taint_s):.2f} s"
            + (f"; {r.missed} missed the {args.deadline:g} s deadline" if r.missed else "")
        )
    else:
        lines.append(f"  XID 79 -> taint: none within {args.deadline:g} s ({r.missed} tried)")
    return lines


async def main() -> None:
    parser = options(__doc__.splitlines()[0], nodes=256)
    parser.add_argument("--watch", type=float, default=60.0, help="seconds of lag sampling")
    parser.add_argument("--injections", type=int, default=5)
    parser.add_argument(
        "--storm", type=float, default=0.0, help="spread the injections over this many seconds"
    )
    parser.add_argument("--deadline", type=float, default=15.0, help="seconds per injection")
    parser.add_argument("--ready-timeout", type=float, default=240.0)
    parser.add_argument(
        "--baseline", default=None, help="git ref to compare with (main; --split: none)"
    )
    parser.add_argument("--no-baseline", action="store_true")
    parser.add_argument("--no-this", action="store_true", help="the baseline alone")
    parser.add_argument("--replicas", default="", help="e.g. 1,2: cordon replicas per case")
    parser.add_argument("--partitions", type=int, default=4, help="with --replicas")
    parser.add_argument(
        "--split", action="store_true", help="every part a process of its own (fleet_split.py)"
    )
    fleet_split.add_arguments(parser)
    args = parser.parse_args()
    if not args.split:
        args.baseline = args.baseline or "main"
    if args.split:
        args.replicas = args.replicas or "1,2"
        args.storm = args.storm or 5.0
        args.deadline = max(args.deadline, 60.0)
        await fleet_split.main(args)
        return
    print(f"nodeward up --nodes {args.nodes} --scenario none, {os.cpu_count()} CPUs", flush=True)
    results = []
    if args.replicas:
        for n in (int(x) for x in args.replicas.split(",")):
            label = f"this tree, {n} cordon replica(s), {args.partitions} partitions"
            results.append(
                await _measure(REPO, label, args, replicas=n, partitions=args.partitions)
            )
    elif not args.no_this:
        results.append(await _measure(REPO, "this tree", args))
    if not args.no_baseline:
        with exported(args.baseline) as tree:
            results.append(await _measure(tree, f"baseline {args.baseline}", args))
    print()
    for r in results:
        print("\n".join(_report(r, args)))
    if len(results) == 2 and all(r.taint_s for r in results) and not args.replicas:
        a, b = (statistics.median(r.taint_s) for r in results)
        print(f"XID 79 -> taint median, this tree / baseline: {a / b:.2f}")


if __name__ == "__main__":
    asyncio.run(main())
