"""Which pods hold which GPU, from the kubelet pod-resources API.

`v1.PodResourcesLister/List` over gRPC on the kubelet's unix socket. The few messages
are read by hand (no generated code); only GPU devices are kept: `nvidia.com/gpu`,
`nvidia.com/mig-*` and AMD's `amd.com/gpu`. NVIDIA device IDs are GPU or MIG UUIDs (the
device plugin's default strategy) or indices; AMD's device plugin names each GPU by its
PCI bus ID (`0000:05:00.0`); a shared-GPU replica suffix (`::<n>`) is dropped, so the pods
time-slicing one GPU are all listed under its ID. A pod holding DRA claims
(`dynamic_resources`) holds devices this map cannot tie to a GPU: such an answer is not a
full one (`answered` False), so no GPU's holders are claimed known from it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nodeward.logs import get_logger
from nodeward.protowire import WireError, fields
from schemas.common import PodRef

DEFAULT_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
LIST_METHOD = "/v1.PodResourcesLister/List"


def is_gpu_resource(name: str) -> bool:
    return name in ("nvidia.com/gpu", "amd.com/gpu") or name.startswith("nvidia.com/mig-")


def dynamic_claims(body: bytes) -> int:
    """How many containers of a ListPodResourcesResponse hold DRA claims
    (`ContainerResources.dynamic_resources`): devices named by claim, not by device ID."""
    count = 0
    for number, pod in fields(body):
        if number != 1:
            continue
        for n, container in fields(pod):
            if n == 3 and any(k == 5 for k, _ in fields(container)):
                count += 1
    return count


def parse_list_response(body: bytes) -> dict[str, list[PodRef]]:
    """ListPodResourcesResponse -> device ID -> pods (with the container holding it)."""
    out: dict[str, list[PodRef]] = {}
    for number, pod in fields(body):
        if number != 1:  # pod_resources
            continue
        name = namespace = ""
        containers: list[bytes] = []
        for n, v in fields(pod):
            if n == 1:
                name = v.decode()
            elif n == 2:
                namespace = v.decode()
            elif n == 3:
                containers.append(v)
        for container in containers:
            cname = ""
            devices: list[bytes] = []
            for n, v in fields(container):
                if n == 1:
                    cname = v.decode()
                elif n == 2:
                    devices.append(v)
            for dev in devices:
                resource, ids = "", []
                for n, v in fields(dev):
                    if n == 1:
                        resource = v.decode()
                    elif n == 2:
                        ids.append(v.decode().split("::", 1)[0])
                if not is_gpu_resource(resource):
                    continue
                ref = PodRef(namespace=namespace, name=name, container=cname or None)
                for device_id in ids:
                    if ref not in out.setdefault(device_id, []):
                        out[device_id].append(ref)
    return out


class KubeletPods:
    """Asks the kubelet on every call; an empty map (logged) when it cannot."""

    def __init__(self, socket: Path = DEFAULT_SOCKET, *, timeout: float = 5.0) -> None:
        self.socket = socket
        self.timeout = timeout
        self.log: Any = get_logger(source="pod-resources", socket=str(socket))
        self._channel: Any = None
        self.answered = False
        """The last answer named every GPU's pods: the kubelet answered, with no DRA claim."""

    async def pods_by_device(self) -> Mapping[str, list[PodRef]]:
        import grpc

        self.answered = False
        if not self.socket.exists():
            self.log.debug("no kubelet pod-resources socket")
            return {}
        if self._channel is None:
            self._channel = grpc.aio.insecure_channel(f"unix://{self.socket}")
        call = self._channel.unary_unary(
            LIST_METHOD, request_serializer=lambda _: b"", response_deserializer=lambda b: b
        )
        try:
            body = await call(b"", timeout=self.timeout)
            found = parse_list_response(body)
            self.answered = dynamic_claims(body) == 0
            return found
        except grpc.aio.AioRpcError as exc:
            self.log.warning("pod-resources List failed", code=str(exc.code()), error=exc.details())
            await self.close()
        except WireError as exc:
            self.log.warning("pod-resources answer not understood", error=str(exc))
        return {}

    async def close(self) -> None:
        channel, self._channel = self._channel, None
        if channel is not None:
            await channel.close()
