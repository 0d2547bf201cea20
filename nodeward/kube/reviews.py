"""TokenReview: what the API server says a bearer token is."""

from __future__ import annotations

from collections.abc import Sequence

from nodeward.kube.access import operation
from nodeward.kube.base import Area, Obj, group_path


class TokenReviews(Area):
    @operation("tokenreviews.create")
    async def review(self, token: str, audiences: Sequence[str]) -> Obj:
        """The review's `status` (`authenticated`, `user`, `audiences`, `error`)."""
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token, "audiences": list(audiences)},
        }
        reply = await self._client.request(
            "POST", group_path("authentication.k8s.io", "v1", "tokenreviews"), body=body
        )
        status: Obj = dict(reply.get("status") or {})
        return status
