"""Benchmark and check: a fault storm over a simulated fleet while one nats-server of three
and one cordon replica are SIGKILLed (issue 19, "Chaos at scale").

What runs, each in a process of its own:

- three nats-servers on loopback with routes and JetStream (`tests/helpers/nats_cluster`,
  as the test fixture starts them), every stream and bucket R3, the streams in
  `--partitions` partitions (`bus.partitions`);
- the sim cluster (`nodeward sim cluster`) seeded with `--nodes` GPU nodes, the shipped seed
  resized as `nodeward up --nodes N` does (`launch.demo.sim_seed`);
- two cordon replicas (`nodeward service cordon`, partitioned), the breaker set to
  `--breaker` nodes (100 %, no calm period) and the rate limit opened wide, so the breaker
  alone refuses;
- the fleet (`nodeward sim fleet --nodes N --gpus 8`): every node's agents at their rates,
  heartbeats every 30 s.

Once the replicas share the partitions and the fleet's start-up burst is consumed, the
storm: `--faults` nodes (default 1 % of the fleet) each get an XID 79 on one GPU, spread
over `--storm` seconds (`sim.inject.<node>`; the fleet answers once the events are
acknowledged, with their stream sequences, sending again until they are, as an agent's
outbox does). At 40 % of the storm the GPU stream's leader (a nats-server) is SIGKILLed,
at 60 % the second cordon replica. Then it waits until every acknowledged fault has a
quarantine audit (or `--deadline`) and checks:

- no acknowledged event lost: each acknowledged fault's health change is in the GPU stream
  at its sequence, and its node has a quarantine audit (`remediation.quarantine.<node>`);
- nothing applied twice: at most one applied quarantine audit per node, at most one taint
  `nodeward.io/gpu-unhealthy` per node in the API, and as many tainted nodes as applied;
- up to the breaker's limit: min(faults, breaker) nodes quarantined, every other faulted
  node refused with guard `breaker` (audited), counted;
- takeover: the survivor holds every partition (KV leases `lease.cordon.p<i>`), and when;
- figures: detect → taint (from the injection to the taint seen by a watch on nodes) p50,
  p99, apart for the killed replica's partitions; the cordon consumers' lag (max over the
  run; pending messages summed over the partitions' durables, age of the oldest); CPU per
  replica, fleet and nats-server.

It exits 1 if a check fails. Usage (`--quick`: 200 nodes, 20 faults, breaker 12, < 1 min
of storm and checks; the start-up takes what it takes):

    PYTHONPATH=$PWD python bench/chaos.py [--nodes 5000] [--quick] [--partitions 4]
        [--faults N] [--breaker 30] [--storm 5] [--ack-wait 30s] [--lease-ttl 20s]
        [--kill-leader-of GPU] [--no-kill]

`--no-kill`: the same storm with nothing killed (the calm figures to compare with).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchlib import options

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from fleetlib import (  # noqa: E402 - bench/fleetlib.py, this folder
    TAINT,
    Fault,
    provision_and_seed,
    service_config,
)
from fleetlib import cpu_seconds as _cpu_seconds  # noqa: E402
from fleetlib import fleet_ready as _fleet_ready  # noqa: E402
from fleetlib import group as _group  # noqa: E402
from fleetlib import inject as _inject  # noqa: E402
from fleetlib import lease_holders as _holders  # noqa: E402
from fleetlib import of as _of  # noqa: E402
from fleetlib import pct as _pct  # noqa: E402
from fleetlib import spawn as _spawn  # noqa: E402
from fleetlib import stop_all as _stop_all  # noqa: E402
from fleetlib import watch_taints as _watch_taints  # noqa: E402

from schemas.tokens import token  # noqa: E402 - after the path

GROUPS = (("GPU", "cordon"), ("HEARTBEATS", "cordon-heartbeats"))


@dataclass
class Run:
    faults: list[Fault] = field(default_factory=list)
    lag: dict[str, list[tuple[float, int, float]]] = field(default_factory=dict)  # (t, n, age)
    steady: float = 0.0  # monotonic: the start-up burst consumed
    nats_killed: str | None = None
    nats_killed_at: float | None = None
    replica_killed_at: float | None = None
    killed_partitions: list[int] = field(default_factory=list)
    takeover_s: float | None = None
    cpu: dict[str, float] = field(default_factory=dict)  # name -> % of a core
    audits: dict[str, list[Any]] = field(default_factory=dict)  # node -> audit events
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _config(args: argparse.Namespace, url: str, kubeconfig: Path) -> dict[str, Any]:
    config = service_config(url, args.partitions, kubeconfig, "nodeward-cordon")
    config["log"]["level"] = args.log_level
    cordon = config["services"]["cordon"]
    cordon["breaker"] = {"max_nodes": args.breaker, "max_percent": 100, "calm_period": None}
    cordon |= {"ack_wait": args.ack_wait} if args.ack_wait else {}
    cordon |= {"lease_ttl": args.lease_ttl} if args.lease_ttl else {}
    return config


async def _read(js: Any, stream: str, subject: str) -> list[Any]:
    """Every message of `stream` on `subject` (an ephemeral pull consumer)."""
    info = await js.stream_info(stream, subjects_filter=subject)
    total = sum((info.state.subjects or {}).values())
    out: list[Any] = []
    if not total:
        return out
    psub = await js.pull_subscribe(subject, stream=stream)
    try:
        while len(out) < total:
            out.extend(await psub.fetch(min(total - len(out), 500), timeout=5))
    finally:
        await psub.unsubscribe()
    return out


async def _audits(js: Any) -> dict[str, list[Any]]:
    """Quarantine audit events by node."""
    from schemas import decode

    out: dict[str, list[Any]] = {}
    for m in await _read(js, "AUDIT", "remediation.quarantine.>"):
        event = decode(m.subject, m.headers, m.data)
        out.setdefault(event.data.target.name, []).append(event)
    return out


async def _sample_lag(js: Any, run: Run, stop: asyncio.Event) -> None:
    while not stop.is_set():
        for stream, consumer in GROUPS:
            with contextlib.suppress(Exception):  # a server down: the next sample
                sample = await _group(js, stream, consumer)
                if sample is not None:
                    run.lag.setdefault(f"{stream}/{consumer}", []).append(
                        (time.monotonic(), *sample[:2])
                    )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 2)


async def _takeover(js: Any, bucket: str, partitions: int, survivor: int, run: Run) -> None:
    """When the survivor holds every partition's lease (polled every 0.1 s from the kill)."""
    while True:
        with contextlib.suppress(Exception):
            async with asyncio.timeout(2):
                held = await _holders(js, bucket, partitions)
            if len(held) == partitions and all(_of(survivor, h) for h in held.values()):
                assert run.replica_killed_at is not None
                run.takeover_s = time.monotonic() - run.replica_killed_at
                return
        await asyncio.sleep(0.1)


async def chaos(args: argparse.Namespace) -> Run:
    import nats
    import yaml

    from nodeward.config import ClusterSettings
    from nodeward.kube import Cluster
    from nodeward.kube.client import KubeClient
    from nodeward.kube.nodes import taints_of
    from schemas.state.cordon import NODES
    from schemas.streams import Partitioning
    from tests.helpers.nats_cluster import start_cluster

    run = Run()
    root = Path(tempfile.mkdtemp(prefix="nodeward-chaos-"))
    print(f"state and logs in {root}", flush=True)
    began = time.monotonic()

    def say(what: str) -> None:
        print(f"  [{time.monotonic() - began:6.1f} s] {what}", flush=True)

    cluster = await start_cluster(root / "nats")
    say(f"three nats-servers up: {cluster.url}")
    procs: dict[str, subprocess.Popen[bytes]] = {}
    kube: Any = None
    bus: Any = None
    tasks: list[asyncio.Task[Any]] = []
    takeover: asyncio.Task[None] | None = None
    try:
        bus, seed, seed_file, kubeconfig = await provision_and_seed(
            root, cluster.url, args.nodes, args.partitions, "bench/chaos", procs
        )
        js = bus.js
        say(f"sim cluster up with {args.nodes} GPU nodes")
        config = root / "config.yaml"
        config.write_text(yaml.safe_dump(_config(args, cluster.url, kubeconfig)))
        for name in ("cordon-a", "cordon-b"):
            procs[name] = _spawn(
                ["service", "cordon", "--config", str(config)], root / f"{name}.log", root
            )
        bucket = NODES.name
        a, b = procs["cordon-a"].pid, procs["cordon-b"].pid
        async with asyncio.timeout(180):
            while True:
                with contextlib.suppress(Exception):
                    names = list((await _holders(js, bucket, args.partitions)).values())
                    if (
                        len(names) == args.partitions
                        and any(_of(a, h) for h in names)
                        and any(_of(b, h) for h in names)
                    ):
                        break
                await asyncio.sleep(0.5)
        say("two cordon replicas share the partitions")
        stop_sampling = asyncio.Event()
        tasks.append(asyncio.create_task(_sample_lag(js, run, stop_sampling)))
        procs["fleet"] = _spawn(
            [
                *("sim", "fleet", "--nodes", str(args.nodes), "--gpus", str(args.gpus)),
                *("--seed", str(seed_file), "--config", str(config)),
            ],
            root / "fleet.log",
            root,
        )
        await _fleet_ready(procs["fleet"])
        say(f"fleet ready: {args.nodes} nodes x {args.gpus} GPUs, every GPU's state out")
        # The start-up burst (a health change per GPU) consumed before the storm.
        async with asyncio.timeout(args.drain_timeout):
            while True:
                sample = await _group(js, "GPU", "cordon")
                if sample is not None and sample[0] < 100:
                    break
                await asyncio.sleep(1)
        say("the start-up burst consumed; steady state")
        cpu0 = {n: _cpu_seconds(p.pid) for n, p in procs.items()}
        nats0 = {s.name: _cpu_seconds(s.proc.pid) for s in cluster.servers if s.proc}
        steady = run.steady = time.monotonic()
        await asyncio.sleep(args.settle)
        kube = Cluster(
            KubeClient.from_settings(
                ClusterSettings(kubeconfig=kubeconfig, context="nodeward-admin")
            )
        )
        # Device-plugin nodes: on a DRA node an XID 79 taints the one device, not the node.
        gpu_nodes = [
            n.name for n in seed.nodes if n.gpu is not None and n.gpu.count and n.dra is None
        ]
        rng = random.Random(args.rng)
        chosen = rng.sample(gpu_nodes, args.faults)
        faults = {
            n: Fault(
                n, rng.randrange(args.gpus), 0.0, Partitioning.index((token(n),), args.partitions)
            )
            for n in chosen
        }
        watching = asyncio.Event()
        tasks.append(asyncio.create_task(_watch_taints(kube, faults, watching)))
        await asyncio.wait_for(watching.wait(), 60)
        nc = await nats.connect(servers=[s.url for s in cluster.servers])
        say(f"storm: {args.faults} XID 79s over {args.storm:g} s")
        held = await _holders(js, bucket, args.partitions)
        storm_began = time.monotonic()
        injections = []
        step = args.storm / args.faults
        kill_nats_at, kill_replica_at = 0.4 * args.storm, 0.6 * args.storm
        if args.no_kill:  # a calm storm: the same faults, nothing killed
            kill_nats_at = kill_replica_at = math.inf
        for i, fault in enumerate(faults.values()):
            at = storm_began + i * step
            now = time.monotonic()
            if run.nats_killed is None and now - storm_began >= kill_nats_at:
                leader = (await js.stream_info(args.kill_leader_of)).cluster.leader
                led = []
                for stream in ("GPU", "HEARTBEATS", "AUDIT", f"KV_{bucket}", "KV_breaker"):
                    with contextlib.suppress(Exception):
                        if (await js.stream_info(stream)).cluster.leader == leader:
                            led.append(stream)
                run.notes.append(f"the killed nats-server led {', '.join(led)}")
                run.nats_killed = leader
                run.nats_killed_at = time.monotonic()
                await cluster.named(leader).kill()
                say(f"SIGKILL nats-server {leader} ({args.kill_leader_of}'s leader)")
            if run.replica_killed_at is None and now - storm_began >= kill_replica_at:
                with contextlib.suppress(Exception):  # else what it held at the storm's start
                    async with asyncio.timeout(2):
                        held = await _holders(js, bucket, args.partitions)
                run.killed_partitions = sorted(p for p, h in held.items() if _of(b, h))
                run.cpu["cordon-b (until killed)"] = (
                    100 * (_cpu_seconds(b) - cpu0["cordon-b"]) / (time.monotonic() - steady)
                )
                procs["cordon-b"].send_signal(signal.SIGKILL)
                run.replica_killed_at = time.monotonic()
                takeover = asyncio.create_task(_takeover(js, bucket, args.partitions, a, run))
                tasks.append(takeover)
                say(f"SIGKILL cordon replica b (pid {b}, partitions {run.killed_partitions})")
            await asyncio.sleep(max(0.0, at - time.monotonic()))
            fault.sent, fault.sent_at = time.monotonic(), time.time()
            injections.append(asyncio.create_task(_inject(nc, fault, 45)))
        await asyncio.gather(*injections)
        run.faults = list(faults.values())
        acked = [f for f in run.faults if f.stored]
        say(f"storm sent: {len(acked)} of {len(run.faults)} acknowledged")
        if takeover is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(takeover), 120)
        if run.takeover_s is not None:
            say(f"the survivor holds every partition, {run.takeover_s:.1f} s after the kill")
        # Every acknowledged fault decided (an audit), or the deadline.
        audits: dict[str, list[Any]] = {}
        deadline = time.monotonic() + args.deadline
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                audits = await _audits(js)
                if all(f.node in audits for f in acked):
                    break
            await asyncio.sleep(2)
        # Quarantines still in flight reach the API shortly after their audit.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(10):
                applied_nodes = {
                    n for n, aa in audits.items() if any(x.data.outcome == "applied" for x in aa)
                }
                while any(faults[n].tainted is None for n in applied_nodes if n in faults):  # noqa: ASYNC110 - another task's watch
                    await asyncio.sleep(0.2)
        say(
            "every acknowledged fault decided"
            if all(f.node in audits for f in acked)
            else "deadline"
        )
        spent = time.monotonic() - steady
        for name, proc in procs.items():
            if name == "cordon-b":
                continue
            run.cpu[name] = 100 * (_cpu_seconds(proc.pid) - cpu0[name]) / spent
        for s in cluster.servers:
            if s.proc and s.name in nats0 and s.name != run.nats_killed:
                run.cpu[f"nats-server {s.name}"] = (
                    100 * (_cpu_seconds(s.proc.pid) - nats0[s.name]) / spent
                )
        stop_sampling.set()
        run.audits = audits
        (root / "faults.json").write_text(
            json.dumps(
                [
                    {
                        "node": f.node,
                        "partition": f.partition,
                        "sent": f.sent - storm_began,
                        "acked": f.acked - storm_began if f.acked else None,
                        "tainted": f.tainted - storm_began if f.tainted else None,
                        "decided": [
                            (e.time.timestamp() - f.sent_at + f.sent - storm_began, e.data.outcome)
                            for e in audits.get(f.node, [])
                        ],
                        "error": f.error,
                    }
                    for f in run.faults
                ],
                indent=1,
            )
        )
        run.notes.append(
            f"nats-server killed at {(run.nats_killed_at or 0) - storm_began:.1f} s, replica at"
            f" {(run.replica_killed_at or 0) - storm_began:.1f} s of the storm; per fault:"
            f" {root / 'faults.json'}"
        )
        await _check(run, args, js, kube, audits, taints_of)
        await nc.close()
        return run
    finally:
        for task in tasks:
            task.cancel()
        _stop_all(procs)
        if kube is not None:
            await kube.close()
        if bus is not None:
            with contextlib.suppress(Exception):
                await bus.close(grace=1)
        await cluster.stop()


async def _check(
    run: Run,
    args: argparse.Namespace,
    js: Any,
    kube: Any,
    audits: dict[str, list[Any]],
    taints_of: Any,
) -> None:
    fail = run.failures.append
    acked = [f for f in run.faults if f.stored]
    for f in run.faults:
        if not f.stored:
            run.notes.append(f"{f.node}: fault not acknowledged ({f.error})")
    # No acknowledged event lost: stored at its sequence, and decided.
    for f in acked:
        for seq in f.stored:
            try:
                msg = await js.get_msg("GPU", seq)
            except Exception as exc:  # noqa: BLE001 - lost
                fail(f"{f.node}: acknowledged GPU stream sequence {seq} not there ({exc!r})")
                continue
            if f".{token(f.node)}." not in f"{msg.subject}.":
                fail(f"{f.node}: GPU stream sequence {seq} holds {msg.subject}")
        if f.node not in audits:
            fail(f"{f.node}: acknowledged fault never decided (no quarantine audit)")
    # Nothing applied twice; the breaker's limit; refusals audited.
    applied, refused, other = [], [], []
    for node, events in audits.items():
        found = [e.data for e in events]
        ok = [x for x in found if x.outcome == "applied"]
        # A quarantine that takes in more GPUs of its node (a MIG GPU's instances failing
        # one after another) is audited as applied with the incident it extends.
        starts = [x for x in ok if x.details.get("incident") in (None, x.trigger_event_id)]
        no = [x for x in found if x.outcome == "refused" and x.guard == "circuit_breaker"]
        if len(starts) > 1:
            fail(f"{node}: {len(starts)} applied quarantine audits starting an incident")
        if len(ok) > len(starts):
            run.notes.append(f"{node}: the quarantine extended {len(ok) - len(starts)} times")
        if ok:
            applied.append(node)
        elif no:
            refused.append(node)
        else:
            other.append(f"{node}: {[(x.outcome.value, x.guard) for x in found]}")
        if len(no) > 1:
            run.notes.append(f"{node}: refused by the breaker {len(no)} times (audited each)")
    # Faults without a known PubAck (no reply) may still be stored: count what was decided.
    decided = len([f for f in run.faults if f.node in audits])
    expected = min(decided, args.breaker)
    if len(applied) != expected:
        fail(f"{len(applied)} nodes quarantined, expected min(decided, breaker) = {expected}")
    for line in other:
        fail(f"neither applied nor refused by the breaker: {line}")
    if len(refused) != decided - expected:
        fail(f"{len(refused)} refused by the breaker, expected {decided - expected}")
    tainted = 0
    for node in await kube.nodes.list():
        count = sum(1 for t in taints_of(node) if t.get("key") == TAINT)
        if count > 1:
            fail(f"{node['metadata']['name']}: {count} taints {TAINT}")
        tainted += count > 0
    if tainted != len(applied):
        fail(f"{tainted} nodes tainted in the API, {len(applied)} applied audits")
    run.notes.append(
        f"decided: {len(applied)} quarantined (applied), {len(refused)} refused by the breaker"
        f" (audited, guard circuit_breaker), of {decided} faults decided and {len(acked)}"
        f" acknowledged (of {len(run.faults)} sent); {tainted} nodes"
        " tainted in the API"
    )
    if run.takeover_s is None and not args.no_kill:
        fail("the survivor never held every partition")


def _report(run: Run, args: argparse.Namespace) -> list[str]:
    lines = [
        f"chaos: {args.nodes} nodes x {args.gpus} GPUs, {args.partitions} partitions, 2 cordon"
        f" replicas, {len(run.faults)} XID 79s over {args.storm:g} s, breaker {args.breaker};"
        + (
            " nothing killed (--no-kill)"
            if args.no_kill
            else f" SIGKILL nats-server {run.nats_killed} ({args.kill_leader_of} leader) and"
            f" replica b (partitions {run.killed_partitions})"
        )
    ]
    lines += [f"  {n}" for n in run.notes]
    if run.takeover_s is not None:
        lines.append(
            f"  takeover: every partition held by the survivor {run.takeover_s:.1f} s"
            f" after the kill (lease TTL {args.lease_ttl or 'the default'})"
        )
    done = [f for f in run.faults if f.tainted is not None]
    if done:
        lat = [f.tainted - f.sent for f in done]  # type: ignore[operator]
        lines.append(
            f"  detect -> taint over {len(lat)} quarantines: p50 {statistics.median(lat):.2f} s,"
            f" p99 {_pct(lat, 0.99):.2f} s, max {max(lat):.2f} s"
        )
    acks = [f.acked - f.sent for f in run.faults if f.acked is not None]
    if acks:
        lines.append(
            f"  injection -> PubAck (the fleet's reply) over {len(acks)}: p50"
            f" {statistics.median(acks):.2f} s, max {max(acks):.2f} s"
        )
    # detect -> decision (the first quarantine audit, applied or refused), by phase.
    phases: dict[str, list[float]] = {}
    for f in run.faults:
        events = run.audits.get(f.node)
        if not f.stored or not events:
            continue
        first = min(e.time.timestamp() for e in events)
        if run.nats_killed_at is None or f.sent < run.nats_killed_at:
            phase = "sent before any kill"
        elif f.partition in run.killed_partitions:
            phase = "after a kill, in the killed replica's partitions (taken over)"
        else:
            phase = "after a kill, in the survivor's partitions"
        phases.setdefault(phase, []).append(first - f.sent_at)
    every = [x for v in phases.values() for x in v]
    if every:
        lines.append(
            f"  detect -> decision (audit) over {len(every)} faults: p50"
            f" {statistics.median(every):.2f} s, p99 {_pct(every, 0.99):.2f} s"
        )
        for phase, values in phases.items():
            lines.append(
                f"    {phase}: {len(values)}, p50 {statistics.median(values):.2f} s,"
                f" max {max(values):.2f} s"
            )
    for consumer, samples in run.lag.items():
        for label, part in (
            ("start-up burst", [x for x in samples if x[0] < run.steady]),
            ("steady state and storm", [x for x in samples if x[0] >= run.steady]),
        ):
            if not part:
                continue
            ages = [x[2] for x in part if x[2] == x[2]]
            lines.append(
                f"  lag {consumer}, {label}: pending max {max(x[1] for x in part)}, oldest"
                f" pending max {max(ages, default=0):.1f} s ({len(part)} samples, every 2 s)"
            )
    lines.append(
        "  CPU (% of a core, steady state to the end): "
        + ", ".join(f"{n} {c:.0f}" for n, c in run.cpu.items())
    )
    if run.failures:
        lines.append(f"  FAILED ({len(run.failures)}):")
        lines += [f"    {x}" for x in run.failures]
    else:
        lines.append("  every check passed")
    return lines


def main() -> int:
    parser = options(__doc__.splitlines()[0], nodes=5000, gpus=8)
    parser.add_argument("--quick", action="store_true", help="200 nodes, 20 faults, breaker 12")
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--faults", type=int, default=None, help="default: 1 %% of the nodes")
    parser.add_argument("--breaker", type=int, default=30, help="breaker.max_nodes")
    parser.add_argument("--storm", type=float, default=5.0, help="seconds the faults span")
    parser.add_argument("--settle", type=float, default=10.0, help="steady seconds before")
    parser.add_argument("--ack-wait", default=None, help="services.cordon.ack_wait (30s)")
    parser.add_argument("--lease-ttl", default=None, help="services.cordon.lease_ttl (20s)")
    parser.add_argument("--deadline", type=float, default=180.0, help="seconds for decisions")
    parser.add_argument("--drain-timeout", type=float, default=600.0)
    parser.add_argument("--rng", type=int, default=19, help="which nodes fail")
    parser.add_argument(
        "--no-kill", action="store_true", help="the storm alone: no nats-server or replica killed"
    )
    parser.add_argument("--log-level", default="info", help="the replicas' and the fleet's")
    parser.add_argument(
        "--kill-leader-of", default="GPU", help="the nats-server killed leads this stream"
    )
    args = parser.parse_args()
    if args.quick:
        args.nodes, args.faults, args.breaker = 200, 20, 12
        args.settle = min(args.settle, 3.0)
    args.faults = args.faults or max(1, round(args.nodes / 100))
    run = asyncio.run(chaos(args))
    print()
    print("\n".join(_report(run, args)))
    return 1 if run.failures else 0


if __name__ == "__main__":
    sys.exit(main())
