"""Benchmark: a hung node back in service through its BMC, against the same node recovered
through a cooperative reboot, in one run; and how many nodes of a group a storm gets
remediated at once (the `min_healthy` floor held).

Real parts: a nats-server, OpenIPMI's `ipmi_sim` as the node's BMC (its chassis power runs
the node's machine, `launch.sim_node`: the kubelet's lease and boot), the sim cluster (its
node lifecycle controller) in this process, the cordon, checkpoint and recovery services and
the node's simulated GPU agent in this process (`tests/integration/bmc_fixtures.py`, the
platform the tests use). Each measurement gets a fresh platform; the modes alternate.

- `bmc`: the machine hung (SIGSTOP; it answers no reboot request nor ACPI) with a GPU fallen
  off the bus (XID 79); the ladder `power-cycle` (then on-call). Timed from the hang to the
  node released, with the phases from the audit: `detected` (the detector's
  `node.health` finding: the lease's grace, `not_ready_after`, a pass), `off` (the BMC's hard
  power off sent, to its chassis status saying off: ipmi_sim's SIGTERM, then SIGKILL after
  `kill_wait`), `fenced`, `moved` (the out-of-service taint to the power on: the node's pods
  gone, or `fence_wait`), `booted` (power on to the node back: a new boot and `Ready`),
  `validated`, `released`.
- `reboot` (the baseline): the same node, not hung, its GPU fallen off the bus; recovery
  drains it and asks for a reboot (Kured's label), which a cooperative reboot operator
  carries out (a `chassis power cycle` of the same machine, as the OS rebooting itself would
  give: a new boot), then validates and releases it. Timed from the fault to the release.

Storm: a group of `--group` nodes with `min_healthy` `--floor`, `k` of them hung at once
(node-problem-detector's `KernelDeadlock=True`): how many get a ladder, how many the floor
refuses.

Usage: PYTHONPATH=$PWD python bench/recovery_hang.py [--runs 3] [--group 10] [--floor 50%]
       [--storms 1,3,5,8]
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchlib import options

from nodeward.bus import Bus
from nodeward.bus.server import EmbeddedNats
from nodeward.config import BusSettings, ClusterSettings, Settings
from nodeward.kube.client import STRATEGIC_PATCH, KubeClient
from nodeward.logs import configure_logging
from schemas.base import Event
from schemas.remediation import Remediation
from services.recovery.service import build as build_recovery
from services.recovery.state import Step
from sim.cluster import SimCluster
from sim.cluster.seed import NodeSeed, Seed
from sim.inject import InjectRequest, request_injection
from tests.integration.bmc_fixtures import Node, bmc_node, ladder
from tests.integration.cordon_fixtures import read_stream
from tests.integration.recovery_fixtures import RecoveryEnv, recovery_platform, wait_for
from tests.ipmi_sim import IpmiSim, Machine, need_ipmi_sim


@contextlib.contextmanager
def bmcs(workdir: Path) -> Any:
    made: list[IpmiSim] = []

    def start(machine: Machine, **more: Any) -> IpmiSim:
        where = workdir / f"bmc-{len(made)}"
        where.mkdir(parents=True)
        sim = IpmiSim(where, machine=machine, **more)
        made.append(sim)
        sim.start()
        return sim

    try:
        yield start
    finally:
        for sim in made:
            sim.stop()


@contextlib.asynccontextmanager
async def platform(
    bus: Bus, url: str, tmp: Path
) -> AsyncIterator[Callable[..., Awaitable[RecoveryEnv]]]:
    async with recovery_platform(bus, url, tmp) as make:
        yield make


def _at(audits: list[Event[Remediation]], action: str, *, text: str = "") -> float:
    """When the first applied `action` audit (whose reason holds `text`) was made."""
    found = [
        e
        for e in audits
        if e.data.action == action and text in e.data.reason and e.data.outcome.value == "applied"
    ]
    if not found:
        raise AssertionError(
            f"no {action!r} ({text!r}) in {[(e.data.action, e.data.reason[:40]) for e in audits]}"
        )
    return found[0].time.timestamp()


async def _released(env: RecoveryEnv) -> bool:
    record = await env.record()
    if record is not None and record.step == Step.ESCALATED:
        raise AssertionError(f"escalated: {record.history}")
    return record is not None and record.step == Step.RELEASED


async def measure_bmc(bus: Bus, url: str, tmp: Path) -> dict[str, float]:
    with bmcs(tmp / "bmcs") as start:
        async with platform(bus, url, tmp) as make:
            env, node = await bmc_node(
                make, start, nats_url=url, ladder=ladder(("power-cycle", "60s"), ("oncall", "1s"))
            )
            await _fault(env)
            t0 = time.time()
            node.hang()
            await wait_for(lambda: _released(env), "released", timeout=120)
            audits = await read_stream(env.bus, "AUDIT", f"remediation.*.{env.node}")
            health = await _health_time(env)
            sent = _at(audits, "power-off", text="hard power off")
            off = _at(audits, "power-off", text="is off")
            fenced = _at(audits, "fence")
            on = _at(audits, "power-on")
            back = _at(audits, "power-cycle", text="back after")
            validated = _at(audits, "validate")
            released = _at(audits, "release")
            return {
                "total": released - t0,
                "detected": health - t0,
                "off": off - sent,
                "fenced": fenced - off,
                "moved": on - fenced,
                "booted": back - on,
                "validated": validated - back,
                "released": released - validated,
            }


async def measure_reboot(bus: Bus, url: str, tmp: Path) -> dict[str, float]:
    with bmcs(tmp / "bmcs") as start:
        async with platform(bus, url, tmp) as make:
            env, node = await bmc_node(
                make, start, nats_url=url, ladder=ladder(("reboot", "60s"), ("oncall", "1s"))
            )
            operator = asyncio.create_task(_cooperative_reboots(env, node))
            try:
                t0 = time.time()
                await _fault(env)
                await wait_for(lambda: _released(env), "released", timeout=120)
            finally:
                operator.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await operator
            audits = await read_stream(env.bus, "AUDIT", f"remediation.*.{env.node}")
            asked = _at(audits, "reboot", text="through reboot-annotation")
            back = _at(audits, "reboot", text="rebooted")
            released = _at(audits, "release")
            return {
                "total": released - t0,
                "drained_asked": asked - t0,
                "booted": back - asked,
                "released": released - back,
            }


async def _fault(env: RecoveryEnv) -> None:
    reply = await request_injection(
        env.bus.nc, env.node, InjectRequest(gpu=3, fault="fallen-off-bus")
    )
    assert reply.ok, reply.error


async def _health_time(env: RecoveryEnv) -> float:
    events = await read_stream(env.bus, "NODES", f"node.health.{env.node}")
    return min(e.time.timestamp() for e in events if not e.data.responsive)


async def _cooperative_reboots(env: RecoveryEnv, node: Node) -> None:
    """Kured's part on a node that answers: the machine reboots itself (a power cycle of the
    same machine through its BMC stands for the OS's reboot) once per request."""
    served: set[str] = set()
    assert node.bmc is not None
    while True:
        got = await env.node_obj()
        meta = got["metadata"]
        request = meta.get("annotations", {}).get("nodeward.io/reboot-request", "")
        if (
            meta.get("labels", {}).get("nodeward.io/reboot-required") == "true"
            and request not in served
        ):
            served.add(request)
            await asyncio.to_thread(node.bmc.ipmitool, "chassis", "power", "cycle")
        await asyncio.sleep(0.1)


async def storm(
    bus: Bus, url: str, tmp: Path, group: int, floor: str, hung: int
) -> tuple[int, int]:
    """(ladders started, refused by the floor) when `hung` of `group` nodes hang at once."""
    uid = uuid.uuid4().hex[:6]
    nodes = [f"storm-{uid}-{i}" for i in range(group)]
    sim = SimCluster(
        Seed(namespaces=["nodeward"], nodes=[NodeSeed(name=n) for n in nodes]),
        port=0,
        lease_renew_s=0.5,
        node_monitor_period_s=0.5,
    )
    await sim.start()
    admin = KubeClient.from_settings(
        ClusterSettings(kubeconfig=sim.write_kubeconfig(tmp / f"kc-{uid}"))
    )
    own = sim.write_kubeconfig(tmp / f"kc-recovery-{uid}", identity="recovery")
    settings = Settings(
        bus={"url": url},
        cluster={"kubeconfig": own, "retries": 1},
        services={
            "recovery": {
                "consumer": f"recovery-{uid}",
                "bucket": f"recovery-{uid}",
                "subjects": [f"remediation.quarantine.{uid}"],
                "maintenance_subjects": [f"maintenance.done.{uid}"],
                "node_subjects": [f"node.health.{n}" for n in nodes],
                "interval": "0.2s",
                "breaker": {"bucket": f"breaker-{uid}", "max_percent": 100, "max_nodes": 1000},
                "hang": {
                    "check_interval": "0.2s",
                    "conditions": {"KernelDeadlock": "0s"},
                    "ladders": [
                        {"name": "storm", "min_healthy": floor,
                         "steps": [{"action": "reboot", "timeout": "1h"}]}
                    ],
                },
            }
        },
    )  # fmt: skip
    daemon = await build_recovery(settings)
    await daemon.start()
    try:
        at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        condition = {"type": "KernelDeadlock", "status": "True", "reason": "Storm",
                     "message": "bench", "lastTransitionTime": at, "lastHeartbeatTime": at}  # fmt: skip
        await asyncio.gather(
            *(
                admin.request(
                    "PATCH",
                    f"/api/v1/nodes/{n}/status",
                    body={"status": {"conditions": [condition]}},
                    content_type=STRATEGIC_PATCH,
                )
                for n in nodes[:hung]
            )
        )

        async def decided() -> tuple[int, int] | None:
            started = refused = 0
            for n in nodes[:hung]:
                events = await read_stream(bus, "AUDIT", f"remediation.recover.{n}")
                outcomes = {(e.data.outcome.value, e.data.guard) for e in events}
                started += ("applied", None) in outcomes
                refused += ("refused", "min_healthy") in outcomes
            return (started, refused) if started + refused == hung else None

        return await wait_for(decided, "every hung node decided", timeout=60)
    finally:
        await daemon.stop()
        await admin.close()
        await sim.stop()


async def run(args: Any) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-hang-") as tmp_text:
        tmp = Path(tmp_text)
        async with EmbeddedNats(tmp / "nats") as server:
            bus = await Bus.connect(BusSettings(url=server.url), source="bench/recovery-hang")
            try:
                results: dict[str, list[dict[str, float]]] = {"bmc": [], "reboot": []}
                for r in range(args.runs):
                    order = ["bmc", "reboot"] if r % 2 == 0 else ["reboot", "bmc"]
                    for mode in order:
                        work = tmp / f"{mode}-{r}"
                        work.mkdir()
                        fn = measure_bmc if mode == "bmc" else measure_reboot
                        got = await fn(bus, server.url, work)
                        results[mode].append(got)
                        print(
                            f"run {r + 1} {mode}: "
                            + ", ".join(f"{k} {v:.2f}" for k, v in got.items()),
                            flush=True,
                        )
                if args.runs:
                    print("\nmedians (s):")
                    for mode, runs in results.items():
                        keys = runs[0].keys()
                        print(
                            f"  {mode:7s} "
                            + ", ".join(
                                f"{k} {statistics.median(x[k] for x in runs):.2f}" for k in keys
                            )
                        )
                    bmc = statistics.median(x["total"] for x in results["bmc"])
                    coop = statistics.median(x["total"] for x in results["reboot"])
                    print(f"  BMC path / cooperative reboot: {bmc / coop:.2f}x")
                print(f"\nstorm: group {args.group}, min_healthy {args.floor}")
                for k in args.storm_list:
                    work = tmp / f"storm-{k}"
                    work.mkdir()
                    started, refused = await storm(bus, server.url, work, args.group, args.floor, k)
                    print(
                        f"  {k} hung at once: {started} remediated, {refused} refused by the floor"
                    )
            finally:
                await bus.close(grace=1)


def main() -> int:
    parser = options(__doc__ or "", runs=3, group=10)
    parser.add_argument("--floor", default="50%")
    parser.add_argument("--storms", default="1,3,5,8")
    args = parser.parse_args()
    args.storm_list = [int(x) for x in args.storms.split(",")]
    try:
        need_ipmi_sim()
    except BaseException as exc:  # noqa: BLE001 - pytest's Skipped says why
        print(f"cannot run: {exc}", file=sys.stderr)
        return 2
    configure_logging("warning")
    asyncio.run(run(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
