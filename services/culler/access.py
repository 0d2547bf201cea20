"""What the culler may do in the cluster: read a session's pod, notebook and namespace, stop
the notebook or delete the pod. Its NATS grants are its handlers' (`service:app`)."""

from __future__ import annotations

from nodeward.kube.access import Access

ACCESS = Access(
    "culler",
    frozenset({"namespaces.get", "pods.get", "pods.delete", "notebooks.get", "notebooks.patch"}),
)
