"""The cluster port: the one way services act on Kubernetes.

async with Cluster.connect(settings.cluster, access=ACCESS) as cluster:  # its access.py
    await cluster.nodes.add_taint(node, "nodeward.io/gpu-unhealthy", "NoSchedule")
"""

from nodeward.kube.access import Access
from nodeward.kube.cluster import Cluster
from nodeward.kube.errors import (
    AlreadyExists,
    BadRequest,
    CheckpointFailed,
    Conflict,
    EvictionBlocked,
    Forbidden,
    Gone,
    Invalid,
    KubeError,
    MultipleBudgets,
    NotFound,
    ServerError,
    TooManyRequests,
    Unauthorized,
    Unavailable,
    UndeclaredOperation,
)
from nodeward.kube.watch import WatchEvent

__all__ = [
    "Access",
    "AlreadyExists",
    "BadRequest",
    "CheckpointFailed",
    "Cluster",
    "Conflict",
    "EvictionBlocked",
    "Forbidden",
    "Gone",
    "Invalid",
    "KubeError",
    "MultipleBudgets",
    "NotFound",
    "ServerError",
    "TooManyRequests",
    "Unauthorized",
    "Unavailable",
    "UndeclaredOperation",
    "WatchEvent",
]
