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
run with the same interpreter. Usage:

    python bench/fleet.py [--nodes 256] [--watch 60] [--injections 5] [--baseline main]
                          [--no-baseline]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import os
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
TAINT = "nodeward.io/gpu-unhealthy"
WIDE_BREAKER = {
    "NODEWARD_SERVICES__CORDON__BREAKER__MAX_NODES": "1000",
    "NODEWARD_SERVICES__CORDON__BREAKER__MAX_PERCENT": "100",
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


@contextlib.contextmanager
def exported(ref: str) -> Iterator[Path]:
    """`ref` of this repository as a plain directory tree (nothing in the repository changes)."""
    with tempfile.TemporaryDirectory(prefix="nodeward-baseline-") as tmp:
        data = subprocess.run(
            ["git", "-C", str(REPO), "archive", "--format=tar", ref],
            capture_output=True,
            check=True,
        ).stdout
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            tar.extractall(tmp, filter="data")
        yield Path(tmp)


def _ready(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(f"{url}/readyz", timeout=2) as reply:
            return bool(reply.status == 200)
    except OSError:
        return False


async def _lag(js: Any, stream: str, consumer: str) -> tuple[int, float] | None:
    """(messages pending, seconds since the oldest of them was stored), or None if absent."""
    from nats.js.errors import NotFoundError

    try:
        info = await js.consumer_info(stream, consumer)
    except NotFoundError:
        return None
    pending = (info.num_pending or 0) + (info.num_ack_pending or 0)
    if not pending:
        return 0, 0.0
    floor = (info.ack_floor.stream_seq if info.ack_floor else 0) or 0
    try:
        msg = await js.get_msg(stream, floor + 1)
    except Exception:  # noqa: BLE001 - purged or filtered out: the count still says it
        return pending, float("nan")
    stored = _stored_at(msg)
    return pending, (datetime.now(UTC) - stored).total_seconds() if stored else float("nan")


def _stored_at(msg: Any) -> datetime | None:
    raw = getattr(msg, "time", None)
    if isinstance(raw, datetime):
        return raw
    if isinstance(raw, str):
        text = raw.rstrip("Z")
        head, _, frac = text.partition(".")
        return datetime.fromisoformat(f"{head}.{frac[:6].ljust(6, '0')}+00:00")
    return None


async def _measure(tree: Path, name: str, args: argparse.Namespace) -> Result:
    import nats

    from nodeward.config import ClusterSettings
    from nodeward.kube import Cluster
    from nodeward.kube.client import KubeClient

    result = Result(name)
    state = Path(tempfile.mkdtemp(prefix=f"nodeward-fleet-{name}-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("NODEWARD_")}
    env |= WIDE_BREAKER | {"PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
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
        cpu0 = _cpu_seconds(proc.pid)
        watch_began = time.monotonic()
        while time.monotonic() - watch_began < args.watch:
            for stream, consumer in (("GPU", "cordon"), ("HEARTBEATS", "cordon-heartbeats")):
                sample = await _lag(js, stream, consumer)
                if sample is not None:
                    result.lag.setdefault(f"{stream}/{consumer}", []).append(sample)
            await asyncio.sleep(2)
        result.cpu_pct = 100 * (_cpu_seconds(proc.pid) - cpu0) / (time.monotonic() - watch_began)
        kube = Cluster(
            KubeClient.from_settings(ClusterSettings(kubeconfig=Path(endpoints["kubeconfig"])))
        )
        listed = await kube.nodes.list(label_selector="nvidia.com/gpu.present=true")
        nodes = [n["metadata"]["name"] for n in listed][-args.injections :]
        for node in nodes:
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
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


def _cpu_seconds(root: int) -> float:
    """User and system CPU seconds of process `root` and every descendant (Linux /proc)."""
    parent: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(stat.parent.name)
        parent[pid], ticks[pid] = int(fields[1]), int(fields[11]) + int(fields[12])
    mine = {root}
    grew = True
    while grew:
        grew = False
        for pid, ppid in parent.items():
            if ppid in mine and pid not in mine:
                mine.add(pid)
                grew = True
    return sum(ticks.get(p, 0) for p in mine) / os.sysconf("SC_CLK_TCK")


async def _tainted(kube: Any, node: str) -> bool:
    from nodeward.kube.nodes import taints_of

    return any(t.get("key") == TAINT for t in taints_of(await kube.nodes.get(node)))


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
    for consumer, samples in r.lag.items():
        counts = [c for c, _ in samples]
        ages = [a for _, a in samples if a == a]
        tail = samples[-len(samples) // 2 :]  # the second half: steady state
        lines.append(
            f"  lag {consumer}: pending max {max(counts)}, last {counts[-1]}, median of the"
            f" second half {statistics.median(c for c, _ in tail):.0f}; oldest pending max"
            f" {max(ages, default=0):.1f} s, last {samples[-1][1]:.1f} s"
        )
    if r.taint_s:
        lines.append(
            f"  XID 79 -> taint over {len(r.taint_s)} injection(s): median"
            f" {statistics.median(r.taint_s):.2f} s, max {max(r.taint_s):.2f} s"
            + (f"; {r.missed} missed the {args.deadline:g} s deadline" if r.missed else "")
        )
    else:
        lines.append(f"  XID 79 -> taint: none within {args.deadline:g} s ({r.missed} tried)")
    return lines


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=256)
    parser.add_argument("--watch", type=float, default=60.0, help="seconds of lag sampling")
    parser.add_argument("--injections", type=int, default=5)
    parser.add_argument("--deadline", type=float, default=15.0, help="seconds per injection")
    parser.add_argument("--ready-timeout", type=float, default=240.0)
    parser.add_argument("--baseline", default="main", help="git ref to compare with")
    parser.add_argument("--no-baseline", action="store_true")
    parser.add_argument("--no-this", action="store_true", help="the baseline alone")
    args = parser.parse_args()
    print(f"nodeward up --nodes {args.nodes} --scenario none, {os.cpu_count()} CPUs", flush=True)
    results = [] if args.no_this else [await _measure(REPO, "this tree", args)]
    if not args.no_baseline:
        with exported(args.baseline) as tree:
            results.append(await _measure(tree, f"baseline {args.baseline}", args))
    print()
    for r in results:
        print("\n".join(_report(r, args)))
    if len(results) == 2 and all(r.taint_s for r in results):
        a, b = (statistics.median(r.taint_s) for r in results)
        print(f"XID 79 -> taint median, this tree / baseline: {a / b:.2f}")


if __name__ == "__main__":
    asyncio.run(main())
