"""Benchmark: a maintenance that moves its sessions (`maintenance start NODE --move`), against
the same maintenance evicting them, in the same run.

One node holds N bare pods (no owner), each labelled `nodeward.io/checkpoint=true` and
annotated `nodeward.io/move=true`, one container, no GPUs; a spare node with
`nodeward.io/cuda-checkpoint=true` has room for all of them. Real parts: a nats-server, Debian's
docker-registry and buildah; the sim cluster runs in this process, its kubelets writing CRI-O
archives under a temporary node root and restoring checkpoint images from the registry; the
checkpoint service (`services.maintenance`) is built in this process with its defaults
(`parallelism`, `tick`) unless given. Each measurement gets a fresh sim cluster and service
(their own bucket and consumer) on the shared nats-server and registry.

For each N, per run, each mode (their order rotating between runs):

- move: `maintenance.requested` with `move=true`, timed to every session `Running` on the
  spare node (the last `maintenance.moving.<node>` event naming where a pod went);
- move-sts (with `--modes`): the same, each pod the one pod of its own StatefulSet, so each
  moves through its owner (`take-over`: the set deleted leaving its pod; `give-back`: the
  set created again, adopting the replacement); timed to the last pod given back;
- evict (the baseline): the same request without `move`, timed to `done` (the state's
  `finished_at`): the pods are checkpointed, then drained.

From the MAINTENANCE stream's phase events: `checkpoint` (the `checkpointing` phase to the
`checkpointed` one), `moving` (that phase to the last pod running), `drain` (`draining` to
`done`). Per pod (medians over the pods, then over the runs): `build` and `push` (timing shims
around `image.build_image` and `image.push_image`, the push with its confirmation by digest;
product code unchanged), `image` (the build's start to the pod's `remediation.push-image` audit:
build and push, buildah's temporary storage removed, the archive deleted, the records saved),
`stop` (that audit to its `remediation.stop` one: the `imaged` stage saved, the target checked
again, the eviction until the pod is gone), `restore` (its `remediation.restore` audit, the
replacement created, to the moving event once it is `Running`: the kubelet's pull and restore,
seen at the service's tick) and `pod` (the build's start to that event: one pod's whole move).

Usage: PYTHONPATH=$PWD python bench/move.py [--pods 1,8,32] [--runs 3] [--parallelism 4]
       [--tick 1.0] [--modes move,evict,move-sts]
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import nats
from benchlib import options

from launch.registry import RegistryUnavailable, run_registry
from nodeward.bus import Bus
from nodeward.bus.kv import TypedKV
from nodeward.bus.server import EmbeddedNats
from nodeward.config import BusSettings, Settings
from nodeward.logs import configure_logging
from schemas import decode, make_event
from schemas.maintenance import Maintenance, MaintenancePhase
from services.maintenance import image
from services.maintenance.common import CheckpointSettings
from services.maintenance.plan import CHECKPOINT_LABEL, MOVE_ANNOTATION
from services.maintenance.service import build
from services.maintenance.state import CUDA_CHECKPOINT_LABEL, MaintenanceState, state_key
from sim.cluster import SimCluster
from sim.cluster.seed import ContainerSeed, NodeSeed, Owner, PodSeed, Seed

NS = "ml-team"
CONTAINER = "main"
STEPS = ("build", "push", "image", "stop", "restore", "pod")


def seed(node: str, pods: int, owned: bool = False) -> Seed:
    """`pods` sessions on `node`: bare, or (`owned`) each its own one-replica StatefulSet's."""
    spare = f"{node}-spare"
    cuda = {CUDA_CHECKPOINT_LABEL: "true"}
    return Seed(
        namespaces=[NS, "nodeward"],
        nodes=[NodeSeed(name=node, labels=cuda), NodeSeed(name=spare, labels=cuda)],
        pods=[
            PodSeed(
                name=f"s{i}-0" if owned else f"session-{i}",
                namespace=NS,
                node=node,
                role="notebook",
                owner=Owner(kind="StatefulSet", name=f"s{i}") if owned else None,
                labels={CHECKPOINT_LABEL: "true"},
                annotations={MOVE_ANNOTATION: "true"},
                containers=[ContainerSeed(name=CONTAINER, image="registry.example.com/main:1")],
            )
            for i in range(pods)
        ],
    )


class Shims:
    """`image.build_image` and `image.push_image` timed: (pod, began, ended) per call, epoch
    seconds. `moving.py` calls them through the module, so replacing its attributes is seen."""

    def __init__(self) -> None:
        self.calls: dict[str, list[tuple[str, float, float]]] = {"build": [], "push": []}

    @staticmethod
    def _pod(ref: str) -> str:
        """`<registry>/<ns>/<pod>-<container>:<tag>` -> `<pod>`."""
        return ref.rsplit(":", 1)[0].rsplit("/", 1)[1].removesuffix(f"-{CONTAINER}")

    def _timed(self, step: str, real: Callable[..., Awaitable[Any]], at: int) -> Any:
        async def timed(*args: Any, **kwargs: Any) -> Any:
            began = time.time()
            try:
                return await real(*args, **kwargs)
            finally:
                self.calls[step].append((self._pod(str(args[at])), began, time.time()))

        return timed

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        build_image, push_image = image.build_image, image.push_image
        image.build_image = self._timed("build", build_image, 2)  # (archive, container, ref)
        image.push_image = self._timed("push", push_image, 0)  # (ref, settings)
        try:
            yield
        finally:
            image.build_image, image.push_image = build_image, push_image

    def clear(self) -> None:
        for calls in self.calls.values():
            calls.clear()


def settings(
    nats_url: str, kubeconfig: Path, node: str, uid: str, registry: str, root: Path, args: Any
) -> Settings:
    """The checkpoint service's defaults, but for its own consumer, bucket and breaker (a
    fresh service per measurement), its rate limit and breaker opened wide, the images'
    registry and where the sim's node filesystems are."""
    return Settings(
        bus={"url": nats_url},
        cluster={"kubeconfig": kubeconfig},
        services={
            "checkpoint": {
                "consumer": f"checkpoint-{uid}",
                "bucket": f"checkpoint-{uid}",
                "subjects": [f"maintenance.requested.{node}"],
                "parallelism": args.parallelism,
                "tick": f"{args.tick}s",
                "rate_limit": {"per_minute": 1e6, "burst": 100000},
                "breaker": {"bucket": f"breaker-{uid}", "max_percent": 100, "max_nodes": 100000},
                "images": {
                    "registry": f"{registry}/ckpt",
                    "insecure": True,
                    "node_root": str(root / "{node}"),
                },
            }
        },
    )


def _ts(when: datetime | None) -> float:
    assert when is not None
    return when.timestamp()


async def measure(
    n: int, mode: str, bus: Bus, nats_url: str, registry: str, shims: Shims, args: Any
) -> dict[str, Any]:
    """One maintenance of a node with `n` opted-in pods (`mode`: move, move-sts, evict); its
    timings in seconds."""
    move = mode != "evict"
    uid = uuid.uuid4().hex[:8]
    node = f"mv-{uid}"
    shims.clear()
    with tempfile.TemporaryDirectory(prefix="bench-move-") as tmp:
        root = Path(tmp) / "nodes"
        sim = SimCluster(
            seed(node, n, owned=mode == "move-sts"),
            port=0,
            archive_root=root,
            registries=(registry,),
        )
        await sim.start()
        nc = await nats.connect(nats_url)
        daemon = None
        try:
            kubeconfig = sim.write_kubeconfig(Path(tmp) / "kubeconfig", identity="checkpoint")
            config = settings(nats_url, kubeconfig, node, uid, registry, root, args)
            daemon = await build(config)
            await daemon.start()
            while not (await daemon.readiness()).ready:  # noqa: ASYNC110 - polls a check
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)  # the workflow lease taken, the caches warm
            events: list[Any] = []

            async def on_msg(msg: Any) -> None:
                with contextlib.suppress(Exception):
                    events.append(decode(msg.subject, msg.headers, msg.data))

            await nc.subscribe(f"maintenance.*.{node}", cb=on_msg)
            await nc.subscribe("remediation.*.>", cb=on_msg)
            await nc.flush()
            kv = TypedKV(await bus.kv(f"checkpoint-{uid}"), MaintenanceState)
            request = make_event(
                Maintenance.model_validate(
                    {"node": node, "phase": "requested", "maintenance_id": f"bench-{uid}"}
                    | {"reason": "bench", "requested_by": "bench", "deadline_s": 900, "move": move}
                ),
                source="bench/move",
            )
            began = time.time()
            await bus.publish(request)
            state: MaintenanceState | None = None
            deadline = time.monotonic() + args.timeout
            while time.monotonic() < deadline:
                found = await kv.get(state_key(node))
                state = found.value if found else None
                if state is not None and state.terminal:
                    break
                await asyncio.sleep(0.05)
            await nc.flush()
            await asyncio.sleep(0.2)  # the last events' delivery to this subscriber
        finally:
            await nc.close()
            if daemon is not None:
                await daemon.stop()
            await sim.stop()
    if state is None or state.phase != MaintenancePhase.DONE:
        raise RuntimeError(f"{node}: not done within {args.timeout} s: {state and state.phase}")
    return _timings(n, move, node, began, state, events, shims)


def _timings(
    n: int,
    move: bool,
    node: str,
    began: float,
    state: MaintenanceState,
    events: list[Any],
    shims: Shims,
) -> dict[str, Any]:
    phases: dict[MaintenancePhase, list[tuple[float, Maintenance]]] = {}
    audits: dict[str, dict[str, float]] = {}
    for event in events:
        data = event.data
        if isinstance(data, Maintenance) and data.node == node:
            phases.setdefault(data.phase, []).append((_ts(event.time), data))
        elif getattr(data, "details", {}).get("node") == node and data.outcome == "applied":
            audits.setdefault(data.action, {})[data.target.name] = _ts(event.time)

    def first(phase: MaintenancePhase) -> float:
        return min(t for t, _ in phases[phase])

    def last(phase: MaintenancePhase) -> float:
        return max(t for t, _ in phases[phase])

    done = _ts(state.finished_at)
    out: dict[str, Any] = {"done": done - began}
    out["checkpoint"] = last(MaintenancePhase.CHECKPOINTED) - first(MaintenancePhase.CHECKPOINTING)
    out["drain"] = done - first(MaintenancePhase.DRAINING)
    if not move:
        out["total"] = out["done"]
        return out
    running = {
        m.pod.name: t
        for t, data in phases.get(MaintenancePhase.MOVING, [])
        for m in data.moved
        if m.to_node
    }
    stages = {key: p.move.stage if p.move else None for key, p in state.pods.items()}
    if len(running) != n:
        raise RuntimeError(f"{node}: {len(running)} of {n} pods moved: {stages}")
    out["total"] = max(running.values()) - began
    out["moving"] = max(running.values()) - first(MaintenancePhase.MOVING)
    out["build"] = statistics.median(end - start for _, start, end in shims.calls["build"])
    out["push"] = statistics.median(end - start for _, start, end in shims.calls["push"])
    pushed, stopped, created = (audits.get(a, {}) for a in ("push-image", "stop", "restore"))
    built = {pod: start for pod, start, _ in shims.calls["build"]}
    out["image"] = statistics.median(pushed[p] - built[p] for p in running)
    out["stop"] = statistics.median(stopped[p] - pushed[p] for p in running)
    out["restore"] = statistics.median(running[p] - created[p] for p in running)
    out["pod"] = statistics.median(running[p] - built[p] for p in running)
    return out


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def report(results: dict[tuple[int, str], list[dict[str, Any]]], args: Any) -> None:
    def median(n: int, mode: str, key: str) -> float | None:
        values = [r[key] for r in results.get((n, mode), []) if key in r]
        return statistics.median(values) if values else None

    print(
        f"\nmedians of {args.runs} run(s), seconds; parallelism {args.parallelism}, "
        f"tick {args.tick:g} s; per-pod steps are medians over the pods"
    )
    head = ["N", "mode", "total", "move/evict", "done", "checkpoint", "moving", "drain"]
    head += [f"{s}/pod" for s in STEPS]
    rows = []
    for n in args.pod_counts:
        for mode in args.mode_list:
            total, evict = median(n, mode, "total"), median(n, "evict", "total")
            ratio = f"{total / evict:.2f}" if mode != "evict" and total and evict else ""
            rows.append(
                [str(n), mode, _cell(total), ratio]
                + [_cell(median(n, mode, k)) for k in ("done", "checkpoint", "moving", "drain")]
                + [_cell(median(n, mode, s)) for s in STEPS]
            )
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    for row in [head, *rows]:
        print("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)))
    print(
        "total: from the request to every session Running on the spare node (move) / to done "
        "(evict); checkpoint, moving, drain: the phases' spans"
    )


def missing() -> str | None:
    """Why the bench cannot run here (one line), or None."""
    for binary, package in (("buildah", "buildah"), ("docker-registry", "docker-registry")):
        if shutil.which(binary) is None:
            return f"{binary} not found (Debian package {package}; scripts/system-deps.sh)"
    return None


async def run(args: Any) -> None:
    shims = Shims()
    results: dict[tuple[int, str], list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-move-") as tmp:
        async with (
            EmbeddedNats(Path(tmp) / "nats") as server,
            run_registry(Path(tmp) / "registry") as registry,
        ):
            bus = await Bus.connect(BusSettings(url=server.url), source="bench/move")
            try:
                with shims.installed():
                    if args.warmup:  # imports, buildah's and the registry's first calls
                        for mode in args.mode_list:
                            await measure(1, mode, bus, server.url, registry, shims, args)
                    for r in range(args.runs):
                        for n in args.pod_counts:
                            shift = (r + n) % len(args.mode_list)
                            modes = args.mode_list[shift:] + args.mode_list[:shift]
                            for mode in modes:
                                got = await measure(n, mode, bus, server.url, registry, shims, args)
                                results.setdefault((n, mode), []).append(got)
                                print(
                                    f"run {r + 1} N={n} {mode}: total {got['total']:.2f} s, "
                                    + ", ".join(
                                        f"{k} {v:.2f}" for k, v in got.items() if k != "total"
                                    ),
                                    flush=True,
                                )
            finally:
                await bus.close(grace=1)
    report(results, args)


def main() -> None:
    defaults = CheckpointSettings()
    parser = options(
        __doc__.splitlines()[0],
        runs=3,
        parallelism=defaults.parallelism,
        tick=defaults.tick.total_seconds(),
        timeout=600.0,
        warmup=1,
    )
    parser.add_argument("--pods", default="1,8,32", help="pods on the node, comma-separated")
    parser.add_argument(
        "--modes", default="move,evict", help="move, evict, move-sts; comma-separated"
    )
    args = parser.parse_args()
    args.pod_counts = [int(p) for p in args.pods.split(",") if p]
    args.mode_list = [m for m in args.modes.split(",") if m]
    if not set(args.mode_list) <= {"move", "evict", "move-sts"}:
        parser.error(f"--modes: {args.modes}: each one of move, evict, move-sts")
    why = missing()
    if why is not None:
        print(f"skipped: {why}")
        return
    configure_logging("error", "console")
    try:
        asyncio.run(run(args))
    except RegistryUnavailable as exc:
        print(f"skipped: {exc}")
        sys.exit(0)


if __name__ == "__main__":
    main()
