"""`bench/fleet.py --split`: the fleet at thousands of nodes with every part in a process of
its own, as a deployment runs them, once per replica count (issue 19's figures).

`nodeward up` runs every service, the console and the simulators in one machine; at 5,000
nodes that does not get ready on 2 cores. Here each case starts, from nothing:

- three nats-servers on loopback with routes and JetStream, every stream and bucket R3, the
  streams in `--partitions` partitions (`tests/helpers/nats_cluster`, as the tests do);
- the sim cluster (`nodeward sim cluster`) seeded with `--nodes` GPU nodes (the shipped seed
  resized, as `up --nodes N` does);
- the services that consume what the fleet publishes, each replica `nodeward service <name>`
  with its own kube context: cordon (GPU changes, heartbeats, XID repeats; the breaker and
  rate limit opened wide, so a storm measures the path), culler (sessions), accounting
  (energy, sessions, audit, findings): `R` replicas each; capacity (GPU changes): one, as
  the chart allows;
- a bare consumer (this script with `--bare`): the runtime alone (decode, ack) on the same
  streams and subjects, a non-partitioned durable each, no handler work;
- the fleet (`nodeward sim fleet --nodes N --gpus G`), started last: every node's agents at
  their rates, heartbeats every 30 s.

Then, per case:

1. start-up: the fleet's first publication (a health change per GPU) is a backlog every GPU
   consumer drains; the time each takes and its rate (events acked per second);
2. steady (`--watch` s): every consumer group's lag sampled every 2 s (messages not yet
   acknowledged, summed over a group's partitions, and the age of the oldest), the events
   each acked per second, and CPU per process (% of a core, from /proc);
3. sustained rate (`--pauses` times): every consumer process (services and bare) SIGSTOPped
   for `--pause` s (under the 10 s after which a replica stops a partition it has not
   renewed), then continued; each group's rate while it catches up, the median printed
   with its ratio to the bare consumer of the same stream;
4. a storm: `--faults` XID 79s (default 1 % of the fleet) on device-plugin nodes spread
   over `--storm` s; detect -> taint (injection to the taint seen by a watch on nodes)
   p50/p99/max, and the lag sampled meanwhile.

`--baseline REF` runs the same cases from REF (exported with `git archive`) after this
tree's and prints the ratios. Usage:

    python bench/fleet.py --split [--nodes 5000] [--replicas 1,2] [--partitions 4]
        [--watch 60] [--pause 5] [--pauses 3] [--faults 50] [--storm 5] [--baseline REF]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleetlib import (
    REPO,
    Fault,
    cpu_seconds,
    fleet_ready,
    inject,
    lease_holders,
    pct,
    provision_and_seed,
    service_config,
    spawn,
    stop_all,
    summary,
)

STREAMS = ("GPU", "HEARTBEATS", "SESSIONS", "ENERGY")
BARE = {  # durable -> (stream, subjects): what the services consume of the fleet
    "bare-gpu": ("GPU", ("gpu.health.>",)),
    "bare-heartbeats": ("HEARTBEATS", ("gpu.heartbeat.>",)),
    "bare-sessions": ("SESSIONS", ("session.>",)),
    "bare-energy": ("ENERGY", ("energy.>",)),
}
SCALED = ("cordon", "culler", "accounting")  # R replicas each
SINGLE = ("capacity",)  # one replica (each counts the whole fleet; the chart refuses more)
PARTITION_SUFFIX = re.compile(r"-p\d+$")


@dataclass
class Case:
    replicas: int
    tree: str
    startup: dict[str, tuple[float, float]] = field(default_factory=dict)  # group -> (s, ev/s)
    lag: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    storm_lag: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    rate: dict[str, float] = field(default_factory=dict)  # steady acked events/s
    drain: dict[str, list[float]] = field(default_factory=dict)  # catch-up events/s, per pause
    cpu: dict[str, float] = field(default_factory=dict)  # process -> % of a core
    taint_s: list[float] = field(default_factory=list)
    missed: int = 0
    notes: list[str] = field(default_factory=list)


def _config(args: argparse.Namespace, url: str, kubeconfig: Path, service: str) -> dict[str, Any]:
    config = service_config(url, args.partitions, kubeconfig, f"nodeward-{service}")
    config["services"]["cordon"]["breaker"] = {
        "max_nodes": 100_000,
        "max_percent": 100,
        "calm_period": None,
    }
    return config


async def groups(js: Any) -> dict[str, tuple[int, float, int]]:
    """`stream/durable` (partitions summed) -> (pending, age of the oldest pending, acked)."""
    out: dict[str, tuple[int, float, int]] = {}
    for stream in STREAMS:
        by: dict[str, list[Any]] = {}
        for info in await js.consumers_info(stream):
            by.setdefault(PARTITION_SUFFIX.sub("", info.name), []).append(info)
        for base, infos in by.items():
            out[f"{stream}/{base}"] = await summary(js, stream, infos)
    return out


async def _sample(js: Any, into: dict[str, list[tuple[int, float]]], stop: asyncio.Event) -> None:
    while not stop.is_set():
        with contextlib.suppress(Exception):  # a slow answer: the next sample
            async with asyncio.timeout(5):
                for name, (pending, age, _) in (await groups(js)).items():
                    into.setdefault(name, []).append((pending, age))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 2)


async def _until(js: Any, done: Any, timeout: float, every: float = 1.0) -> dict[str, Any]:
    """Sample the groups until `done(sample)` is true (or `timeout`)."""
    async with asyncio.timeout(timeout):
        while True:
            with contextlib.suppress(Exception):
                sample = await groups(js)
                if done(sample):
                    return sample
            await asyncio.sleep(every)


async def _startup(js: Any, case: Case, began: float, timeout: float) -> None:
    """Time each GPU group's drain of the fleet's start-up burst (pending under 100)."""
    drained: dict[str, float] = {}

    def done(sample: dict[str, tuple[int, float, int]]) -> bool:
        for name, (pending, _, acked) in sample.items():
            if not name.startswith("GPU/") or name in drained:
                continue
            if pending < 100 and acked > 0:  # the burst is the first thing each sees
                drained[name] = time.monotonic() - began
                case.startup[name] = (drained[name], acked / drained[name])
        gpu = [n for n in sample if n.startswith("GPU/") and not n.endswith("-xids")]
        return bool(gpu) and all(n in drained for n in gpu)

    await _until(js, done, timeout, every=0.5)


async def _pause(js: Any, pids: list[int], case: Case, seconds: float) -> None:
    """SIGSTOP every consumer for `seconds`, continue them, and take each group's rate
    while it catches up (until its pending is back to its level before the pause)."""
    before = await groups(js)
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        await asyncio.sleep(seconds)
        at_stop = await groups(js)
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
    t0 = time.monotonic()
    waiting = {
        n: (max(2 * before[n][0], before[n][0] + 20), at_stop[n][2])
        for n in at_stop
        if n in before and at_stop[n][0] > max(2 * before[n][0], before[n][0] + 20)
    }

    def done(sample: dict[str, tuple[int, float, int]]) -> bool:
        for name, (level, acked0) in list(waiting.items()):
            pending, _, acked = sample.get(name, (0, 0.0, acked0))
            if pending <= level:
                spent = time.monotonic() - t0
                case.drain.setdefault(name, []).append((acked - acked0) / spent)
                del waiting[name]
        return not waiting

    with contextlib.suppress(TimeoutError):
        await _until(js, done, 120, every=0.2)
    for name in waiting:
        case.notes.append(f"{name} not caught up within 120 s of a pause")


async def _storm(
    nc: Any, kube: Any, nodes: list[str], args: argparse.Namespace, case: Case, js: Any
) -> None:
    """XID 79 on each of `nodes`, spread over `--storm` s; each timed to its taint."""
    from fleetlib import watch_taints

    rng = random.Random(args.rng)
    faults = {n: Fault(n, rng.randrange(args.gpus), 0.0, 0) for n in nodes}
    ready = asyncio.Event()
    watch = asyncio.create_task(watch_taints(kube, faults, ready))
    stop = asyncio.Event()
    sampler = asyncio.create_task(_sample(js, case.storm_lag, stop))
    try:
        await asyncio.wait_for(ready.wait(), 60)
        began = time.monotonic()
        sent = []
        for i, fault in enumerate(faults.values()):
            await asyncio.sleep(max(0.0, began + i * args.storm / len(faults) - time.monotonic()))
            fault.sent, fault.sent_at = time.monotonic(), time.time()
            sent.append(asyncio.create_task(inject(nc, fault, 45)))
        await asyncio.gather(*sent)
        deadline = time.monotonic() + args.deadline
        while time.monotonic() < deadline and any(f.tainted is None for f in faults.values()):  # noqa: ASYNC110 - the watch task sets it
            await asyncio.sleep(0.2)
    finally:
        stop.set()
        watch.cancel()
        await asyncio.gather(sampler, watch, return_exceptions=True)
    for f in faults.values():
        if f.tainted is None:
            case.missed += 1
            if f.error:
                case.notes.append(f"{f.node}: {f.error}")
        else:
            case.taint_s.append(f.tainted - f.sent)


async def run_case(args: argparse.Namespace, replicas: int, tree: Path, label: str) -> Case:
    import nats
    import yaml

    from nodeward.config import ClusterSettings
    from nodeward.kube import Cluster
    from nodeward.kube.client import KubeClient
    from schemas.state.cordon import NODES
    from services.culler.state import SESSIONS
    from tests.helpers.nats_cluster import start_cluster

    case = Case(replicas, label)
    root = Path(tempfile.mkdtemp(prefix=f"nodeward-fleet-r{replicas}-"))
    began = time.monotonic()

    def say(what: str) -> None:
        print(f"  [{time.monotonic() - began:6.1f} s] {what}", flush=True)

    say(f"{replicas} replica(s): state and logs in {root}")
    cluster = await start_cluster(root / "nats")
    procs: dict[str, subprocess.Popen[bytes]] = {}
    bus: Any = None
    kube: Any = None
    nc: Any = None
    try:
        bus, seed, seed_file, kubeconfig = await provision_and_seed(
            root, cluster.url, args.nodes, args.partitions, "bench/fleet", procs, tree
        )
        js = bus.js
        say(f"nats cluster and sim cluster up ({args.nodes} GPU nodes)")
        configs = {}
        for service in (*SCALED, *SINGLE):
            configs[service] = root / f"{service}.yaml"
            configs[service].write_text(
                yaml.safe_dump(_config(args, cluster.url, kubeconfig, service))
            )
            for r in range(1 if service in SINGLE else replicas):
                name = f"{service}-{chr(ord('a') + r)}"
                procs[name] = spawn(
                    ["service", service, "--config", str(configs[service])],
                    root / f"{name}.log",
                    root,
                    tree,
                )
        procs["bare"] = subprocess.Popen(  # noqa: ASYNC220 - for the whole case
            [sys.executable, __file__, "--bare", cluster.url],
            cwd=root,
            env={**os.environ, "PYTHONPATH": str(tree)},
            stdout=subprocess.DEVNULL,
            stderr=(root / "bare.log").open("w"),
        )
        # Every partition held, each replica with its share, before the fleet starts.
        pids = {n: p.pid for n, p in procs.items()}
        for bucket, lease_group in ((NODES.name, "cordon"), (SESSIONS.name, "culler")):
            mine = [pids[f"{lease_group}-{chr(ord('a') + r)}"] for r in range(replicas)]
            async with asyncio.timeout(240):
                while True:
                    with contextlib.suppress(Exception):
                        held = list(
                            (await lease_holders(js, bucket, args.partitions, lease_group)).values()
                        )
                        if len(held) == args.partitions and all(
                            any(f"-{pid}-" in h for h in held) for pid in mine
                        ):
                            break
                    await asyncio.sleep(0.5)
        await _until(js, lambda s: all(f"{st}/{d}" in s for d, (st, _) in BARE.items()), 120)
        say(f"services up: {', '.join(n for n in procs if n != 'sim-cluster')}")
        procs["fleet"] = spawn(
            [
                *("sim", "fleet", "--nodes", str(args.nodes), "--gpus", str(args.gpus)),
                *("--seed", str(seed_file), "--config", str(configs["cordon"])),
            ],
            root / "fleet.log",
            root,
            tree,
        )
        fleet_began = time.monotonic()
        await fleet_ready(procs["fleet"])
        say(f"fleet ready ({time.monotonic() - fleet_began:.0f} s): every GPU's state out")
        await _startup(js, case, fleet_began, args.drain_timeout)
        say("start-up burst consumed by every GPU consumer")

        # Steady: lag, rate and CPU over the watch.
        cpu0 = {n: cpu_seconds(p.pid) for n, p in procs.items()}
        nats0 = {s.name: cpu_seconds(s.proc.pid) for s in cluster.servers if s.proc}
        first = await groups(js)
        t0 = time.monotonic()
        stop = asyncio.Event()
        sampler = asyncio.create_task(_sample(js, case.lag, stop))
        await asyncio.sleep(args.watch)
        stop.set()
        await sampler
        last = await groups(js)
        spent = time.monotonic() - t0
        case.rate = {n: (last[n][2] - first[n][2]) / spent for n in last if n in first}
        case.cpu = {n: 100 * (cpu_seconds(p.pid) - cpu0[n]) / spent for n, p in procs.items()}
        for s in cluster.servers:
            if s.proc and s.name in nats0:
                case.cpu[f"nats-server {s.name}"] = (
                    100 * (cpu_seconds(s.proc.pid) - nats0[s.name]) / spent
                )
        say(f"steady for {spent:.0f} s")

        consumers = [p.pid for n, p in procs.items() if n not in ("sim-cluster", "fleet")]
        for _ in range(args.pauses):
            await _pause(js, consumers, case, args.pause)
        say(f"{args.pauses} pauses of {args.pause:g} s")

        kube = Cluster(
            KubeClient.from_settings(
                ClusterSettings(kubeconfig=kubeconfig, context="nodeward-admin")
            )
        )
        gpu_nodes = [
            n.name for n in seed.nodes if n.gpu is not None and n.gpu.count and n.dra is None
        ]
        faults = args.faults or max(1, args.nodes // 100)
        nc = await nats.connect(servers=[s.url for s in cluster.servers])
        say(f"storm: {faults} XID 79s over {args.storm:g} s")
        await _storm(nc, kube, random.Random(args.rng).sample(gpu_nodes, faults), args, case, js)
        say(f"storm done: {len(case.taint_s)} tainted, {case.missed} missed")
        return case
    finally:
        stop_all(procs)
        for closing in (nc, kube, bus):
            if closing is not None:
                with contextlib.suppress(Exception):
                    await closing.close()
        await cluster.stop()


def _lag(samples: list[tuple[int, float]]) -> str:
    ages = [a for _, a in samples if a == a]
    return (
        f"max {max(n for n, _ in samples):,} msgs / {max(ages, default=0):.1f} s, "
        f"median {statistics.median(n for n, _ in samples):,.0f} msgs / "
        f"{statistics.median(ages) if ages else 0:.1f} s"
    )


def report(case: Case, args: argparse.Namespace) -> list[str]:
    out = [f"{case.tree}: {case.replicas} replica(s) of cordon, culler and accounting; capacity 1:"]
    out.append("  start-up burst (a change per GPU), drained in / events acked per s:")
    for name, (s, rate) in sorted(case.startup.items()):
        out.append(f"    {name:32} {s:7.1f} s  {rate:8,.0f}/s")
    out.append(f"  steady lag over {args.watch:g} s (sampled every 2 s), events acked per s:")
    for name, samples in sorted(case.lag.items()):
        out.append(f"    {name:32} {_lag(samples)};  {case.rate.get(name, 0):7,.1f}/s")
    out.append(
        f"  sustained: events/s while catching up after a {args.pause:g} s pause"
        f" (median of {args.pauses}), and against the bare consumer of the stream:"
    )
    bare = {n.split("/")[0]: statistics.median(v) for n, v in case.drain.items() if "/bare-" in n}
    for name, rates in sorted(case.drain.items()):
        rate = statistics.median(rates)
        base = bare.get(name.split("/")[0])
        vs = f"  {rate / base:.2f}x bare" if base and "/bare-" not in name else ""
        out.append(f"    {name:32} {rate:8,.0f}/s{vs}")
    out.append("  CPU over the steady watch, % of a core:")
    out.append(
        "    " + ", ".join(f"{n} {c:.0f}" for n, c in sorted(case.cpu.items(), key=lambda x: -x[1]))
    )
    if case.taint_s:
        lat = case.taint_s
        out.append(
            f"  storm detect -> taint: p50 {statistics.median(lat):.2f} s, p99 {pct(lat, 0.99):.2f}"
            f" s, max {max(lat):.2f} s; {case.missed} missed of {len(lat) + case.missed}"
        )
    for name, samples in sorted(case.storm_lag.items()):
        if name.startswith(("GPU/", "HEARTBEATS/")):
            out.append(f"    lag during the storm {name:24} {_lag(samples)}")
    out.extend(f"  note: {n}" for n in case.notes)
    return out


async def bare(url: str) -> None:
    """The bare consumer: the runtime alone on the services' streams, no handler work."""
    from nodeward.bus import Bus, ConsumerSpec, Delivery
    from nodeward.config import BusSettings
    from schemas.base import Event

    bus = await Bus.connect(BusSettings(url=url, provision=False), source="bench/bare")

    async def handle(event: Event[Any], delivery: Delivery) -> None:
        return None

    for durable, (stream, subjects) in BARE.items():
        await bus.consume(ConsumerSpec(name=durable, stream=stream, subjects=subjects), handle)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGINT, stop.set)
    await stop.wait()
    await bus.close(grace=2)


async def main(args: argparse.Namespace) -> None:
    print(
        f"fleet --split: {args.nodes} nodes x {args.gpus} GPUs, {args.partitions} partitions,"
        f" replicas {args.replicas}, {os.cpu_count()} CPUs",
        flush=True,
    )
    from benchlib import exported

    counts = [int(r) for r in args.replicas.split(",")]
    cases = [await run_case(args, r, REPO, "this tree") for r in counts]
    if args.baseline:
        with exported(args.baseline) as tree:
            cases += [await run_case(args, r, tree, f"baseline {args.baseline}") for r in counts]
    print()
    for case in cases:
        print("\n".join(report(case, args)))
    p50 = {(c.tree, c.replicas): statistics.median(c.taint_s) for c in cases if c.taint_s}
    if len(counts) == 2 and ("this tree", counts[0]) in p50 and ("this tree", counts[1]) in p50:
        ratio = p50["this tree", counts[1]] / p50["this tree", counts[0]]
        print(f"detect -> taint p50, {counts[1]} replicas / {counts[0]}: {ratio:.2f}")
    for r in counts:
        if ("this tree", r) in p50 and (f"baseline {args.baseline}", r) in p50:
            ratio = p50["this tree", r] / p50[f"baseline {args.baseline}", r]
            print(f"detect -> taint p50 with {r} replica(s), this tree / baseline: {ratio:.2f}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--pause", type=float, default=5.0, help="seconds each pause lasts")
    parser.add_argument("--pauses", type=int, default=3)
    parser.add_argument("--faults", type=int, default=0, help="default: 1 %% of the nodes")
    parser.add_argument("--drain-timeout", type=float, default=900.0)
    parser.add_argument("--rng", type=int, default=19)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--bare":
        asyncio.run(bare(sys.argv[2]))
