"""The simulated reboot operator and BMC-run nodes: a node whose machine runs is rebooted
through its BMC (once per request); a hung one is not rebooted at all, and its request waits."""

from __future__ import annotations

from typing import Any

from structlog.testing import capture_logs

from sim.reboot import REBOOT_ANNOTATION, REBOOT_LABEL, SimRebootOperator


class Api:
    """The one call the operator makes of a BMC-run node: the labelled nodes' list."""

    def __init__(self, *nodes: str) -> None:
        self.nodes = nodes
        self.calls: list[tuple[str, str]] = []

    async def request(self, method: str, path: str, **_: Any) -> dict[str, Any]:
        self.calls.append((method, path))
        assert method == "GET", "a BMC-run node's bootID is its machine's to post"
        return {
            "items": [
                {
                    "metadata": {
                        "name": n,
                        "labels": {REBOOT_LABEL: "true"},
                        "annotations": {REBOOT_ANNOTATION: "req-1: XID 79"},
                    },
                    "status": {"nodeInfo": {"bootID": "b-1"}},
                }
                for n in self.nodes
            ]
        }


class Machines:
    def __init__(self, hung: bool) -> None:
        self.hung = hung
        self.reboots: list[str] = []

    def runs(self, node: str) -> bool:
        return node == "gpu-a"

    async def reboot(self, node: str) -> str | None:
        if self.hung:
            return "its machine is hung: nothing on it carries out a reboot"
        self.reboots.append(node)
        return None


async def test_a_running_bmc_node_is_power_cycled_once_per_request() -> None:
    machines = Machines(hung=False)
    operator = SimRebootOperator(Api("gpu-a"), nc=None, machines=machines)  # type: ignore[arg-type]
    with capture_logs():
        assert await operator.pass_once() == ["gpu-a"]
        assert await operator.pass_once() == []
    assert machines.reboots == ["gpu-a"]


async def test_a_hung_bmc_node_is_not_rebooted_and_its_request_waits() -> None:
    machines = Machines(hung=True)
    api = Api("gpu-a")
    operator = SimRebootOperator(api, nc=None, machines=machines)  # type: ignore[arg-type]
    with capture_logs() as logs:
        assert await operator.pass_once() == []
        assert await operator.pass_once() == []
        assert not machines.reboots and not operator.served
        said = [e for e in logs if e["event"] == "sim_reboot.not_rebooted"]
        assert len(said) == 1 and "hung" in said[0]["why"]  # told once
        machines.hung = False  # back (a human, its BMC): the request is still there
        assert await operator.pass_once() == ["gpu-a"]
    assert machines.reboots == ["gpu-a"]
    assert all(method == "GET" for method, _ in api.calls)
