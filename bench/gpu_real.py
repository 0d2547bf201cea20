"""Device check: the idleness agent's GPU source and the GPU agent's NVML reads on a real GPU.

Run on a GPU host (no network needed; python3 with nvidia-ml-py, torch for the load):

    python3 bench/gpu_real.py --out DIR          # the real driver (pynvml)
    python3 bench/gpu_real.py --out DIR --sim    # the same steps on the simulated NVML

Steps, each printed and written to DIR/gpu_real.json:
  a. inventory: driver, NVML and CUDA versions, every GPU's name, UUID, architecture, MIG
     mode and MIG instances;
  b. utilisation once a second for --seconds (20) through `NvmlUtilization`, while a torch
     matmul loop loads GPU 0 for the first --load-seconds (8), then stops: active -> idle.
     Alongside, GPU 0's GPM graphics utilisation (where the GPU has GPM) and power;
  c. GPM support of every GPU;
  d. `agents.sources.nvml`: identify, sample_health, sample_telemetry and XID event
     registration (one event wait, which should time out: no event);
  e. the kernel-log detector (`agents.sources.kmsg`): /dev/kmsg read from its oldest record,
     the driver's lines parsed (XIDs, the GPUs it named), and each GPU the driver named at a
     PCI address checked against the UUID NVML gives the GPU at that address.
Exit status 1 if the active -> idle check fails (or any step crashed), else 0.

Only the standard library, pynvml and (for the load) torch are imported: no pydantic or
structlog, which GPU hosts may lack.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import statistics
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout, nodeward not installed

import pynvml  # noqa: E402 - after the path is set, like everything from the repo

from agents.sources.gpu_activity import NvmlUtilization  # noqa: E402
from nodeward.watchdog import Lane  # noqa: E402

ACTIVE_MIN_PCT = 50.0  # mean utilisation under the matmul loop must be at least this
IDLE_MAX_PCT = 5.0  # and after it, at most this


def text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def call(nvml: Any, name: str, *args: Any) -> Any:
    """`nvml.<name>(*args)`, or a string saying why not (missing function, NVML error)."""
    fn = getattr(nvml, name, None)
    if fn is None:
        return f"<{name} not in this pynvml>"
    try:
        return fn(*args)
    except pynvml.NVMLError as exc:
        return f"<{exc}>"


def plain(value: Any) -> Any:
    """JSON-able form of what NVML and the readers return."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: plain(getattr(value, f.name))
            for f in dataclasses.fields(value)
            if f.name != "handle"
        }
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, bytes):
        return text(value)
    if isinstance(value, int | float | str | bool) or value is None:
        return value
    return str(value)


# -- a. inventory -------------------------------------------------------------------------


def inventory(nvml: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "driver": text(call(nvml, "nvmlSystemGetDriverVersion")),
        "nvml": text(call(nvml, "nvmlSystemGetNVMLVersion")),
        "cuda_driver": call(nvml, "nvmlSystemGetCudaDriverVersion"),
        "gpus": [],
    }
    try:
        from importlib.metadata import version

        out["nvidia_ml_py"] = version("nvidia-ml-py")
    except Exception as exc:  # noqa: BLE001 - informative only
        out["nvidia_ml_py"] = f"<{exc}>"
    count = int(nvml.nvmlDeviceGetCount())
    out["count"] = count
    for i in range(count):
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        mode = call(nvml, "nvmlDeviceGetMigMode", h)
        gpu: dict[str, Any] = {
            "index": i,
            "name": text(call(nvml, "nvmlDeviceGetName", h)),
            "uuid": text(call(nvml, "nvmlDeviceGetUUID", h)),
            "architecture": call(nvml, "nvmlDeviceGetArchitecture", h),
            "mig_mode": plain(mode),
            "migs": [],
        }
        if isinstance(mode, list | tuple) and mode[0] == pynvml.NVML_DEVICE_MIG_ENABLE:
            for m in range(int(call(nvml, "nvmlDeviceGetMaxMigDeviceCount", h) or 0)):
                mig = call(nvml, "nvmlDeviceGetMigDeviceHandleByIndex", h, m)
                if isinstance(mig, str):
                    continue
                gpu["migs"].append(
                    {
                        "name": text(call(nvml, "nvmlDeviceGetName", mig)),
                        "uuid": text(call(nvml, "nvmlDeviceGetUUID", mig)),
                        "gpu_instance_id": call(nvml, "nvmlDeviceGetGpuInstanceId", mig),
                        "utilization_rates": plain(
                            call(nvml, "nvmlDeviceGetUtilizationRates", mig)
                        ),
                    }
                )
        out["gpus"].append(gpu)
    return out


# -- b. load, then idle -------------------------------------------------------------------


class Load:
    """Loads GPU 0 for `seconds`: a torch matmul loop (real), or `set_load` (sim)."""

    def __init__(self, sim: Any | None) -> None:
        self.sim = sim
        self.note = ""
        self.running = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._torch: Any = None
        self._args: tuple[Any, Any] | None = None

    def prepare(self) -> None:
        """Import torch and warm the GPU up before the clock starts (CUDA init takes seconds)."""
        if self.sim is not None:
            self.sim.set_load(0, 0)
            self.note = "sim: set_load(0, 95) then 0"
            return
        os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # CUDA 0 = NVML 0
        try:
            import torch
        except ImportError as exc:
            self.note = f"no load: torch not importable ({exc})"
            return
        if not torch.cuda.is_available():
            self.note = "no load: torch sees no CUDA device"
            return
        dev = torch.device("cuda:0")
        a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
        b = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
        (a @ b).sum().item()
        torch.cuda.synchronize()
        self._torch, self._args = torch, (a, b)
        props = torch.cuda.get_device_properties(0)
        self.note = f"torch {torch.__version__} bf16 8192^2 matmul on {props.name}"
        if getattr(props, "uuid", None) is not None:
            self.note += f" (CUDA uuid {props.uuid})"

    def start(self, seconds: float) -> None:
        if self.sim is not None:
            self.sim.set_load(0, 95)
            self.running.set()
            self._thread = threading.Timer(seconds, self._sim_stop)
            self._thread.start()
            return
        if self._torch is None:
            return
        self._thread = threading.Thread(target=self._loop, args=(seconds,), daemon=True)
        self._thread.start()

    def _sim_stop(self) -> None:
        self.sim.set_load(0, 0)
        self.running.clear()

    def _loop(self, seconds: float) -> None:
        torch, (a, b) = self._torch, self._args or (None, None)
        self.running.set()
        end = time.monotonic() + seconds
        try:
            while time.monotonic() < end and not self._stop.is_set():
                for _ in range(8):
                    c = a @ b
                torch.cuda.synchronize()
            del c
        finally:
            self.running.clear()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)


class Gpm:
    """GPU 0's whole-GPU GPM graphics utilisation between successive calls (if it has GPM)."""

    def __init__(self, nvml: Any) -> None:
        self.nvml = nvml
        self.handle = nvml.nvmlDeviceGetHandleByIndex(0)
        support = call(nvml, "nvmlGpmQueryDeviceSupport", self.handle)
        self.supported = not isinstance(support, str) and bool(support.isSupportedDevice)
        self.samples: list[Any] = []
        if self.supported:
            self.samples = [nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()]
            nvml.nvmlGpmSampleGet(self.handle, self.samples[0])

    def read(self) -> float | str | None:
        if not self.supported:
            return None
        try:
            self.nvml.nvmlGpmSampleGet(self.handle, self.samples[1])
            req = pynvml.c_nvmlGpmMetricsGet_t()
            req.version = pynvml.NVML_GPM_METRICS_GET_VERSION
            req.numMetrics = 2
            req.sample1, req.sample2 = self.samples[0], self.samples[1]
            req.metrics[0].metricId = pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL
            req.metrics[1].metricId = pynvml.NVML_GPM_METRIC_SM_UTIL
            self.nvml.nvmlGpmMetricsGet(req)
            self.samples.reverse()
            m = req.metrics[0]
            return float(m.value) if m.nvmlReturn == pynvml.NVML_SUCCESS else f"<{m.nvmlReturn}>"
        except pynvml.NVMLError as exc:
            return f"<{exc}>"

    def close(self) -> None:
        for s in self.samples:
            call(self.nvml, "nvmlGpmSampleFree", s)


async def series(
    nvml: Any, sim: Any | None, seconds: float, load_seconds: float, settle: float = 2.0
) -> dict[str, Any]:
    util = NvmlUtilization(nvml)
    load = Load(sim)
    gpm = Gpm(nvml)
    rows: list[dict[str, Any]] = []
    try:
        load.prepare()
        print(f"  load: {load.note}")
        first = await util.utilization()  # discovery (and first GPM samples)
        for device, how in util.describe().items():
            print(f"  {device}: {how}")
        h0 = nvml.nvmlDeviceGetHandleByIndex(0)
        uuid0 = text(nvml.nvmlDeviceGetUUID(h0))
        start = time.monotonic()
        load.start(load_seconds)
        print(
            f"  {'t_s':>5} {'phase':<6} {'util_gpu0':>9} {'gpm_gfx0':>9} {'power_w':>8} "
            f"{'procs':>5}  detail"
        )
        for tick in range(1, int(seconds) + 1):
            await asyncio.sleep(max(0.0, start + tick - time.monotonic()))
            got = await util.utilization()
            r = got.get(uuid0)
            power = call(nvml, "nvmlDeviceGetPowerUsage", h0)
            procs = call(nvml, "nvmlDeviceGetComputeRunningProcesses", h0)
            row = {
                "t_s": round(time.monotonic() - start, 2),
                "phase": "load" if tick <= load_seconds else "idle",
                "loading": load.running.is_set(),
                "util_gpu0_pct": r.percent if r else None,
                "detail": r.detail if r else "GPU 0 missing from the reading",
                "gpm_graphics_gpu0_pct": gpm.read(),
                "power_w": power / 1000 if isinstance(power, int) else power,
                "processes_gpu0": [p.pid for p in procs] if isinstance(procs, list) else procs,
                "all": {k: v.percent for k, v in got.items()},
            }
            rows.append(row)
            gfx = row["gpm_graphics_gpu0_pct"]
            gfx_s = f"{gfx:9.1f}" if isinstance(gfx, float) else f"{gfx!s:>9}"
            pw = row["power_w"]
            pw_s = f"{pw:8.1f}" if isinstance(pw, float) else f"{pw!s:>8}"
            pct = row["util_gpu0_pct"]
            pct_s = f"{pct:9.1f}" if isinstance(pct, float) else f"{pct!s:>9}"
            pids = row["processes_gpu0"]
            np_s = f"{len(pids):5d}" if isinstance(pids, list) else f"{pids!s:>5}"
            print(
                f"  {row['t_s']:5.1f} {row['phase']:<6} {pct_s} {gfx_s} {pw_s} {np_s}  {row['detail']}"
            )
    finally:
        load.stop()
        gpm.close()
        util.close()
    loaded = [
        r["util_gpu0_pct"] for r in rows if r["phase"] == "load" and r["util_gpu0_pct"] is not None
    ]
    # Idle: from `settle` s after the load stopped (the driver's sample period trails it).
    settled = [
        r["util_gpu0_pct"]
        for r in rows
        if r["t_s"] >= load_seconds + settle and r["util_gpu0_pct"] is not None
    ]
    active = statistics.mean(loaded[1:] or loaded) if loaded else None
    idle = statistics.mean(settled) if settled else None
    ok = (
        active is not None
        and idle is not None
        and active >= ACTIVE_MIN_PCT
        and idle <= IDLE_MAX_PCT
    )
    verdict = (
        f"active -> idle {'SEEN' if ok else 'NOT SEEN'}: mean {active} % under load, "
        f"{idle} % after (want >= {ACTIVE_MIN_PCT} then <= {IDLE_MAX_PCT})"
    )
    return {
        "load": load.note,
        "first_reading": {k: dataclasses.asdict(v) for k, v in first.items()},
        "rows": rows,
        "active_mean_pct": active,
        "idle_mean_pct": idle,
        "ok": ok,
        "verdict": verdict,
    }


# -- c. GPM support ------------------------------------------------------------------------


def gpm_support(nvml: Any) -> list[dict[str, Any]]:
    out = []
    for i in range(int(nvml.nvmlDeviceGetCount())):
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        support = call(nvml, "nvmlGpmQueryDeviceSupport", h)
        out.append(
            {
                "index": i,
                "supported": support
                if isinstance(support, str)
                else bool(support.isSupportedDevice),
                "streaming": call(nvml, "nvmlGpmQueryIfStreamingEnabled", h),
            }
        )
    return out


# -- d. the GPU agent's reads --------------------------------------------------------------


def agent_reads(nvml: Any) -> list[dict[str, Any]]:
    # Imported here: it needs a recent nvidia-ml-py (recovery-action constants); an older
    # one fails this step only.
    from agents.sources.nvml import (
        EVENT_MASK,
        identify,
        register_events,
        sample_health,
        sample_telemetry,
    )

    out = []
    lane = Lane("device-check")
    try:
        for i in range(int(nvml.nvmlDeviceGetCount())):
            entry: dict[str, Any] = {"index": i}
            try:
                gpu = identify(nvml, lane, i)
                entry["identity"] = plain(gpu)
                entry["health"] = plain(sample_health(nvml, lane, gpu))
                entry["telemetry"] = plain(sample_telemetry(nvml, lane, gpu))
                es = nvml.nvmlEventSetCreate()
                try:
                    supported = call(nvml, "nvmlDeviceGetSupportedEventTypes", gpu.handle)
                    mask = register_events(nvml, lane, gpu, es)
                    entry["events"] = {
                        "supported_mask": supported,
                        "wanted_mask": int(EVENT_MASK),
                        "registered_mask": mask,
                        "registered": {
                            name: bool(mask & getattr(pynvml, name))
                            for name in (
                                "nvmlEventTypeXidCriticalError",
                                "nvmlEventTypeDoubleBitEccError",
                                "nvmlEventTypeDramRetirementEvent",
                                "nvmlEventTypeDramRetirementFailure",
                                "nvmlEventTypeGpuRecoveryAction",
                            )
                        },
                    }
                    t0 = time.monotonic()
                    waited = call(nvml, "nvmlEventSetWait", es, 500)
                    entry["events"]["wait_500ms"] = plain(waited)
                    entry["events"]["wait_took_s"] = round(time.monotonic() - t0, 3)
                finally:
                    call(nvml, "nvmlEventSetFree", es)
            except Exception as exc:  # noqa: BLE001 - report it and go on with the next GPU
                entry["error"] = f"{type(exc).__name__}: {exc}"
                entry["traceback"] = traceback.format_exc()
            out.append(entry)
    finally:
        lane.close()
    return out


def kernel_log(nvml: Any) -> dict[str, Any]:
    from agents.sources.kmsg import DriverLineParser, KernelLogError, KmsgReader, pci_key

    try:
        reader = KmsgReader(Path("/dev/kmsg"), from_start=True)
    except KernelLogError as exc:
        return {"readable": False, "error": str(exc)}
    parser = DriverLineParser()
    nvrm: list[str] = []
    xids: list[dict[str, Any]] = []
    try:
        records = reader.read()
        for record in records:
            if "NVRM" in record.message:
                nvrm.append(record.message)
            xids += [plain(x) for x in parser.feed(record.message)]
    finally:
        reader.close()
    nvml_at = {}
    for i in range(int(nvml.nvmlDeviceGetCount())):
        handle = nvml.nvmlDeviceGetHandleByIndex(i)
        pci = call(nvml, "nvmlDeviceGetPciInfo", handle)
        if pci is not None:
            nvml_at[pci_key(text(pci.busId))] = text(nvml.nvmlDeviceGetUUID(handle))
    named = {"{:04x}:{:02x}:{:02x}".format(*k): u for k, u in parser.uuids.items()}
    return {
        "readable": True,
        "records": len(records),
        "overruns": reader.stats.lost,
        "nvrm_lines": nvrm[-20:],
        "xids": xids,
        "driver_named": named,
        "named_match_nvml": {
            pci: nvml_at.get(key) == uuid
            for (pci, uuid), key in zip(named.items(), parser.uuids, strict=True)
        },
        "nvml_pci": {"{:04x}:{:02x}:{:02x}".format(*k): u for k, u in nvml_at.items() if k},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for gpu_real.json")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--load-seconds", type=float, default=8.0)
    parser.add_argument(
        "--settle", type=float, default=2.0, help="seconds after the load before idle counts"
    )
    parser.add_argument("--sim", action="store_true", help="simulated NVML (no GPU needed)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    sim: Any | None = None
    if args.sim:
        from sim.nvml import SimNvml

        # GPU 0 whole (loaded like the real one), GPU 1 in MIG mode (read through GPM).
        mig_gpu, whole = SimNvml.build("device-check", count=2, mig={"3g.40gb": 2}).gpus
        whole.index, mig_gpu.index = 0, 1
        sim = SimNvml("device-check", [whole, mig_gpu])
        sim.set_mig_load(1, mig_gpu.migs[0].gpu_instance_id, 40)
        nvml: Any = sim
    else:
        nvml = pynvml
    report: dict[str, Any] = {"mode": "sim" if sim else "real", "started": time.time()}
    failed = False
    nvml.nvmlInit()
    try:
        for key, title, step in (
            ("inventory", "a. inventory", lambda: inventory(nvml)),
            (
                "series",
                f"b. utilisation every 1 s for {args.seconds:g} s, load for {args.load_seconds:g} s",
                lambda: asyncio.run(
                    series(nvml, sim, args.seconds, args.load_seconds, args.settle)
                ),
            ),
            ("gpm", "c. GPM support", lambda: gpm_support(nvml)),
            ("agent_reads", "d. agents/sources/nvml.py on each GPU", lambda: agent_reads(nvml)),
            ("kernel_log", "e. the kernel log (/dev/kmsg)", lambda: kernel_log(nvml)),
        ):
            print(f"== {title}", flush=True)
            try:
                report[key] = step()
            except Exception as exc:  # noqa: BLE001 - every step runs; the report says what failed
                failed = True
                report[key] = {
                    "error": f"{type(exc).__name__}: {exc}",
                    "tb": traceback.format_exc(),
                }
                print(traceback.format_exc())
            if key != "series":
                print(json.dumps(report[key], indent=2, default=str))
            (args.out / "gpu_real.json").write_text(json.dumps(report, indent=2, default=str))
    finally:
        call(nvml, "nvmlShutdown")
    verdict = report.get("series", {}).get("verdict", "series did not run")
    ok = bool(report.get("series", {}).get("ok")) and not failed
    print(f"== {'PASS' if ok else 'FAIL'}: {verdict}")
    print(f"== report: {args.out / 'gpu_real.json'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
