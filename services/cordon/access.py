"""What the cordon service (GPU quarantine) may do in Kubernetes.

The port refuses an operation not in `ACCESS` (`nodeward.kube.access.Guard`);
`deploy/rbac/cordon.yaml` grants exactly these (`tests/unit/test_rbac_roles.py`). Its NATS
grants are derived from its declarations (`services.cordon.service.app`).
"""

from __future__ import annotations

from nodeward.kube.access import Access

ACCESS = Access(
    "cordon",
    frozenset(
        {
            "nodes.get",
            "nodes.list",
            "nodes.watch",
            "nodes.patch",
            "nodes.set_condition",
            "namespaces.get",
            "pods.list",
            "pods.get",
            "pods.evict",
            "events.create",
            # Per-GPU exclusion where DRA serves the GPUs (services/cordon/devices.py).
            "resourceslices.list",
            "devicetaintrules.create",
            "devicetaintrules.get",
            "devicetaintrules.delete",
        }
    ),
)
