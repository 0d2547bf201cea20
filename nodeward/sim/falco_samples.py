"""The sample Falco alerts (`nodeward/data/falco-alerts.jsonl`) and a sim seed holding the
pods they are about, for tests, benches and trying the Falco response by hand."""

from __future__ import annotations

import json
from importlib.resources import files
from typing import Any

from nodeward.sim.cluster.seed import (
    CheckpointFailure,
    CheckpointSeed,
    ContainerSeed,
    NodeSeed,
    Owner,
    PodSeed,
    Seed,
)
from schemas.tokens import falco_rule_token

NODE = "gpu-node-07"
DROP_AND_EXECUTE = "Drop and execute new binary in container"
SAMPLE_NAMESPACES = ("user-alice", "user-bob", "user-carol", "user-dave")


def samples() -> list[dict[str, Any]]:
    """The eight sample alerts, in Falcosidekick's NATS payload form."""
    text = (files("nodeward") / "data" / "falco-alerts.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def sidekick_subject(alert: dict[str, Any]) -> str:
    """The subject Falcosidekick's NATS output publishes `alert` on."""
    return f"falco.{alert['priority'].lower()}.{falco_rule_token(alert['rule'])}"


def sample_seed(suffix: str | None = None) -> Seed:
    """Node `gpu-node-07` with the sample alerts' pods (namespaces `user-bob-<suffix>` with a
    suffix, so that tests sharing a NATS keep apart), bob's pod with a sibling replica,
    `user-dave/exempt-trainer` labelled exempt, and carol's vllm container failing to
    checkpoint as a runtime without CRIU does."""

    def ns(base: str) -> str:
        return f"{base}-{suffix}" if suffix else base

    bob_rs = Owner(kind="ReplicaSet", name="bob-llm-finetune-6d5f9c7b8d", api_version="apps/v1")
    bob_labels = {"app": "bob-llm-finetune", "pod-template-hash": "6d5f9c7b8d"}
    pods = [
        PodSeed(
            name="jupyter-alice-0",
            namespace=ns("user-alice"),
            node=NODE,
            role="notebook",
            labels={"app": "jupyter-alice"},
            containers=[ContainerSeed(name="notebook")],
        ),
        PodSeed(
            name="bob-llm-finetune-6d5f9c7b8d-q8wzr",
            namespace=ns("user-bob"),
            node=NODE,
            owner=bob_rs,
            labels=bob_labels,
            containers=[ContainerSeed(name="trainer")],
        ),
        PodSeed(
            name="bob-llm-finetune-6d5f9c7b8d-x2kfp",  # a sibling replica: never isolated
            namespace=ns("user-bob"),
            node=NODE,
            owner=bob_rs,
            labels=bob_labels,
            containers=[ContainerSeed(name="trainer")],
        ),
        PodSeed(
            name="carol-vllm-serve-84c6d7f9b-7tq5z",
            namespace=ns("user-carol"),
            node=NODE,
            labels={"app": "carol-vllm-serve"},
            containers=[ContainerSeed(name="vllm")],
        ),
        PodSeed(
            name="dave-debug-priv",
            namespace=ns("user-dave"),
            node=NODE,
            containers=[ContainerSeed(name="debug")],
        ),
        PodSeed(
            name="exempt-trainer",
            namespace=ns("user-dave"),
            node=NODE,
            labels={"nodeward.io/exempt": "true"},
            containers=[ContainerSeed(name="trainer")],
        ),
    ]
    return Seed(
        namespaces=["nodeward", *(ns(n) for n in SAMPLE_NAMESPACES)],
        nodes=[NodeSeed(name=NODE)],
        pods=pods,
        checkpoint=CheckpointSeed(
            fail=[
                CheckpointFailure(
                    namespace=ns("user-carol"),
                    pod="carol-vllm-serve-84c6d7f9b-7tq5z",
                    container="vllm",
                )
            ]
        ),
    )
