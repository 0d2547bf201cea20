"""The chart's NATS grants come from each service's declared GRANTS (through nodeward.nats_auth),
and its per-node ones equal nodeward.nats_auth's.

Without helm: the chart substitutes a node's subject token for `__NODE__` in the agent
grants of files/nats-permissions.json (templates/nats-auth.yaml), with the token regex of
templates/_helpers.tpl. Both steps are replayed here. tests/integration/test_helm_chart.py
checks the same on the chart rendered by helm.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from launch.access import AGENT_GRANTS, GRANTS, READERS
from nodeward.nats_auth import (
    NODE,
    node_agent,
    node_agent_nkey,
    permissions_document,
    service_user,
)
from schemas.tokens import token

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "nodeward"
NODES = ["gpu-node-01", "dgx-a100.rack7.example.com", "Node_7", "ip-10-0-0-1.ec2.internal"]
KEY = "UDXU4RCSJNZOIQHZNWXHXORDPRTGNJAHAHFRGZNEEJCPQTT2M7NLCNF4"


def _chart_grants() -> dict[str, object]:
    grants: dict[str, object] = json.loads((CHART / "files" / "nats-permissions.json").read_text())
    return grants


def _chart_token(node: str) -> str:
    """`nodeward.token` of _helpers.tpl: its regexReplaceAll, run here."""
    helpers = (CHART / "templates" / "_helpers.tpl").read_text()
    match = re.search(r'regexReplaceAll "([^"]+)" \. "_"', helpers)
    assert match, "nodeward.token not found in _helpers.tpl"
    pattern = match.group(1).replace("\\\\", "\\")
    return re.sub(pattern, "_", node)


def test_chart_grants_file_is_generated_from_the_declared_grants() -> None:
    assert _chart_grants() == permissions_document(GRANTS, AGENT_GRANTS, READERS), (
        "regenerate: python -m launch.access nats-permissions "
        "deploy/helm/nodeward/files/nats-permissions.json"
    )


@pytest.mark.parametrize("node", NODES)
def test_chart_token_is_the_subject_token(node: str) -> None:
    assert _chart_token(node) == token(node)


@pytest.mark.parametrize("node", NODES)
def test_per_node_grants_equal_nats_auth(node: str) -> None:
    agent = _chart_grants()["agent"]
    assert isinstance(agent, dict)
    text = json.dumps(agent["permissions"]).replace(NODE, _chart_token(node))
    assert json.loads(text) == node_agent_nkey(node, KEY, AGENT_GRANTS).permissions()
    assert json.loads(text) == node_agent(node, "pw", AGENT_GRANTS).permissions()


def test_one_node_cannot_reach_another() -> None:
    a = node_agent_nkey("gpu-a", KEY, AGENT_GRANTS).permissions()
    publish, subscribe = json.dumps(a["publish"]), json.dumps(a["subscribe"])
    assert "gpu-b" not in publish + subscribe
    assert ">" not in [*a["publish"]["allow"]]  # type: ignore[index]
    assert a["subscribe"]["allow"] == [  # type: ignore[index]
        "_INBOX_gpu-a.>",
        "sim.inject.gpu-a",
        "agent.gpu.*.gpu-a",  # services.recovery asks its own node's agent only
    ]


def test_a_bad_public_key_is_refused() -> None:
    with pytest.raises(ValueError, match="not an nkey user public key"):
        node_agent_nkey(
            "gpu-a", "SUAJ4PYVVWSGEMOBXGRF5ELYDUX5AX3UENTV74SO5RJLI6ZW4QHU3RGAHA", AGENT_GRANTS
        )


def test_services_use_only_their_own_consumer_bucket_and_inbox() -> None:
    cordon = service_user("cordon", GRANTS["cordon"], "pw").permissions()
    allowed = cordon["publish"]["allow"]  # type: ignore[index]
    assert not [s for s in allowed if "culler" in s or "notifier" in s]
    assert not [s for s in allowed if s.startswith("gpu.")], "cordon never publishes GPU health"
    assert "$JS.API.STREAM.CREATE.GPU" not in allowed
    # Its inbox and its own operator controls (whose replies it may send), nothing else.
    assert cordon["subscribe"]["allow"] == [  # type: ignore[index]
        "_INBOX_cordon.>",
        "control.cordon.release",
        "control.cordon.reset-breaker",
    ]
    assert cordon["allow_responses"] is True
