"""How soon the capacity count follows a quarantine, a drain and a new pod, in `nodeward up`,
with one core kept busy (issue 31: "GPUs as counted 140s ago" on a loaded machine; the
target is 2 s).

Each round starts its own `nodeward up --scenario none --quiet` and a process that spins on
one core, waits until every daemon is ready and the first count is written, then times, from
the action to the capacity service's snapshot (KV `capacity`) showing it:
- quarantine: XID 79 injected on one GPU of an H100 node (its count changes: blocked);
- new pod: a pod asking one `nvidia.com/gpu` created on the node with the most free GPUs
  (one more `used`);
- drain: `nodeward maintenance start` of an A100 node, from the request published (its
  GPUs `maintenance`).
Prints each figure per round and the medians.

    python bench/capacity_lag.py [--rounds 3] [--no-load]
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from benchlib import options
from pressure_up import REPO, Platform, platform

from nodeward.config import ClusterSettings
from nodeward.kube.base import core
from nodeward.kube.client import MERGE_PATCH, KubeClient
from schemas.state.capacity import SNAPSHOT, NodeCapacity

SPIN = "while True: pass"


async def snapshot_nodes(up: Platform) -> dict[str, NodeCapacity]:
    kv = await up.bus.js.key_value(SNAPSHOT.name)
    entry = await kv.get(SNAPSHOT.key())
    return {n.node: n for n in SNAPSHOT.load(entry.value or b"").nodes}


async def until(up: Platform, holds: Callable[[dict[str, NodeCapacity]], bool]) -> float:
    """Seconds until the snapshot shows `holds` (polled every 20 ms; 60 s at most)."""
    began = time.monotonic()
    while time.monotonic() - began < 60:
        try:
            if holds(await snapshot_nodes(up)):
                return time.monotonic() - began
        except Exception:  # noqa: BLE001 - not written yet: look again
            pass
        await asyncio.sleep(0.02)
    return float("inf")


def count(nodes: dict[str, NodeCapacity], node: str, state: str) -> int:
    n = nodes.get(node)
    return sum(getattr(c, state) for c in n.profiles.values()) if n else 0


async def one_round() -> dict[str, float]:
    async with platform() as up:
        await until(up, bool)
        out: dict[str, float] = {}
        before = (await snapshot_nodes(up))["gpu-h100-04"]
        began = time.monotonic()
        await up.inject("gpu-h100-04", gpu=0, xid=79)
        # The node's count changes (blocked, its GPUs no longer free): the demo profile's
        # recovery may have it back in service seconds later, so any change counts.
        out["quarantine"] = (
            time.monotonic() - began + await until(up, lambda n: n["gpu-h100-04"] != before)
        )

        nodes = await snapshot_nodes(up)
        whole = [n for n in nodes.values() if "gpu" in n.profiles and not n.dra]  # not MIG
        roomy = max(
            (n for n in whole if n.node != "gpu-h100-04"), key=lambda n: n.profiles["gpu"].free
        )
        used = count(nodes, roomy.node, "used")
        admin = KubeClient.from_settings(
            ClusterSettings(kubeconfig=Path(up.endpoints["kubeconfig"]))
        )
        try:
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "bench-gpu-pod", "namespace": "ml-vision"},
                "spec": {
                    "nodeName": roomy.node,
                    "containers": [
                        {
                            "name": "main",
                            "image": "registry.example.com/bench:1",
                            # requests as the API server defaults them from limits
                            "resources": {
                                "limits": {"nvidia.com/gpu": "1"},
                                "requests": {"nvidia.com/gpu": "1"},
                            },
                        }
                    ],
                },
            }
            began = time.monotonic()
            await admin.request("POST", core("pods", namespace="ml-vision"), body=pod)
            # The kubelet's part (the sim has none): the bound pod reports Running.
            await admin.request(
                "PATCH",
                core("pods", "bench-gpu-pod", "ml-vision", sub="status"),
                body={"status": {"phase": "Running"}},
                content_type=MERGE_PATCH,
            )
            out["new pod"] = (
                time.monotonic()
                - began
                + await until(up, lambda n: count(n, roomy.node, "used") > used)
            )
        finally:
            await admin.close()

        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "launch", "maintenance", "start", "gpu-a100-03",
            "--reason", "bench", "--wait", "0", "--state-dir", str(up.state),
            cwd=REPO, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        _, err = await proc.communicate()
        if proc.returncode:
            raise RuntimeError(f"maintenance start failed: {err.decode().strip()}")
        # From the request published (the command's exit), not the interpreter's start.
        out["drain"] = await until(up, lambda n: count(n, "gpu-a100-03", "maintenance") > 0)
        return out


async def main(args: argparse.Namespace) -> None:
    spinner = None
    if not args.no_load:
        spinner = await asyncio.create_subprocess_exec(sys.executable, "-c", SPIN)
    try:
        rounds = []
        for i in range(args.rounds):
            figures = await one_round()
            rounds.append(figures)
            print(f"round {i + 1}: " + ", ".join(f"{k} {v:.2f} s" for k, v in figures.items()))
        print(
            f"\nmedians over {args.rounds} round(s), {'no load' if args.no_load else 'one core kept busy'}:"
        )
        for key in rounds[0]:
            values = [r[key] for r in rounds]
            print(f"  {key:10s} {statistics.median(values):6.2f} s   (max {max(values):.2f} s)")
    finally:
        if spinner is not None:
            spinner.send_signal(signal.SIGTERM)
            await spinner.wait()


if __name__ == "__main__":
    parser = options(__doc__, rounds=3)
    parser.add_argument("--no-load", action="store_true")
    asyncio.run(main(parser.parse_args()))
