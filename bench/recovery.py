"""Benchmark: XID 79 to the node back in service, through services.recovery in `nodeward up`.

Starts `nodeward up` (sim cluster, simulated agents, every service, the simulated reboot
operator) with `--scenario none`, then, one node at a time, makes a GPU fall off the bus
(`sim.inject.<node>`, fault `fallen-off-bus`) and times, from the injection, the
quarantine's audit (cordon, `remediation.quarantine.<node>` applied: the baseline, detection
to quarantine) and recovery's release (`remediation.release.<node>` by `service/recovery`):
drain (with `--drain-deadline` for held GPU pods), reboot, validation, release. Prints the
medians and the part of the recovery that is not the drain's deadline.

Usage: python bench/recovery.py [--nodes gpu-h100-02,gpu-h100-03] [--rounds 3] [--drain-deadline 5s]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nats
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from schemas import decode  # noqa: E402 - after the path is set
from schemas.control import ControlRequest  # noqa: E402


async def one(nc: NATS, node: str, timeout: float) -> tuple[float, float]:
    """(seconds to the quarantine's audit, seconds to recovery's release) for one node."""
    quarantined: asyncio.Future[float] = asyncio.get_running_loop().create_future()
    released: asyncio.Future[float] = asyncio.get_running_loop().create_future()

    async def on_audit(msg: Msg) -> None:
        try:
            data = decode(msg.subject, msg.headers, msg.data).data
        except Exception as exc:  # noqa: BLE001
            print("undecodable", msg.subject, exc, file=sys.stderr)
            return
        outcome, actor = data.outcome.value, data.actor
        if (
            msg.subject.startswith("remediation.quarantine.")
            and outcome == "applied"
            and not quarantined.done()
        ):
            quarantined.set_result(time.monotonic())
        if (
            msg.subject.startswith("remediation.release.")
            and actor == "service/recovery"
            and outcome == "applied"
            and not released.done()
        ):
            released.set_result(time.monotonic())

    sub = await nc.subscribe(f"remediation.*.{node}", cb=on_audit)
    began = time.monotonic()
    reply = await nc.request(
        f"sim.inject.{node}", json.dumps({"gpu": 0, "fault": "fallen-off-bus"}).encode(), timeout=5
    )
    assert json.loads(reply.data)["ok"], reply.data
    q = await asyncio.wait_for(quarantined, timeout)
    r = await asyncio.wait_for(released, timeout)
    await sub.unsubscribe()
    return q - began, r - began


async def measure(
    nats_url: str, nodes: list[str], rounds: int, timeout: float
) -> list[tuple[float, float]]:
    """Each node in turn, `rounds` times; the circuit breaker is reset between rounds (it
    admits 2 of the default seed's 8 GPU nodes per 10 minutes)."""
    nc = await nats.connect(nats_url)
    try:
        out = []
        for _ in range(rounds):
            out += [await one(nc, node, timeout) for node in nodes]
            reset = ControlRequest(
                service="cordon", verb="reset-breaker", operator="bench", reason="next round"
            )
            await nc.request(reset.subject, reset.model_dump_json().encode(), timeout=10)
        return out
    finally:
        await nc.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="gpu-h100-02,gpu-h100-03")
    parser.add_argument("--rounds", type=int, default=3, help="at most 3: the retry limit")
    parser.add_argument("--drain-deadline", default="5s")
    parser.add_argument("--timeout", type=float, default=180.0)
    args = parser.parse_args()
    nodes = [n for n in args.nodes.split(",") if n]
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "state"
        env = {k: v for k, v in os.environ.items() if not k.startswith("NODEWARD_")} | {
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p
            ),
            "NODEWARD_SERVICES__RECOVERY__DRAIN_DEADLINE": args.drain_deadline,
            "NODEWARD_SERVICES__RECOVERY__INTERVAL": "1s",
        }
        proc = subprocess.Popen(
            [sys.executable, "-m", "launch", "up", "--state-dir", str(state),
             "--scenario", "none", "--quiet"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=tmp,
        )  # fmt: skip
        try:
            endpoints = state / "endpoints.json"
            deadline = time.monotonic() + 120
            while not endpoints.exists():
                if time.monotonic() > deadline or proc.poll() is not None:
                    print("nodeward up did not start", file=sys.stderr)
                    return 1
                time.sleep(0.2)
            time.sleep(5)  # every agent watching its GPUs (the scenario clock waits likewise)
            url = json.loads(endpoints.read_text())["nats_url"]
            results = asyncio.run(measure(url, nodes, args.rounds, args.timeout))
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(60)
    quarantine = statistics.median(q for q, _ in results)
    recovery = statistics.median(r for _, r in results)
    for i, (q, r) in enumerate(results):
        node = nodes[i % len(nodes)]
        print(f"{node}: quarantined {q:.2f} s, released by recovery {r:.2f} s")
    print(f"median detection to quarantine (baseline): {quarantine:.2f} s")
    print(
        f"median XID 79 to back in service: {recovery:.2f} s "
        f"({recovery / quarantine:.0f}x the baseline; drain deadline {args.drain_deadline})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
