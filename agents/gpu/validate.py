"""The GPU agent's answers to services.recovery, over core NATS request/reply on its own
node's subjects: a GPU reset (`agent.gpu.reset.<node>`) and the validation before a node
goes back into service (`agent.gpu.validate.<node>`).

Validation: every GPU the node should have is present and answers NVML (not lost), none
has retired pages pending or rows pending remap or a remap failure, none has an XID that
fails validation since the agent started (or since its reset), none reads failed; then,
where `dcgmi` is installed, `dcgmi diag -r LEVEL -j`, whose JSON (`"DCGM GPU Diagnostic"` up
to DCGM 3, `"DCGM Diagnostic"` in 4; `test_categories[].tests[].results[].status`) must show
no `Fail`. The reset runs `nvidia-smi -r -i <bus id>` (the driver's own GPU reset; NVML has
no public call for it); the simulator passes its own.

The XID rule (`xid_check`): each GPU's check reads only that GPU's XID history (the
agent's `watch.xids`, kept per physical GPU: since the agent started, the GPU's reset or the
driver's recovery action back to none, for at most `xid_hold`). An XID fails it when its
catalog row (`schemas/data/xid-catalog.csv`) says the GPU is unhealthy: its action is
reset_gpu, drain_and_reset, reboot_node or drain_and_rma and it is no application fault
(`schemas.xid.XidInfo.fails_validation`). Application XIDs (13, 31, 43, 45 ...), the
ignorable and informational ones (action none: 92, 63, ...), restart_app, check_nvlink and
XIDs not in the catalog are listed as ignored. XID 154 carries no action of its own (the
history records only its number): it is judged by the recovery action the agent reads now,
NVML's field as of the poll the validation makes (else the kernel log line's, while NVML
does not answer): a GPU or bus reset, drain and reset, node or system reboot fails; none
(resolved), Drain P2P and Recover IMEX Domain are ignored."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Awaitable, Callable, Iterable
from functools import partial
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from agents.gpu.backends import NvmlBackend
from agents.gpu.health import Finding
from agents.sources.nvml_compat import pynvml
from nodeward.aio import within
from nodeward.logs import get_logger
from nodeward.watchdog import CallTimeout, LaneBusy
from schemas.gpu import HealthState
from schemas.recovery import (
    RESET,
    VALIDATE,
    CheckStatus,
    ResetReply,
    ResetRequest,
    ValidateRequest,
    ValidationCheck,
    ValidationReport,
    agent_subject,
)
from schemas.xid import RECOVERY_ACTION_XID, VALIDATION_FAILING_ACTIONS, XidCatalog

if TYPE_CHECKING:
    from agents.gpu.agent import GpuAgent

Resetter = Callable[[int, str | None], Awaitable[None]]
"""Reset GPU `index` (PCI bus id given when known); raises on failure."""
Runner = Callable[[list[str], float], Awaitable[tuple[int, str]]]
"""Run a command with a timeout: (exit status, stdout)."""

_CALL_ERRORS = (pynvml.NVMLError, CallTimeout, LaneBusy)
"""What an NVML call through a lane raises: the driver's error, a hang."""
DCGM_TIMEOUT_S = {1: 120.0, 2: 600.0, 3: 1800.0, 4: 7200.0}
XID_CHECK = "no failing XID"


async def run_command(argv: list[str], timeout: float) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    try:
        out, _ = await within(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    return proc.returncode or 0, out.decode(errors="replace")


async def nvidia_smi_reset(index: int, bus_id: str | None, *, run: Runner = run_command) -> None:
    """`nvidia-smi -r -i <bus id or index>`: fails while processes hold the GPU."""
    status, out = await run(["nvidia-smi", "-r", "-i", bus_id or str(index)], 120.0)
    if status != 0:
        raise RuntimeError(" ".join(out.split())[:300] or f"nvidia-smi exited {status}")


def _gpu_ids(result: dict[str, Any]) -> list[int]:
    """The GPUs a result is about: `entity_id` of a GPU entity (DCGM 4), `gpu_id` or the
    comma-separated `gpu_ids` (DCGM 2 and 3)."""
    if "entity_id" in result and result.get("entity_group", "GPU") == "GPU":
        raw: Any = [result["entity_id"]]
    elif "gpu_id" in result:
        raw = [result["gpu_id"]]
    else:
        raw = result.get("gpu_ids") or []
        if isinstance(raw, str):
            raw = raw.split(",")
    return [int(str(g).strip()) for g in raw if str(g).strip().isdigit()]


def parse_dcgm_diag(text: str) -> tuple[str, list[ValidationCheck]]:
    """`dcgmi diag -j` output: ("pass" | "fail" | "error", one check per failed test result)."""
    start, end = text.find("{"), text.rfind("}")
    try:
        doc = json.loads(text[start : end + 1]) if start >= 0 else None
    except json.JSONDecodeError:
        doc = None
    if not isinstance(doc, dict):
        return "error", [ValidationCheck(name="dcgm", status=CheckStatus.FAIL, detail="no JSON")]
    body = next((v for k, v in doc.items() if "Diagnostic" in k and isinstance(v, dict)), doc)
    if body.get("runtime_error"):
        detail = str(body["runtime_error"])[:300]
        return "error", [ValidationCheck(name="dcgm", status=CheckStatus.FAIL, detail=detail)]
    checks: list[ValidationCheck] = []
    for category in body.get("test_categories") or []:
        for test in category.get("tests") or []:
            for result in test.get("results") or []:
                if str(result.get("status", "")).lower() != "fail":
                    continue
                ids = _gpu_ids(result)
                warnings = result.get("warnings") or result.get("warning") or []
                if isinstance(warnings, dict | str):
                    warnings = [warnings]
                why = "; ".join(
                    str(w.get("warning", w)) if isinstance(w, dict) else str(w) for w in warnings
                )
                name = f"dcgm {test.get('name', '?')}"
                targets: list[int | None] = [*ids] or [None]  # None: the node's result
                for g in targets:
                    checks.append(
                        ValidationCheck(
                            name=name,
                            status=CheckStatus.FAIL,
                            gpu=g,
                            detail=why[:300],
                        )
                    )
    return ("fail" if checks else "pass"), checks


def _unsupported(exc: Exception) -> tuple[bool | None, str]:
    """NOT_SUPPORTED skips the check (the GPU has no such counter); any other error fails it."""
    code = getattr(exc, "value", None)
    if code == pynvml.NVML_ERROR_NOT_SUPPORTED:
        return None, "not supported"
    return False, str(exc)[:200]


class Validator:
    """Answers recovery's requests for one agent's node."""

    def __init__(
        self,
        agent: GpuAgent,
        *,
        reset: Resetter | None = None,
        run: Runner = run_command,
        dcgmi: str | None = None,
    ) -> None:
        self.agent = agent
        self.reset_gpu: Resetter = reset or nvidia_smi_reset
        self.run = run
        self.dcgmi = dcgmi if dcgmi is not None else shutil.which("dcgmi")
        self.log: Any = get_logger(agent="gpu", node=agent.node, part="validate")
        self.reset_done: set[int] = set()
        """The GPUs this agent reset: their XID history starts at the reset."""

    async def serve(self, nc: Any) -> list[Any]:
        """Subscribe on `nc` (the agent's own connection); returns the subscriptions."""

        async def on_reset(msg: Any) -> None:
            reply = await self.handle_reset(msg.data)
            if msg.reply:
                await msg.respond(reply.model_dump_json().encode())

        async def on_validate(msg: Any) -> None:
            answer = await self.handle_validate(msg.data)
            if msg.reply:
                await msg.respond(answer.encode())

        node = self.agent.node
        return [
            await nc.subscribe(agent_subject(RESET, node), cb=on_reset),
            await nc.subscribe(agent_subject(VALIDATE, node), cb=on_validate),
        ]

    async def handle_reset(self, raw: bytes) -> ResetReply:
        node = self.agent.node
        try:
            req = ResetRequest.model_validate_json(raw)
        except ValidationError as exc:
            return ResetReply(ok=False, node=node, error=f"bad request: {exc.errors()[0]['msg']}")
        if req.node != node:
            return ResetReply(
                ok=False, node=node, error=f"this is {node}'s agent, not {req.node}'s"
            )
        done: list[int] = []
        for index in req.gpus:
            watch = next((w for w in self.agent.watches if w.index == index), None)
            if watch is None:
                return ResetReply(ok=False, node=node, reset=done, error=f"no GPU {index}")
            bus_id = watch.ident.pci_bus_id if watch.ident else None
            try:
                await self.reset_gpu(index, bus_id)
            except (RuntimeError, OSError, TimeoutError) as exc:
                self.log.warning("gpu reset failed", gpu=index, error=str(exc))
                return ResetReply(ok=False, node=node, reset=done, error=f"GPU {index}: {exc}")
            watch.xids.clear()  # a reset GPU starts afresh
            watch.poll_now.set()
            self.reset_done.add(index)
            done.append(index)
            self.log.info("gpu reset", gpu=index, request=req.request_id)
        return ResetReply(ok=True, node=node, reset=done)

    async def handle_validate(self, raw: bytes) -> str:
        """The report as JSON, or a one-line error object."""
        try:
            req = ValidateRequest.model_validate_json(raw)
        except ValidationError as exc:
            return json.dumps({"error": f"bad request: {exc.errors()[0]['msg']}"})
        report = await self.validate(req)
        self.log.info(
            "gpus validated", request=req.request_id, passed=report.passed, dcgm=report.dcgm
        )
        return report.model_dump_json()

    async def validate(self, req: ValidateRequest) -> ValidationReport:
        agent = self.agent
        backend = agent.backend
        timeout = agent.settings.call_timeout.total_seconds()
        checks: list[ValidationCheck] = []
        errors: tuple[type[BaseException], ...] = (*backend.errors, CallTimeout, LaneBusy)
        try:
            found = int(await agent._control.call(backend.device_count, timeout))
        except errors as exc:
            found = 0
            checks.append(
                ValidationCheck(name=backend.name, status=CheckStatus.FAIL, detail=str(exc))
            )
        expected = req.expected_gpus if req.expected_gpus is not None else len(agent.watches)
        checks.append(
            ValidationCheck(
                name="gpus present",
                status=CheckStatus.PASS if found >= expected else CheckStatus.FAIL,
                detail=f"{found} of {expected}",
            )
        )
        for watch in agent.watches:
            checks += await self._gpu_checks(watch, timeout)
        dcgm = "absent"
        if self.dcgmi:
            level = req.dcgm_level
            try:
                _, out = await self.run(
                    [self.dcgmi, "diag", "-r", str(level), "-j"], DCGM_TIMEOUT_S[level]
                )
                dcgm, found_checks = parse_dcgm_diag(out)
                checks += found_checks or [ValidationCheck(name="dcgm", status=CheckStatus.PASS)]
            except (OSError, TimeoutError) as exc:
                dcgm = "error"
                checks.append(
                    ValidationCheck(name="dcgm", status=CheckStatus.FAIL, detail=str(exc)[:300])
                )
        else:
            checks.append(
                ValidationCheck(name="dcgm", status=CheckStatus.SKIP, detail="dcgmi not installed")
            )
        return ValidationReport(
            node=agent.node,
            request_id=req.request_id,
            agent_boot_id=agent.boot_id,
            gpus_found=found,
            checks=checks,
            dcgm=dcgm,
        )

    async def _gpu_checks(self, watch: Any, timeout: float) -> list[ValidationCheck]:
        backend, index = self.agent.backend, watch.index
        out: list[ValidationCheck] = []
        await self.agent._poll(watch)  # the state as of now, not of the last poll

        bus_id = watch.ident.pci_bus_id if watch.ident else None

        def check(name: str, ok: bool | None, detail: str = "") -> None:
            status = (
                CheckStatus.SKIP if ok is None else CheckStatus.PASS if ok else CheckStatus.FAIL
            )
            out.append(
                ValidationCheck(name=name, status=status, gpu=index, bus_id=bus_id, detail=detail)
            )

        since = "since the reset" if index in self.reset_done else "since the agent started"

        async def call(fn: Callable[..., Any], *args: Any) -> Any:
            return await watch.lane.call(partial(fn, *args), timeout)

        if not isinstance(backend, NvmlBackend):
            # AMD SMI: the poll just made is the check (its RAS counters and bad pages are
            # among the findings that would fail the GPU).
            check(f"answers {backend.name}", watch.lost is None and watch.hang is None)
            _common_checks(watch, check, self.agent.catalog, since)
            return out
        nvml = backend.lib
        try:
            handle = await call(nvml.nvmlDeviceGetHandleByIndex, index)
            await call(nvml.nvmlDeviceGetUUID, handle)
        except _CALL_ERRORS as exc:
            check("answers nvml", False, str(exc)[:200])
            return out
        check("answers nvml", True)
        try:
            pending = int(await call(nvml.nvmlDeviceGetRetiredPagesPendingStatus, handle))
            check("no retired pages pending", pending == 0, f"pending={pending}")
        except pynvml.NVMLError as exc:
            check("no retired pages pending", *_unsupported(exc))
        except (CallTimeout, LaneBusy) as exc:
            check("no retired pages pending", False, str(exc)[:200])
        try:
            _, _, rpending, failure = await call(nvml.nvmlDeviceGetRemappedRows, handle)
            ok = not rpending and not failure
            check("no row remap pending or failed", ok, f"pending={rpending} failure={failure}")
        except pynvml.NVMLError as exc:
            check("no row remap pending or failed", *_unsupported(exc))
        except (CallTimeout, LaneBusy) as exc:
            check("no row remap pending or failed", False, str(exc)[:200])
        _common_checks(watch, check, self.agent.catalog, since)
        return out


def _common_checks(watch: Any, check: Callable[..., None], catalog: XidCatalog, since: str) -> None:
    """What every backend's GPU must show: no XID that fails validation (`xid_check`) in
    this GPU's own history, not failed."""
    ok, detail = xid_check(
        [x.xid for x in watch.xids], catalog, recovery=_recovery_action(watch), since=since
    )
    check(XID_CHECK, ok, detail)
    state = watch.units[0].state if watch.units else None
    check("not failed", state != HealthState.FAILED, state.value if state else "unknown")


def _recovery_action(watch: Any) -> Finding | None:
    """The driver's recovery action (XID 154) the agent reads now: NVML's field as of its
    last poll, else the kernel log's while NVML does not answer; None: none."""
    polled: Finding | None = next((f for f in watch.polled if f.code == "recovery_action"), None)
    kmsg: Finding | None = watch.kmsg_recovery
    return polled or kmsg


def xid_check(
    xids: Iterable[int],
    catalog: XidCatalog,
    *,
    recovery: Finding | None = None,
    since: str = "since the agent started",
) -> tuple[bool, str]:
    """Whether one GPU's XIDs pass validation, and the check's detail: the failing ones
    with their catalog action and words (`XID 79 (reboot_node: GPU has fallen off the bus)
    since the reset`), then the ignored ones (`ignored: XID 13 (application)`).

    An XID fails when `XidInfo.fails_validation` (its catalog action is reset_gpu,
    drain_and_reset, reboot_node or drain_and_rma, and it is no application fault). XID 154
    is judged by `recovery`, the recovery action it announced as the agent reads it now: one
    of those actions fails, none (resolved) or a lesser one is ignored."""
    failing: list[str] = []
    ignored: list[str] = []
    for xid in sorted(set(xids)):
        if xid == RECOVERY_ACTION_XID:
            if recovery is not None and recovery.action in VALIDATION_FAILING_ACTIONS:
                failing.append(f"XID {xid} ({recovery.action.value}: {recovery.message})")
            else:
                said = recovery.message if recovery else "driver recovery action: none"
                ignored.append(f"XID {xid} ({said})")
            continue
        info = catalog.get(xid)
        if info.fails_validation:
            failing.append(f"XID {xid} ({info.action.value}: {info.description})")
        elif info.is_application:
            ignored.append(f"XID {xid} (application)")
        elif xid not in catalog.rows:
            ignored.append(f"XID {xid} (not in catalog)")
        else:
            ignored.append(f"XID {xid} ({info.category}: {info.action.value})")
    parts = [f"{', '.join(failing)} {since}"] if failing else []
    if ignored:
        parts.append(f"ignored: {', '.join(ignored)}")
    return not failing, "; ".join(parts)
