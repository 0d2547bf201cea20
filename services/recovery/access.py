"""What the recovery service may do in the cluster (`deploy/rbac/recovery.yaml` grants exactly
these). Its NATS grants are its handlers' (`service:app`)."""

from __future__ import annotations

from nodeward.kube.access import Access

ACCESS = Access(
    "recovery",
    frozenset(
        {
            "nodes.get",
            "nodes.list",  # the circuit breaker's population
            "nodes.patch",  # its reboot request and its human hold, and taking them back
            "pods.list",  # drained means empty: the pods left on the node
            "pods.get",  # an evicted pod waited for until it has terminated and is gone
            "pods.evict",  # the pods a drain left, evicted again (budgets honoured)
            "pods.delete",  # only at an operator's word: `nodeward recovery force-drain`
            "namespaces.get",  # a pod's namespace exemption
            "secrets.get_own",  # hung nodes' BMC credentials (`hang.bmc_secret`, its namespace)
        }
    ),
)
