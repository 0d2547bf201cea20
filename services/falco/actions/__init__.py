"""The Falco actions, one small module each, in one table (as Falco Talon's actionners are).

A rule names actions by kind; the service looks each up here, runs it through the kernel's
guards for its scope, and audits the decision. Adding an action is a module and a row.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from services.falco.actions import (
    annotate,
    checkpoint,
    cordon,
    isolate,
    label,
    notify,
    terminate,
)
from services.falco.actions.base import ActionContext, Actionner
from services.falco.rules import ActionKind

ACTIONS: Mapping[ActionKind, Actionner] = MappingProxyType(
    {
        a.kind: a
        for a in (
            notify.ACTION,
            label.ACTION,
            annotate.ACTION,
            isolate.ACTION,
            checkpoint.ACTION,
            terminate.ACTION,
            cordon.ACTION,
        )
    }
)
DONE_WORDS: Mapping[ActionKind, str] = MappingProxyType(
    {kind: a.done_words for kind, a in ACTIONS.items() if a.done_words}
)

__all__ = ["ACTIONS", "DONE_WORDS", "ActionContext", "Actionner"]
