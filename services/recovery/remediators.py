"""The remediators recovery asks for a GPU reset or a node reboot: small modules in a table
(`REMEDIATORS`), as Falco Talon's actionners. Each is idempotent (a restart asks again).

- `gpu-reset`: the node's GPU agent resets the failed GPUs (`agent.gpu.reset.<node>`,
  request/reply; on a real node `nvidia-smi -r -i <bus id>`).
- `reboot-annotation`: the node gets the label `nodeward.io/reboot-required=true` and the
  annotation `nodeward.io/reboot-request` (id and reason), through `NodeMarks` (owner
  `recovery`, removed once the node has rebooted). A reboot operator acts on them: Kured
  with `--reboot-sentinel-command` testing the label (Kured keeps its own lock,
  `weave.works/kured-node-lock` on its DaemonSet; nodeward never touches it), or a small
  DaemonSet that touches Kured's sentinel `/var/run/reboot-required` when it is set.
- `webhook`: a JSON POST (`{"action": "reset"|"reboot", "node", "gpus", "request_id", ...}`)
  to a URL; a 2xx answer is the request taken.

A reboot is done when the node's `status.nodeInfo.bootID` differs from the one read before
asking (a real reboot changes it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import httpx
from pydantic import ValidationError

from nodeward.kube import Cluster
from nodeward.kube.base import Obj
from schemas.recovery import RESET, ResetReply, ResetRequest, agent_subject
from schemas.state.marks import MarkSpec
from services.kernel.marks import NodeMarks
from services.recovery.state import Plan, RecoveryRecord

REBOOT_LABEL = "nodeward.io/reboot-required"
REBOOT_ANNOTATION = "nodeward.io/reboot-request"


class RemediatorError(Exception):
    """The remediator could not take the request (retried on the next pass)."""


def boot_id(node: Obj) -> str | None:
    """The node's `status.nodeInfo.bootID` (changes on every reboot)."""
    info = (node.get("status") or {}).get("nodeInfo") or {}
    value = info.get("bootID")
    return str(value) if value else None


@dataclass(frozen=True)
class Tools:
    """What remediators may use: the bus connection, the cluster port, recovery's marks."""

    nc: Any
    cluster: Cluster
    marks: NodeMarks
    timeout_s: float
    webhook_url: str | None = None


class Remediator(Protocol):
    name: str

    def waits_for_reboot(self, plan: Plan) -> bool:
        """True: done when the node's bootID changes; False: done when the ask returns."""
        ...

    async def ask(self, record: RecoveryRecord, tools: Tools) -> dict[str, Any]:
        """Ask for the cure; the details to audit. Raises `RemediatorError`."""
        ...

    async def finish(self, record: RecoveryRecord, tools: Tools) -> None:
        """Take back what asking left on the node (after the reboot)."""
        ...


class GpuReset:
    name = "gpu-reset"

    def waits_for_reboot(self, plan: Plan) -> bool:
        return False

    async def ask(self, record: RecoveryRecord, tools: Tools) -> dict[str, Any]:
        request = ResetRequest(
            node=record.node, gpus=record.gpus or [0], request_id=record.attempt_id("reset")
        )
        try:
            msg = await tools.nc.request(
                agent_subject(RESET, record.node),
                request.model_dump_json().encode(),
                timeout=tools.timeout_s,
            )
            reply = ResetReply.model_validate_json(msg.data)
        except ValidationError as exc:
            raise RemediatorError(f"the GPU agent's reset reply is not understood: {exc}") from exc
        except Exception as exc:  # no responders, timeout: the agent is down or busy
            raise RemediatorError(f"no reset reply from {record.node}'s GPU agent: {exc}") from exc
        if not reply.ok:
            raise RemediatorError(f"the GPU agent could not reset: {reply.error}")
        return {"remediator": self.name, "reset": reply.reset}

    async def finish(self, record: RecoveryRecord, tools: Tools) -> None:
        return None


class RebootAnnotation:
    name = "reboot-annotation"

    def waits_for_reboot(self, plan: Plan) -> bool:
        return True

    async def ask(self, record: RecoveryRecord, tools: Tools) -> dict[str, Any]:
        request_id = record.attempt_id("reboot")
        spec = MarkSpec(
            labels={REBOOT_LABEL: "true"},
            annotations={REBOOT_ANNOTATION: f"{request_id}: {record.reason}"[:1024]},
        )
        await tools.marks.apply(record.node, request_id, spec)
        return {"remediator": self.name, "label": f"{REBOOT_LABEL}=true", "request": request_id}

    async def finish(self, record: RecoveryRecord, tools: Tools) -> None:
        await tools.marks.release(record.node)


class Webhook:
    name = "webhook"

    def waits_for_reboot(self, plan: Plan) -> bool:
        """Asked for a reset, it is done when it answers; for a reboot, at the new boot."""
        return plan == Plan.REBOOT

    async def ask(self, record: RecoveryRecord, tools: Tools) -> dict[str, Any]:
        if not tools.webhook_url:
            raise RemediatorError("remediator webhook has no url (services.recovery.webhook_url)")
        body = {
            "action": record.plan.value,
            "node": record.node,
            "gpus": record.gpus,
            "xids": record.xids,
            "reason": record.reason,
            "request_id": record.attempt_id(record.plan.value),
        }
        try:
            async with httpx.AsyncClient(timeout=tools.timeout_s) as http:
                answer = await http.post(tools.webhook_url, json=body)
                answer.raise_for_status()
        except httpx.HTTPError as exc:
            raise RemediatorError(f"webhook {tools.webhook_url}: {exc}") from exc
        return {"remediator": self.name, "status": answer.status_code}

    async def finish(self, record: RecoveryRecord, tools: Tools) -> None:
        return None


REMEDIATORS: Mapping[str, Remediator] = {
    r.name: r for r in (GpuReset(), RebootAnnotation(), Webhook())
}
