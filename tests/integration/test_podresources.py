"""The pod-resources client against a gRPC server speaking the kubelet's List on a unix socket."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest_asyncio

from agents.sources.podresources import KubeletPods, parse_list_response
from nodeward.config import BusSettings
from nodeward.protowire import field_bytes
from schemas.common import PodRef


def devices(resource: str, *ids: str) -> bytes:
    return field_bytes(1, resource) + b"".join(field_bytes(2, i) for i in ids)


def container(name: str, *devs: bytes) -> bytes:
    return field_bytes(1, name) + b"".join(field_bytes(2, d) for d in devs) + b"\x18\x05"  # cpu_ids


def pod(name: str, ns: str, *containers: bytes) -> bytes:
    return (
        field_bytes(1, name) + field_bytes(2, ns) + b"".join(field_bytes(3, c) for c in containers)
    )


RESPONSE = b"".join(
    field_bytes(1, p)
    for p in (
        pod(
            "train-0", "ml", container("worker", devices("nvidia.com/gpu", "GPU-aaa", "GPU-bbb::1"))
        ),
        pod("nb-0", "alice", container("nb", devices("nvidia.com/mig-1g.10gb", "MIG-ccc"))),
        pod("nic", "sys", container("c", devices("example.com/nic", "eth9"))),
        pod("llm-0", "ml", container("vllm", devices("amd.com/gpu", "0000:05:00.0"))),
    )
)


def test_parse_keeps_gpu_devices_only() -> None:
    got = parse_list_response(RESPONSE)
    assert got == {
        "GPU-aaa": [PodRef(namespace="ml", name="train-0", container="worker")],
        "GPU-bbb": [PodRef(namespace="ml", name="train-0", container="worker")],
        "MIG-ccc": [PodRef(namespace="alice", name="nb-0", container="nb")],
        "0000:05:00.0": [PodRef(namespace="ml", name="llm-0", container="vllm")],  # AMD: by BDF
    }


ANSWER = {"body": RESPONSE}


@pytest_asyncio.fixture
async def kubelet_socket() -> AsyncIterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="pr", dir="/tmp"))  # unix socket paths are short
    sock = folder / "kubelet.sock"
    server = grpc.aio.server()
    handler = grpc.method_handlers_generic_handler(
        "v1.PodResourcesLister",
        {
            "List": grpc.unary_unary_rpc_method_handler(
                lambda req, ctx: ANSWER["body"],
                request_deserializer=lambda b: b,
                response_serializer=lambda b: b,
            )
        },
    )
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"unix://{sock}")
    await server.start()
    try:
        yield sock
    finally:
        await server.stop(None)
        shutil.rmtree(folder, ignore_errors=True)


async def test_list_over_the_socket(kubelet_socket: Path) -> None:
    pods = KubeletPods(kubelet_socket, timeout=2)
    try:
        got = await pods.pods_by_device()
    finally:
        await pods.close()
    assert got["MIG-ccc"][0].name == "nb-0"
    assert pods.answered  # every GPU's pods named: no DRA claim among them


async def test_missing_socket_is_no_pods(tmp_path: Path) -> None:
    pods = KubeletPods(tmp_path / "none.sock")
    assert await pods.pods_by_device() == {}
    assert not pods.answered  # no pods known, not "held by none"


async def test_agent_names_the_pods_holding_a_gpu(
    kubelet_socket: Path, bus_settings: BusSettings, node: str
) -> None:
    import json

    from agents.gpu.wiring import build_gpu_agent
    from nodeward.bus import Bus
    from nodeward.config import Settings
    from sim.nvml import SimNvml
    from tests.conftest import wait_for

    sim = SimNvml.build(node, count=2)
    ANSWER["body"] = field_bytes(
        1, pod("train-1", "ml", container("w", devices("nvidia.com/gpu", sim.gpus[1].uuid)))
    )
    settings = Settings(
        bus=bus_settings,
        agents={"gpu": {"node": node, "pod_resources_socket": str(kubelet_socket)}},
    )
    watcher = await Bus.connect(bus_settings, source="test/watch")
    seen: dict[str, dict[str, object]] = {}

    async def collect(msg: object) -> None:
        seen[msg.subject] = json.loads(msg.data)  # type: ignore[attr-defined]

    sub = await watcher.nc.subscribe(f"gpu.health.{node}.*", cb=collect)
    await watcher.nc.flush()  # the server has the subscription before the first event
    try:
        async with await build_gpu_agent(settings, nvml=sim):
            await wait_for(
                lambda: f"gpu.health.{node}.1" in seen and f"gpu.health.{node}.0" in seen
            )
        assert seen[f"gpu.health.{node}.1"]["pods"] == [
            {"namespace": "ml", "name": "train-1", "container": "w"}
        ]
        assert seen[f"gpu.health.{node}.0"]["pods"] == []
        assert seen[f"gpu.health.{node}.1"]["holders"] == [{"namespace": "ml", "name": "train-1"}]
        assert seen[f"gpu.health.{node}.0"]["holders"] == []
    finally:
        ANSWER["body"] = RESPONSE
        await sub.unsubscribe()
        await watcher.close(grace=1)
