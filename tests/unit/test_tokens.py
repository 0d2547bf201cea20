"""Subject tokens built from user data: always one safe token, injective on Kubernetes names."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.streams import subject_matches
from schemas.tokens import falco_rule_token, subject, token

SAFE = re.compile(r"[A-Za-z0-9_\-:@+=~]+")
# DNS-1123 subdomains (pod, node, secret names) and labels (namespaces), as the API server allows.
LABEL = r"[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?"
k8s_label = st.from_regex(rf"\A{LABEL}\Z")
k8s_name = st.from_regex(rf"\A{LABEL}(\.{LABEL}){{0,3}}\Z")

FAST = settings(max_examples=300, deadline=None)


def test_examples() -> None:
    assert token("gpu-node-07") == "gpu-node-07"
    assert token("gpu-node.07.example.org") == "gpu-node_07_example_org"
    assert token("a b*c>d\te\nf") == "a_b_c_d_e_f"
    assert token("") == "_"
    assert token(3) == "3"
    assert token("nœud") == "n_ud"
    assert subject("gpu", "health", "node.a", "3") == "gpu.health.node_a.3"


@FAST
@given(st.text())
def test_token_is_one_safe_token(value: str) -> None:
    t = token(value)
    assert SAFE.fullmatch(t), t
    for bad in (".", " ", "*", ">", "\t", "\n", "\r"):
        assert bad not in t
    assert token(value) == t


@FAST
@given(st.lists(st.text(), min_size=1, max_size=5))
def test_subject_has_one_token_per_part(parts: list[str]) -> None:
    built = subject("gpu.health", *parts)
    assert built.startswith("gpu.health.") or not parts
    assert built.count(".") == len(parts) + 1
    assert subject_matches(".".join(["gpu", "health", *("*" for _ in parts)]), built)


@FAST
@given(k8s_name, k8s_name)
def test_distinct_kubernetes_names_give_distinct_tokens(a: str, b: str) -> None:
    assert (token(a) == token(b)) == (a == b)


@FAST
@given(k8s_label, k8s_name, k8s_label, k8s_name)
def test_distinct_namespaced_names_give_distinct_subjects(
    ns1: str, n1: str, ns2: str, n2: str
) -> None:
    same_subject = subject("energy", "pod", ns1, n1) == subject("energy", "pod", ns2, n2)
    assert same_subject == ((ns1, n1) == (ns2, n2))


def sidekick(rule: str) -> str:
    """Falcosidekick outputs/nats.go: slug of the lower-cased rule, trimmed of `_`."""
    return re.sub("[^a-z0-9]+", "_", rule.lower()).strip("_")


def test_falco_rule_token_examples() -> None:
    assert (
        falco_rule_token("Redirect STDOUT/STDIN to Network Connection in Container")
        == "redirect_stdout_stdin_to_network_connection_in_container"
    )
    assert (
        falco_rule_token("Contact K8S API Server From Container")
        == "contact_k8s_api_server_from_container"
    )
    assert falco_rule_token("***") == "_"


@FAST
@given(st.text())
def test_falco_rule_token_matches_sidekick(rule: str) -> None:
    expected = sidekick(rule) or "_"
    got = falco_rule_token(rule)
    assert got == expected
    assert re.fullmatch(r"[a-z0-9_]+", got)
