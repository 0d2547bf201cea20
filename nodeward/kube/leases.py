"""Leases (coordination.k8s.io/v1) for leader election of singleton loops."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from nodeward.kube.access import SERVICE_NAMESPACE, operation
from nodeward.kube.base import Area, Obj, group_path
from nodeward.kube.errors import AlreadyExists, Conflict, NotFound

_FMT = "%Y-%m-%dT%H:%M:%S.%fZ"


def _now() -> datetime:
    return datetime.now(UTC)


def _parse(stamp: str | None) -> datetime | None:
    if not stamp:
        return None
    for fmt in (_FMT, "%Y-%m-%dT%H:%M:%SZ"):
        try:
            return datetime.strptime(stamp, fmt).replace(tzinfo=UTC)
        except ValueError:
            continue
    return None


def held_by_other(lease: Obj, holder: str, at: datetime) -> bool:
    spec = lease.get("spec") or {}
    current = spec.get("holderIdentity")
    if not current or current == holder:
        return False
    renewed = _parse(spec.get("renewTime")) or _parse(spec.get("acquireTime"))
    duration = int(spec.get("leaseDurationSeconds") or 0)
    return renewed is not None and renewed + timedelta(seconds=duration) > at


class Leases(Area):
    @operation("leases.hold")
    async def try_acquire(
        self, name: str, holder: str, duration_s: int = 15, namespace: str = SERVICE_NAMESPACE
    ) -> bool:
        """Take or renew the lease for `holder`; False if another holder's lease is still live
        or another writer won the race."""
        path = group_path("coordination.k8s.io", "v1", "leases", name, namespace)
        now = _now()
        stamp = now.strftime(_FMT)
        try:
            lease: Obj = await self._client.request("GET", path)
        except NotFound:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {
                    "holderIdentity": holder,
                    "leaseDurationSeconds": duration_s,
                    "acquireTime": stamp,
                    "renewTime": stamp,
                    "leaseTransitions": 0,
                },
            }
            try:
                await self._client.request(
                    "POST",
                    group_path("coordination.k8s.io", "v1", "leases", namespace=namespace),
                    body=body,
                )
            except AlreadyExists:
                return False
            return True
        if held_by_other(lease, holder, now):
            return False
        spec = lease.setdefault("spec", {})
        if spec.get("holderIdentity") != holder:
            spec["acquireTime"] = stamp
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
        spec.update(holderIdentity=holder, leaseDurationSeconds=duration_s, renewTime=stamp)
        try:
            await self._client.request("PUT", path, body=lease)
        except Conflict:
            return False
        return True

    @operation("leases.hold")
    async def release(self, name: str, holder: str, namespace: str = SERVICE_NAMESPACE) -> bool:
        """Give the lease up if `holder` has it. True if released."""
        path = group_path("coordination.k8s.io", "v1", "leases", name, namespace)
        try:
            lease: Obj = await self._client.request("GET", path)
        except NotFound:
            return False
        if (lease.get("spec") or {}).get("holderIdentity") != holder:
            return False
        lease["spec"]["holderIdentity"] = None
        try:
            await self._client.request("PUT", path, body=lease)
        except Conflict:
            return False
        return True
