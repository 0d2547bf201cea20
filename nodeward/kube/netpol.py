"""NetworkPolicies (networking.k8s.io/v1): create and delete, e.g. to isolate a pod."""

from __future__ import annotations

from nodeward.kube.access import operation
from nodeward.kube.base import Area, Obj, group_path
from nodeward.kube.errors import NotFound


def isolate_pod_policy(
    namespace: str, name: str, pod_labels: dict[str, str], *, labels: dict[str, str] | None = None
) -> Obj:
    """A policy denying all ingress and egress to the pods with `pod_labels`."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
        "spec": {"podSelector": {"matchLabels": pod_labels}, "policyTypes": ["Ingress", "Egress"]},
    }


class NetworkPolicies(Area):
    @operation("networkpolicies.create")
    async def create(self, policy: Obj) -> Obj:
        namespace = policy["metadata"]["namespace"]
        result: Obj = await self._client.request(
            "POST",
            group_path("networking.k8s.io", "v1", "networkpolicies", namespace=namespace),
            body=policy,
        )
        return result

    @operation("networkpolicies.delete")
    async def delete(self, namespace: str, name: str) -> bool:
        """Delete the policy; False if it was not there."""
        try:
            await self._client.request(
                "DELETE", group_path("networking.k8s.io", "v1", "networkpolicies", name, namespace)
            )
        except NotFound:
            return False
        return True
