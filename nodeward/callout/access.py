"""What the auth callout may do on Kubernetes: review tokens, and read the agents' pods in
its own namespace (`deploy/rbac/auth-callout.yaml`, checked by tests/unit/test_rbac_roles.py)."""

from __future__ import annotations

from nodeward.kube.access import Access

ACCESS = Access("auth-callout", frozenset({"tokenreviews.create", "pods.get_own"}))
