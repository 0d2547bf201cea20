"""Benchmark: what one quarantine costs, for this tree and a baseline tree in the same run.

One XID 79 on a healthy device-plugin GPU node (after one on another node, as a running
service has made), against the sim cluster (in process, for its
request log) and a real nats-server, with the cordon service. Counted from publishing the
event to the quarantine's `applied` audit on `remediation.quarantine.<node>`, and again once
the event is acknowledged (what a step after the audit would add):

- KV writes: to the audit, the `$KV.` messages a `>` subscription saw before the audit (a
  write the service awaited before publishing reaches it first); to the ack, revisions
  added to every `KV_*` stream (the warm-up's writes after its audit settled before);
- KV reads: direct and message GETs on the `$JS.API` (seen on a `>` subscription);
- Kubernetes requests by verb and resource (the sim cluster's request log);
- publishes: application subjects (not `$JS`, `$KV`, `_INBOX`) on the `>` subscription.

Then the quarantine path's throughput: one failed event for each of `--storm` other nodes,
published at once, until every node's `applied` audit arrived (quarantines/s).

Each tree runs in a fresh interpreter (`PYTHONPATH` = the tree) `--rounds` times; medians
are printed, with the ratio this / baseline. The baseline is a git ref exported with
`git archive` (nothing in the repository changes).

Usage: python bench/quarantine_cost.py [--baseline main~3] [--rounds 3] [--storm 200]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from benchlib import REPO, exported, wide_cordon, xid79

NODE = "bench-gpu-0000"


def _verb(method: str, path: str) -> str:
    """`GET nodes/NAME`-style: the verb and the resource path without names of objects."""
    parts = path.split("?", 1)[0].strip("/").split("/")
    # /api/v1/nodes/x/status, /apis/g/v/namespaces/ns/events, /apis/g/v/resourceslices
    rest = parts[2:] if parts[0] == "api" else parts[3:] if parts[0] == "apis" else parts
    if rest[:1] == ["namespaces"] and len(rest) > 2:
        rest = rest[2:]
    kind = rest[0] if rest else "/".join(parts) or "discovery"
    sub = f"/{rest[2]}" if len(rest) > 2 else ""
    named = len(rest) > 1
    if method == "GET" and not named:
        method = "LIST"
    if parts[0] in ("api", "apis") and len(parts) <= 3:
        return f"GET discovery {'/'.join(parts)}"
    return f"{method} {kind}{sub}"


async def _kv_seqs(js: Any) -> dict[str, int]:
    out = {}
    for info in await js.streams_info():
        if info.config.name.startswith("KV_"):
            out[info.config.name] = info.state.last_seq
    return out


async def _acked(js: Any) -> None:
    """Until the cordon consumer has nothing pending (every event handled and acked)."""
    for _ in range(200):
        info = await js.consumer_info("GPU", "cordon")
        if info.num_ack_pending == 0 and info.num_pending == 0:
            return
        await asyncio.sleep(0.05)


async def child(storm: int) -> dict[str, Any]:
    """One round in this interpreter's tree; returns the counts."""
    import nats
    import structlog

    from nodeward.bus import Bus
    from nodeward.bus.server import EmbeddedNats
    from nodeward.config import BusSettings
    from nodeward.logs import configure_logging
    from services.cordon.service import build
    from sim.cluster import SimCluster
    from sim.cluster.seed import NodeSeed, Seed

    configure_logging("warning", "console")
    structlog.get_logger().debug("bench.child")
    names = [NODE, *(f"bench-gpu-{i:04d}" for i in range(1, storm + 1))]
    warm = "bench-gpu-warm"
    with tempfile.TemporaryDirectory() as d:
        sim = SimCluster(
            Seed(namespaces=["nodeward"], nodes=[NodeSeed(name=n) for n in [warm, *names]])
        )
        await sim.start()
        kubeconfig = sim.write_kubeconfig(Path(d) / "kubeconfig")
        async with EmbeddedNats(Path(d) / "nats") as server:
            daemon = await build(wide_cordon(server.url, kubeconfig))
            await daemon.start()
            while not (await daemon.readiness()).ready:  # noqa: ASYNC110 - polls an HTTP-less check
                await asyncio.sleep(0.05)
            bus = await Bus.connect(BusSettings(url=server.url), source="bench/inject")
            nc = await nats.connect(server.url)
            js = nc.jetstream()
            seen: Counter[str] = Counter()
            applied: dict[str, float] = {}
            at_audit: dict[str, dict[str, int]] = {}
            requests_at_audit: dict[str, int] = {}
            done = asyncio.Event()
            want: set[str] = {warm}

            async def on_msg(msg: Any) -> None:
                subject = msg.subject
                if subject.startswith("$JS.API.DIRECT.GET.KV_") or subject.startswith(
                    "$JS.API.STREAM.MSG.GET.KV_"
                ):
                    seen["kv.read"] += 1
                    if os.environ.get("BENCH_DEBUG"):
                        print(subject, file=sys.stderr)
                elif subject.startswith("$KV."):
                    # A write the service awaited before it published the audit reaches
                    # this subscription before the audit does.
                    seen["kv.write"] += 1
                    if os.environ.get("BENCH_DEBUG"):
                        print(f"{time.perf_counter():.4f} {subject}", file=sys.stderr)
                    return
                elif subject.startswith(("$JS.", "_INBOX", "$SYS")):
                    return
                else:
                    seen[f"publish {subject.split('.', 1)[0]}"] += 1
                if subject.startswith("remediation.quarantine."):
                    body = json.loads(msg.data)
                    data = body.get("data", body)
                    if os.environ.get("BENCH_DEBUG"):
                        print(f"{time.perf_counter():.4f} audit {subject}", file=sys.stderr)
                    if data.get("outcome") == "applied":
                        node = data["target"]["name"]
                        applied.setdefault(node, time.perf_counter())
                        at_audit.setdefault(node, dict(seen))
                        requests_at_audit.setdefault(node, len(sim.requests))
                        if want <= applied.keys():
                            done.set()

            await nc.subscribe(">", cb=on_msg)
            await nc.flush()
            # Warm the service as a running one is: its caches (the node population,
            # discovery) and one quarantine of another node done.
            await asyncio.sleep(1.0)
            await bus.publish(xid79(warm))
            await asyncio.wait_for(done.wait(), 30)
            await _acked(js)  # its writes after the audit too, before counting starts
            done.clear()
            want = {NODE}
            kv_before = await _kv_seqs(js)
            requests_before = len(sim.requests)
            seen.clear()
            await bus.publish(xid79(NODE))
            await asyncio.wait_for(done.wait(), 30)
            k8s_at_audit = list(sim.requests)[requests_before : requests_at_audit[NODE]]
            counted = at_audit[NODE]
            # ... and once the event is acknowledged (nothing pending on the consumer)
            await _acked(js)
            kv_at_ack = await _kv_seqs(js)
            k8s_at_ack = list(sim.requests)[requests_before:]

            if os.environ.get("BENCH_DEBUG"):
                for stream, last in kv_at_ack.items():
                    for seq in range(kv_before.get(stream, 0) + 1, last + 1):
                        with contextlib.suppress(Exception):
                            msg = await js.get_msg(stream, seq)
                            print(f"{stream} {seq} {msg.subject} {msg.headers}", file=sys.stderr)

            def writes(after: dict[str, int]) -> int:
                return sum(after[s] - kv_before.get(s, 0) for s in after)

            result: dict[str, Any] = {
                "kv_writes": counted.get("kv.write", 0),
                "kv_reads": counted.get("kv.read", 0),
                "k8s": dict(Counter(_verb(m, p) for _, m, p, _ in k8s_at_audit)),
                "k8s_total": len(k8s_at_audit),
                "publishes": {k: v for k, v in counted.items() if k.startswith("publish")},
                "kv_writes_at_ack": writes(kv_at_ack),
                "kv_by_bucket_at_ack": {
                    s.removeprefix("KV_"): n
                    for s in kv_at_ack
                    if (n := kv_at_ack[s] - kv_before.get(s, 0))
                },
                "k8s_total_at_ack": len(k8s_at_ack),
            }
            # throughput of the quarantine path
            if storm:
                want = set(names)
                done.clear()
                events = [xid79(n) for n in names[1:]]
                start = time.perf_counter()
                for event in events:
                    await bus.publish(event)
                await asyncio.wait_for(done.wait(), 120)
                result["storm_per_s"] = storm / (max(applied.values()) - start)
            await nc.close()
            await bus.close(grace=1)
            await daemon.stop()
        await sim.stop()
    return result


def run_tree(tree: Path, storm: int) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NODEWARD_")}
    env |= {"PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
    out = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--child", "--storm", str(storm)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tree,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{tree}: child failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def summarise(name: str, runs: list[dict[str, Any]]) -> dict[str, float]:
    med = {
        key: statistics.median(r[key] for r in runs)
        for key in ("kv_writes", "kv_reads", "k8s_total", "kv_writes_at_ack", "k8s_total_at_ack")
    }
    if all("storm_per_s" in r for r in runs):
        med["storm_per_s"] = statistics.median(r["storm_per_s"] for r in runs)
    verbs: Counter[str] = Counter()
    for r in runs:
        verbs.update(r["k8s"])
    publishes: Counter[str] = Counter()
    for r in runs:
        publishes.update(r["publishes"])
    print(f"\n{name} ({len(runs)} rounds, medians; request mix summed over rounds / rounds)")
    print(
        f"  to the audit: KV writes {med['kv_writes']:g}, KV reads {med['kv_reads']:g}, "
        f"Kubernetes requests {med['k8s_total']:g}"
    )
    print(
        f"  to the ack:   KV writes {med['kv_writes_at_ack']:g}, "
        f"Kubernetes requests {med['k8s_total_at_ack']:g}"
    )
    for verb, count in sorted(verbs.items()):
        print(f"    {count / len(runs):5.1f}  {verb}")
    print("  publishes: " + ", ".join(f"{k[8:]} {v / len(runs):g}" for k, v in publishes.items()))
    if "storm_per_s" in med:
        print(f"  quarantine path: {med['storm_per_s']:.0f} quarantines/s")
    return med


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--baseline", default=None, help="git ref to compare with (default: none)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--storm", type=int, default=200, help="nodes failed at once for events/s")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(asyncio.run(child(args.storm))))
        return
    trees: list[tuple[str, Path | str]] = [("this tree", REPO)]
    if args.baseline:
        trees.append((f"baseline {args.baseline}", args.baseline))
    medians = {}
    with contextlib.ExitStack() as stack:
        for name, where in trees:
            tree = where if isinstance(where, Path) else stack.enter_context(exported(where))
            runs = [run_tree(tree, args.storm) for _ in range(args.rounds)]
            medians[name] = summarise(name, runs)
    if len(medians) == 2:
        this, base = medians.values()
        print("\nratio this / baseline:")
        for key in ("kv_writes", "kv_reads", "k8s_total", "storm_per_s"):
            if key in this and base.get(key):
                print(f"  {key:12s} {this[key] / base[key]:.2f}")


if __name__ == "__main__":
    main()
