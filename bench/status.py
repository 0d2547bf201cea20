"""Benchmark: how long `nodeward status` takes to read a fleet, now against before.

For each fleet size (`--nodes`, default 1000 and 5000) a fresh embedded nats-server is
seeded as a running fleet leaves it: per node each of 8 GPUs' last change on
`gpu.health.v1` (its state when the agent started) and, stored after them, the node's last
`gpu.heartbeat.v1`; a `gpu.telemetry.v1`, an `energy.node.v1` and a session's
`session.activity.v1`; KV records as the services write them (the cordon service's node
record, the energy totals, a culler session on every tenth node, a maintenance on every
hundredth); 200 audit records. Every node's heartbeat is sent again every 20 s of the run
(untimed), as a live fleet's agents send one every 30 s. Then, alternating, `--runs` times
each:

- before: `gather_status` of `nodeward/fleet_status.py` as it was at `--baseline` (git
  revision, default e6d5841: every GPU's last `gpu.health` read, 40,000 messages for
  5,000 nodes, each decoded as a whole event, the collector running);
- now: `gather_status` of this tree (each node's last heartbeat and the changes stored
  since; telemetry only for nodes without a recent heartbeat), with the collector off as
  `nodeward status` has it (the command turns it off; here `collector_paused`, whose one
  collection after the read is left untimed);
- with `--per-node`, the reads `status` made before batching (every KV key listed then read
  one at a time, each subject's last message by `get_last_msg`, 64 at a time).

First, twice `--runs` times each, alternating, the command's start alone ("start": with
the URL of a closed port it starts, loads what it reads with, finds no server and exits 1).
Then, `--runs` times each, alternating, `nodeward status` as a command of its own
(`python -m launch status`: the interpreter's start and imports, the read, the table
printed), from this tree ("CLI now") and from the tree at `--cli-baseline` (git revision,
default main, extracted to a temporary folder: "CLI before"). With `--bytecode` both
trees' modules are compiled first (`compileall`, into their `__pycache__` folders, removed
from this tree after), as `pip install` leaves an installed nodeward; without it, under
PYTHONDONTWRITEBYTECODE each run compiles the tree's sources again.

Both build the picture `status` prints (`FleetStatus`); the run checks they agree on every
node's GPU states, health, attention and agents' states. Prints the medians of the wall time and of the CPU time this process and
the nats-server used (a figure other load on the machine disturbs less), with the ratios
before/now; a read that failed (a timeout, or the server dropping a slow consumer, as the
old read does at 5,000 nodes on a loaded machine) is counted and left out of the medians.

Usage: python bench/status.py [--nodes 1000 5000] [--runs 5] [--baseline REV]
       [--cli-baseline REV] [--bytecode] [--per-node]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import inspect
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchlib import module_at  # noqa: E402 - bench/, as python runs it
from nats.js.errors import NoKeysError, NotFoundError  # noqa: E402 - after the path is set

from nodeward.bus import Bus  # noqa: E402
from nodeward.bus.kv import TypedKV  # noqa: E402
from nodeward.bus.server import EmbeddedNats  # noqa: E402
from nodeward.config import BusSettings  # noqa: E402
from nodeward.fleet_status import CLOCK_SLACK, collector_paused, gather_status  # noqa: E402
from nodeward.logs import configure_logging  # noqa: E402
from schemas import DecodeError, decode, make_event  # noqa: E402
from schemas.common import ObjectRef  # noqa: E402
from schemas.energy import EnergyNode  # noqa: E402
from schemas.gpu import GpuHealth, GpuHeartbeat, GpuState, GpuTelemetry, HealthState  # noqa: E402
from schemas.remediation import Outcome, Remediation  # noqa: E402
from schemas.session import SessionActivity  # noqa: E402
from schemas.state.cordon import NODES, GpuRecord, NodeRecord  # noqa: E402
from schemas.state.energy import TOTALS, EnergyTotals  # noqa: E402
from services.culler.state import SESSIONS, SessionRecord  # noqa: E402
from services.maintenance.state import MAINTENANCES, MaintenanceState  # noqa: E402

GPUS = 8
BEAT_S = 20
"""The bench sends every node's heartbeat again when the last were sent this long ago, so
they stay as fresh as a live fleet's (every 30 s)."""


async def seed(bus: Bus, nodes: int) -> list[Any]:
    """A fleet of `nodes` as its agents and services leave the streams and KV; returns each
    node's heartbeat, for `beat` to send again as the agents do every 30 s."""
    now = datetime.now(UTC)
    events: list[Any] = []
    beats: list[Any] = []  # each node's last heartbeat, stored after its GPUs' start states
    cordon = TypedKV(await bus.kv(NODES.name), NodeRecord)
    totals = TypedKV(await bus.kv(TOTALS.name), EnergyTotals)
    culler = TypedKV(await bus.kv(SESSIONS.name), SessionRecord)
    checkpoint = TypedKV(await bus.kv(MAINTENANCES.name), MaintenanceState)
    telemetry = GpuTelemetry.example()
    energy = EnergyNode.example()
    activity = SessionActivity.example()
    for i in range(nodes):
        node = f"gpu-{i:05d}"
        health = [
            GpuHealth(
                node=node,
                gpu_index=g,
                gpu_uuid=f"GPU-{i}-{g}",
                state=HealthState.HEALTHY,
                observed_at=now,
                agent_boot_id=f"boot-{i}",
                sequence=1,
            )
            for g in range(GPUS)
        ]
        events += health
        beats.append(
            GpuHeartbeat(
                node=node,
                gpus=[
                    GpuState(
                        gpu_index=h.gpu_index,
                        gpu_uuid=h.gpu_uuid,
                        state=h.state,
                        sequence=h.sequence,
                        changed_at=h.observed_at,
                    )
                    for h in health
                ],
                interval_s=30,
                observed_at=now,
                agent_boot_id=f"boot-{i}",
            )
        )
        events.append(telemetry.model_copy(update={"node": node}))
        events.append(energy.model_copy(update={"node": node}))
        events.append(activity.model_copy(update={"node": node, "pod": f"nb-{i:05d}"}))
        await cordon.put(
            NODES.key(node),
            NodeRecord(
                gpus={
                    str(h.gpu_index): GpuRecord(
                        state=h.state, observed_at=now, event_id=f"e-{i}-{h.gpu_index}"
                    )
                    for h in health
                }
            ),
        )
        await totals.put(TOTALS.key(node), EnergyTotals(energy_j=1e6, co2e_g=20, updated_at=now))
        if i % 10 == 0:
            await culler.put(
                SESSIONS.key("user-a", f"nb-{i:05d}"),
                SessionRecord(
                    node=node,
                    reason="idle",
                    idle_since=now - timedelta(hours=2),
                    warned_at=now,
                    deadline=now + timedelta(hours=1),
                ),
            )
        if i % 100 == 0:
            await checkpoint.put(
                MAINTENANCES.key(node),
                MaintenanceState(
                    maintenance_id=f"m-{i}",
                    node=node,
                    requested_at=now,
                    trigger_id=f"t-{i}",
                    start_at=now,
                    deadline_s=600,
                ),
            )
    for i in range(200):
        events.append(
            Remediation(
                action="quarantine",
                target=ObjectRef(kind="Node", name=f"gpu-{i % nodes:05d}"),
                outcome=Outcome.REFUSED,
                reason=f"bench {i}",
                actor="service/cordon",
            )
        )
    for batch in (events, beats):
        wrapped = [make_event(e, source="bench/status") for e in batch]
        for i in range(0, len(wrapped), 500):
            await bus.publish_many(wrapped[i : i + 500])
        if batch is events:  # a running fleet's start states are older than its heartbeats
            await asyncio.sleep((CLOCK_SLACK + timedelta(seconds=1)).total_seconds())
    return beats


async def beat(bus: Bus, beats: list[Any]) -> None:
    """Every node's heartbeat again, as a live fleet's agents send one every 30 s."""
    wrapped = [make_event(b, source="bench/status") for b in beats]
    for i in range(0, len(wrapped), 500):
        await bus.publish_many(wrapped[i : i + 500])


async def per_node_reads(nc: Any, actions: int = 10) -> int:
    """What `status` read before batching: KV one key at a time, last messages one subject
    at a time (64 concurrently), the audit trail one message at a time."""
    js = nc.jetstream()
    kv = await js.key_value(NODES.name)
    try:
        keys = await kv.keys()
    except NoKeysError:
        keys = []
    records = 0
    for key in keys:
        entry = await kv.get(key)
        records += bool(entry.value)

    async def last(stream: str, subject: str) -> Any:
        try:
            msg = await js.get_last_msg(stream, subject)
            return decode(msg.subject or subject, msg.headers, msg.data or b"")
        except (NotFoundError, DecodeError):
            return None

    got = 0
    for stream, pattern in (("GPU", "gpu.health.>"), ("TELEMETRY", "gpu.telemetry.>")):
        info = await js.stream_info(stream, subjects_filter=pattern)
        subjects = sorted(info.state.subjects or {})
        for i in range(0, len(subjects), 64):
            found = await asyncio.gather(*(last(stream, s) for s in subjects[i : i + 64]))
            got += sum(1 for e in found if e is not None)
    await js.stream_info("DLQ", subjects_filter="dlq.>")
    info = await js.stream_info("AUDIT")
    seq = info.state.last_seq
    while seq >= max(info.state.first_seq, 1) and seq > info.state.last_seq - actions:
        await js.get_msg("AUDIT", seq)
        seq -= 1
    return records + got


def baseline(rev: str) -> ModuleType:
    """`nodeward/fleet_status.py` as it was at git revision `rev`, as a module of its own."""
    module = module_at(rev, "nodeward/fleet_status.py", "fleet_status_baseline")
    gather = module.gather_status
    own_parts = hasattr(module, "Quarantined")  # it drew the quarantines itself then
    if own_parts and "views" in inspect.signature(gather).parameters:
        # A revision that reads the services' views as well as its own parts of the picture
        # (before they all moved into views): read without them, or the parts it draws
        # itself would be said twice (no view it had then has data in this fleet).
        module.gather_status = partial(gather, views={})
    return module


async def read(gather: Any, nc: Any, url: str) -> int:
    return len((await gather(nc, nats_url=url)).nodes)


def tree_at(rev: str, into: Path) -> Path:
    """The repository's files at git revision `rev`, extracted into `into`."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", rev], capture_output=True, check=True
    ).stdout
    into.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


PACKAGES = ("schemas", "nodeward", "agents", "services", "sim", "launch")


def compile_tree(tree: Path) -> None:
    """Bytecode for every module of `tree`'s packages, as an installed nodeward has."""
    packages = [str(tree / p) for p in PACKAGES]
    subprocess.run([sys.executable, "-m", "compileall", "-q", *packages], check=True)


def bytecode_in(tree: Path) -> list[Path]:
    """The `__pycache__` folders of `tree`'s packages."""
    return [d for p in PACKAGES for d in (tree / p).rglob("__pycache__")]


def cli_run(
    url: str, state_dir: str, tree: Path = REPO, *, reach: bool = True
) -> tuple[float, float]:
    """Wall and CPU seconds (user and system) `nodeward status` takes as a command of its
    own (start, read, print), run from the source tree `tree`. With `reach` false, `url`
    is a closed port: the command starts, loads, finds no server and exits 1."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "launch", "status", "--nats", url, "--state-dir", state_dir],
            cwd=tree,
            env=os.environ | {"PYTHONPATH": str(tree)},
            stdout=out,
            stderr=err,
        )
        _, status, usage = os.wait4(proc.pid, 0)
        took = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        said = err.read().decode()
        if proc.returncode != (0 if reach else 1):
            raise RuntimeError(f"nodeward status exited {proc.returncode}: {said[-2000:]}")
        out.seek(0)
        if reach:
            assert b"node(s)" in out.read(), "no fleet table printed"
        else:
            assert "cannot connect" in said, said[-2000:]
    return took, usage.ru_utime + usage.ru_stime


def closed_port() -> int:
    """A loopback port nothing listens on (one the kernel just handed out and took back)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def starts(runs: int, cli_before: Path) -> dict[str, float]:
    """Medians of the command's start alone, before and now (alternating): interpreter,
    imports, settings, a refused connection, the error line."""
    url = f"nats://127.0.0.1:{closed_port()}"
    got: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as state_dir:
        for _ in range(runs):
            for label, tree in (("before", cli_before), ("now", REPO)):
                wall, used = cli_run(url, state_dir, tree, reach=False)
                got.setdefault(label, []).append(wall)
                got.setdefault(f"{label}_cpu", []).append(used)
    return {k: statistics.median(v) for k, v in got.items()}


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of process `pid` so far (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def states(fleet: Any) -> dict[str, tuple[Any, ...]]:
    """What both must agree on per node: GPU states, health, attention, agents' states."""
    return {
        n.name: (n.gpus, n.health, n.attention, {k: a.state for k, a in n.agents.items()})
        for n in fleet.nodes
    }


async def timed(fn: Callable[[], Awaitable[int]]) -> float:
    start = time.perf_counter()
    await fn()
    return time.perf_counter() - start


async def one_size(
    nodes: int, runs: int, before: ModuleType, per_node: bool, cli_before: Path
) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        server = EmbeddedNats(Path(tmp))
        await server.start()
        bus = await Bus.connect(BusSettings(url=server.url), source="bench/status")
        try:
            beats = await seed(bus, nodes)
            beaten = time.monotonic()
            nc = bus.nc
            new = await gather_status(nc, nats_url=server.url)
            assert len(new.nodes) == nodes, len(new.nodes)
            old = None
            for _ in range(3):  # the old read can time out on a loaded machine (counted below)
                with contextlib.suppress(Exception):
                    old = await before.gather_status(nc, nats_url=server.url)
                    break
            assert old is None or states(old) == states(new), "before and now disagree"

            assert server.proc is not None
            pid = server.proc.pid
            times: dict[str, list[float]] = {"before": [], "now": [], "per_node": []}
            cpu: dict[str, list[float]] = {"before_cpu": [], "now_cpu": []}
            failed: dict[str, int] = {"before": 0, "now": 0}
            for _ in range(runs):
                if per_node:
                    times["per_node"].append(await timed(lambda: per_node_reads(nc)))
                if time.monotonic() - beaten > BEAT_S:  # the fleet stays live (untimed)
                    await beat(bus, beats)
                    beaten = time.monotonic()
                for label, gather in (("before", before.gather_status), ("now", gather_status)):
                    gc.collect()  # each run starts clean (untimed)
                    # Now as `nodeward status` reads: the collector off (the command turns it
                    # off; here `collector_paused`, its one collection untimed); before, as then.
                    paused = collector_paused() if label == "now" else contextlib.nullcontext()
                    mine, theirs = time.process_time(), cpu_seconds(pid)
                    try:
                        with paused:
                            took = await timed(partial(read, gather, nc, server.url))
                    except Exception:  # noqa: BLE001 - a timed-out read is reported, not fatal
                        failed[label] += 1
                        continue
                    times[label].append(took)
                    used = time.process_time() - mine + cpu_seconds(pid) - theirs
                    cpu[f"{label}_cpu"].append(used)
            cli: dict[str, list[float]] = {}
            for _ in range(runs):
                for label, tree in (("cli_before", cli_before), ("cli", REPO)):
                    if time.monotonic() - beaten > BEAT_S:
                        await beat(bus, beats)
                        beaten = time.monotonic()
                    wall, used = await asyncio.to_thread(cli_run, server.url, tmp, tree)
                    cli.setdefault(label, []).append(wall)
                    cli.setdefault(f"{label}_cpu", []).append(used)
            cpu |= cli
            medians = {k: statistics.median(v) for k, v in (times | cpu).items() if v}
            return medians | {f"{k}_failed": float(v) for k, v in failed.items()}
        finally:
            await bus.close(grace=1)
            await server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 5000])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--baseline", default="e6d5841", help="git revision of 'before'")
    parser.add_argument(
        "--cli-baseline", default="main", help="git revision of 'CLI before' (the command)"
    )
    parser.add_argument(
        "--bytecode", action="store_true", help="compile both trees first (as installed)"
    )
    parser.add_argument("--per-node", action="store_true", help="also the unbatched reads")
    args = parser.parse_args()
    configure_logging("warning", "console")
    before = baseline(args.baseline)
    trees = tempfile.TemporaryDirectory()
    cli_before = tree_at(args.cli_baseline, Path(trees.name) / "tree")
    left = bytecode_in(REPO)
    if args.bytecode:
        for tree in (cli_before, REPO):
            compile_tree(tree)
    elif left:
        print(f"note: {len(left)} __pycache__ folders in this tree: 'now' loads their bytecode")
    print(f"status (read + assembled), medians of {args.runs} runs ({GPUS} GPUs per node)")
    print(
        "wall seconds; CPU: seconds of this process and the nats-server together; "
        "CLI CPU: the command's own (user and system)"
    )
    print(f"CLI: the command, from {args.cli_baseline} (before) and this tree (now)", end="")
    print(", bytecode compiled first" if args.bytecode else ", sources compiled each run")
    extra = f" {'per node':>9}" if args.per_node else ""
    print(
        f"{'nodes':>6} {'before':>8} {'now':>7} {'ratio':>6} "
        f"{'CPU before':>11} {'CPU now':>8} {'ratio':>6} {'CLI before':>11} {'CLI now':>8} "
        f"{'ratio':>6} {'CLI CPU before':>15} {'CLI CPU now':>12} {'ratio':>6}{extra}"
    )
    st = starts(2 * args.runs, cli_before)
    print(
        f"{'start':>6} (the command up to a refused connection, medians of {2 * args.runs}): "
        f"{st['before']:.3f}s before, {st['now']:.3f}s now, {st['before'] / st['now']:.2f}x; "
        f"CPU {st['before_cpu']:.3f}s before, {st['now_cpu']:.3f}s now, "
        f"{st['before_cpu'] / st['now_cpu']:.2f}x"
    )
    for nodes in args.nodes:
        m = asyncio.run(one_size(nodes, args.runs, before, args.per_node, cli_before))
        nan = float("nan")
        ratio = m.get("before", nan) / m.get("now", nan)
        tail = f" {m['per_node']:>8.3f}s" if args.per_node else ""
        fails = "".join(
            f"  ({int(m[f'{k}_failed'])} of {args.runs} '{k}' reads failed)"
            for k in ("before", "now")
            if m[f"{k}_failed"]
        )
        cpu_ratio = m.get("before_cpu", nan) / m.get("now_cpu", nan)
        print(
            f"{nodes:>6} {m.get('before', nan):>7.3f}s {m.get('now', nan):>6.3f}s "
            f"{ratio:>5.1f}x {m.get('before_cpu', nan):>10.3f}s {m.get('now_cpu', nan):>7.3f}s "
            f"{cpu_ratio:>5.1f}x {m['cli_before']:>10.3f}s {m['cli']:>7.3f}s "
            f"{m['cli_before'] / m['cli']:>5.2f}x {m['cli_before_cpu']:>14.3f}s "
            f"{m['cli_cpu']:>11.3f}s {m['cli_before_cpu'] / m['cli_cpu']:>5.2f}x{tail}{fails}"
        )
    trees.cleanup()
    if args.bytecode and not left:  # this tree as it was: its sources only
        for folder in bytecode_in(REPO):
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
