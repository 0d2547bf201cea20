"""What the fleet benches share (`fleet.py`, its `--split` mode in `fleet_split.py`, and
`chaos.py`): processes of the launcher, consumer groups' lag read through consumer info,
partition leases, CPU from /proc, faults injected through the fleet and timed to their
taint."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # the benches import the project (and its test helpers)
    sys.path.insert(0, str(REPO))
TAINT = "nodeward.io/gpu-unhealthy"


async def group(js: Any, stream: str, base: str) -> tuple[int, float, int] | None:
    """(pending, age of the oldest pending, messages acked so far) over durable `base` or
    its partitions `base-p<i>`; None if there are none."""
    infos = [
        i
        for i in await js.consumers_info(stream)
        if i.name == base or (i.name.startswith(f"{base}-p") and i.name[len(base) + 2 :].isdigit())
    ]
    return await summary(js, stream, infos) if infos else None


async def summary(js: Any, stream: str, infos: list[Any]) -> tuple[int, float, int]:
    """(pending, age of the oldest pending, acked) over the consumer infos of one group
    (its partitions summed; the age is of the oldest message at or after the lowest ack
    floor, an upper bound)."""
    pending = sum((i.num_pending or 0) + (i.num_ack_pending or 0) for i in infos)
    acked = sum((i.ack_floor.consumer_seq or 0) if i.ack_floor else 0 for i in infos)
    if not pending:
        return 0, 0.0, acked
    floor = min(
        (i.ack_floor.stream_seq if i.ack_floor else 0) or 0
        for i in infos
        if (i.num_pending or 0) + (i.num_ack_pending or 0)
    )
    try:
        msg = await js.get_msg(stream, floor + 1)
    except Exception:  # noqa: BLE001 - purged: the count still says it
        return pending, float("nan"), acked
    stored = stored_at(msg)
    age = (datetime.now(UTC) - stored).total_seconds() if stored else float("nan")
    return pending, age, acked


def service_config(url: str, partitions: int, kubeconfig: Path, context: str) -> dict[str, Any]:
    """A service's config for the benches: the R3 bus in `partitions`, the sim cluster as
    `context`, heartbeats every 30 s and the cordon's rate limit opened wide (a storm
    measures the path, not the pacing; the caller sets the breaker)."""
    return {
        "bus": {
            "url": url,
            "stream_replicas": 3,
            "partitions": partitions,
            "publish_timeout": "5s",
        },
        "cluster": {"kubeconfig": str(kubeconfig), "context": context},
        "daemon": {"port": 0},
        "log": {"level": "warning"},
        "agents": {"gpu": {"heartbeat_interval": "30s"}},
        "services": {"cordon": {"rate_limit": {"per_minute": 1_000_000, "burst": 100_000}}},
    }


async def lease_holders(
    js: Any, bucket: str, partitions: int, group: str = "cordon"
) -> dict[int, str]:
    """Partition -> holder of each unexpired partition lease of `group` in KV `bucket`."""
    kv = await js.key_value(bucket)
    out = {}
    for i in range(partitions):
        try:
            entry = await kv.get(f"lease.{group}.p{i}")
        except Exception:  # noqa: BLE001 - not taken
            continue
        record = json.loads(entry.value or b"{}")
        if record.get("expires_at", 0) > time.time():
            out[i] = record["holder"]
    return out


def stored_at(msg: Any) -> datetime | None:
    raw = getattr(msg, "time", None)
    if isinstance(raw, datetime):
        return raw
    if isinstance(raw, str):
        text = raw.rstrip("Z")
        head, _, frac = text.partition(".")
        return datetime.fromisoformat(f"{head}.{frac[:6].ljust(6, '0')}+00:00")
    return None


def cpu_seconds(root: int) -> float:
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


@dataclass
class Fault:
    node: str
    gpu: int
    sent: float  # monotonic
    partition: int
    sent_at: float = 0.0  # wall clock
    acked: float | None = None  # monotonic: the fleet's reply (its events acknowledged)
    stored: list[int] = field(default_factory=list)
    error: str | None = None
    tainted: float | None = None  # monotonic, first seen by the watch


def spawn(argv: list[str], log: Path, cwd: Path, tree: Path = REPO) -> subprocess.Popen[bytes]:
    """`python -m launch <argv>` from `tree` (this one, or a baseline's export)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NODEWARD_")}
    env |= {"PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "launch", *argv],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=log.open("w"),
    )


async def line(proc: subprocess.Popen[bytes], prefix: str, timeout: float) -> str:
    """The first stdout line of `proc` starting with `prefix`."""
    assert proc.stdout is not None
    out = proc.stdout
    async with asyncio.timeout(timeout):
        while True:
            raw = await asyncio.to_thread(out.readline)
            if not raw:
                raise RuntimeError(f"exited {proc.wait()} before printing {prefix!r}")
            line = raw.decode().strip()
            if line.startswith(prefix):
                return line


def of(pid: int, holder: str) -> bool:
    return f"-{pid}-" in holder


async def watch_taints(kube: Any, faults: dict[str, Fault], ready: asyncio.Event) -> None:
    """Note when each faulted node first shows the taint (a watch on nodes)."""
    from nodeward.kube.nodes import taints_of

    listing = await kube.nodes.listing()
    ready.set()
    async for event in kube.nodes.watch(resource_version=listing.resource_version):
        name = event.object.get("metadata", {}).get("name")
        fault = faults.get(name)
        if (
            fault is not None
            and fault.tainted is None
            and any(t.get("key") == TAINT for t in taints_of(event.object))
        ):
            fault.tainted = time.monotonic()


async def inject(nc: Any, fault: Fault, timeout: float) -> None:
    from nats.errors import NoRespondersError

    request = json.dumps({"gpu": fault.gpu, "xid": 79}).encode()
    for _ in range(40):
        try:
            msg = await nc.request(f"sim.inject.{fault.node}", request, timeout)
            break
        except NoRespondersError:  # not delivered (the fleet resubscribing): send again
            await asyncio.sleep(0.5)
        except Exception as exc:  # noqa: BLE001 - no answer: not known to be acknowledged
            fault.error = f"no reply: {exc!r}"
            return
    else:
        fault.error = "no responders for 20 s"
        return
    reply = json.loads(msg.data)
    if reply.get("ok"):
        fault.stored = list(reply.get("stored") or [])
        fault.acked = time.monotonic()
    else:
        fault.error = reply.get("error") or "refused"


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


async def provision_and_seed(
    root: Path,
    url: str,
    nodes: int,
    partitions: int,
    source: str,
    procs: dict[str, subprocess.Popen[bytes]],
    tree: Path = REPO,
) -> tuple[Any, Any, Path, Path]:
    """Provision every stream and bucket R3 on `url` (the streams in `partitions`), write
    the shipped seed resized to `nodes` GPU nodes, and start the sim cluster on it (as
    `procs["sim-cluster"]`, stopped by the caller with the rest): (bus, seed, seed file,
    kubeconfig)."""
    import yaml

    from launch.demo import sim_seed
    from nodeward.bus import Bus
    from nodeward.config import BusSettings

    settings = BusSettings(url=url, stream_replicas=3, partitions=partitions, publish_timeout="5s")
    bus = await Bus.connect(settings, source=source)
    seed = sim_seed(None, nodes)
    seed_file = root / "seed.yaml"
    seed_file.write_text(yaml.safe_dump(seed.model_dump(mode="json", exclude_none=True)))
    kubeconfig = root / "kubeconfig"
    procs["sim-cluster"] = spawn(
        ["sim", "cluster", "--seed", str(seed_file), "--kubeconfig", str(kubeconfig)],
        root / "sim-cluster.log",
        root,
        tree,
    )
    await line(procs["sim-cluster"], "kubeconfig:", 300)
    return bus, seed, seed_file, kubeconfig


def stop_all(procs: dict[str, subprocess.Popen[bytes]]) -> None:
    """SIGINT every process, wait up to 30 s for each, SIGKILL what is left."""
    for proc in procs.values():
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGINT)
    for proc in procs.values():
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


async def fleet_ready(proc: subprocess.Popen[bytes], timeout: float = 900) -> None:
    """Until the fleet process (`nodeward sim fleet`) answers `/readyz` 200: every GPU's
    first state is out."""
    import httpx

    url = (await line(proc, "fleet:", 600)).rsplit("; ", 1)[-1]
    async with httpx.AsyncClient(timeout=5) as http, asyncio.timeout(timeout):
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if (await http.get(f"{url}/readyz")).status_code == 200:
                    return
            await asyncio.sleep(0.5)
