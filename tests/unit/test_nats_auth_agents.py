"""A node's NATS user is what its agents declare (`GRANTS` in `agents/<name>/access.py`, and
the simulated driver's in `sim/inject.py`, collected by `launch.access`): the runtime names
none of their subjects, and the grants are exactly the ones it used to write out itself."""

from __future__ import annotations

import importlib

import pytest

import agents.energy.access
import agents.gpu.access
import agents.idle.access
import sim.inject
from launch.access import AGENT_GRANTS
from nodeward.nats_auth import NODE, AgentGrants, node_agent, node_agent_nkey
from nodeward.platform import standalone_names
from schemas.state.energy import TOTALS
from schemas.tokens import token
from tests.conftest import REPO

NODES = ["gpu-node-01", "dgx-a100.rack7.example.com", "Node_7", NODE]
KEY = "UDXU4RCSJNZOIQHZNWXHXORDPRTGNJAHAHFRGZNEEJCPQTT2M7NLCNF4"


def _written_by_the_runtime(n: str) -> dict[str, tuple[str, ...]]:
    """`nodeward.nats_auth._agent_grants` as it was, before each agent declared its own."""
    totals, key = TOTALS.name, TOTALS.key(n)
    return {
        "publish": (
            f"gpu.health.{n}.>",
            f"gpu.xid.{n}.>",
            f"gpu.heartbeat.{n}",
            f"gpu.telemetry.{n}",
            f"energy.node.{n}",
            f"energy.pod.{n}.>",
            f"session.activity.{n}.>",
            f"session.idle.{n}.>",
            f"node.finding.{n}.>",
            "notify.*.power-limit",
            f"$KV.{totals}.{key}",
            f"$JS.API.STREAM.INFO.KV_{totals}",
            f"$JS.API.DIRECT.GET.KV_{totals}.$KV.{totals}.{key}",
            f"$JS.API.DIRECT.GET.HEARTBEATS.gpu.heartbeat.{n}",
            f"$JS.API.DIRECT.GET.HEARTBEATS.gpu.heartbeat.{n}.*",
            f"$JS.API.DIRECT.GET.ENERGY.energy.node.{n}",
        ),
        "subscribe": (f"_INBOX_{n}.>", f"sim.inject.{n}", f"agent.gpu.*.{n}"),
        "deny_publish": (),
    }


@pytest.mark.parametrize("node", NODES)
def test_the_declared_grants_are_the_ones_the_runtime_wrote(node: str) -> None:
    n = token(node)
    old = _written_by_the_runtime(n)
    for user in (node_agent(node, "pw", AGENT_GRANTS), node_agent_nkey(node, KEY, AGENT_GRANTS)):
        assert user.user == f"agent-{n}"
        # The same allow list (in the agents' order now: energy, gpu, idle), each subject once.
        assert sorted(user.publish) == sorted(old["publish"])
        assert len(set(user.publish)) == len(user.publish)
        assert user.subscribe == old["subscribe"]
        assert user.deny_publish == old["deny_publish"]
        assert user.allow_responses is True  # the injections' and recovery's replies


def test_each_subject_is_declared_by_the_one_that_uses_it() -> None:
    gpu, energy, idle = (
        m.GRANTS for m in (agents.gpu.access, agents.energy.access, agents.idle.access)
    )
    assert gpu.subscribe == ("agent.gpu.*.{node}",) and gpu.allow_responses
    assert all(s.startswith(("gpu.", "$JS.API.DIRECT.GET.HEARTBEATS.")) for s in gpu.publish)
    assert "notify.*.power-limit" in energy.publish and not energy.subscribe
    assert idle.publish == ("session.activity.{node}.>", "session.idle.{node}.>")
    assert sim.inject.GRANTS.subscribe == ("sim.inject.{node}",) and not sim.inject.GRANTS.publish


def test_every_registered_agent_declares_its_grants() -> None:
    """An agent registered without an `access.py` declaring `GRANTS` has no NATS rights:
    it fails here (and in `launch.access`'s collection)."""
    names = standalone_names("agent")
    assert names == ["energy", "gpu", "idle"]
    declared = [importlib.import_module(f"agents.{name}.access").GRANTS for name in names]
    assert all(isinstance(g, AgentGrants) for g in declared)
    assert (sim.inject.GRANTS, *declared) == AGENT_GRANTS


def test_a_node_user_holds_only_what_is_declared() -> None:
    user = node_agent("gpu-a", "pw", ())
    assert (user.publish, user.subscribe, user.allow_responses) == ((), ("_INBOX_gpu-a.>",), False)
    one = AgentGrants(publish=("x.{node}", "x.{node}"), subscribe=("y.{node}.>",))
    user = node_agent("gpu.a", "pw", [one, one])
    assert user.publish == ("x.gpu_a",)
    assert user.subscribe == ("_INBOX_gpu_a.>", "y.gpu_a.>")


def test_a_placeholder_other_than_node_is_refused() -> None:
    with pytest.raises(ValueError, match="the one placeholder"):
        AgentGrants(publish=("gpu.health.{nodes}.>",))
    with pytest.raises(ValueError, match="the one placeholder"):
        AgentGrants(subscribe=("agent.gpu.*.{node",))


def test_the_runtime_names_no_agent_subject() -> None:
    text = (REPO / "nodeward" / "nats_auth.py").read_text()
    for name in ("gpu.", "energy.", "session.", "node.finding", "power-limit", "agent.gpu"):
        assert name not in text, name
    assert "sim.inject" not in text and "HEARTBEATS" not in text and "TOTALS" not in text
