"""Subject tokens built from user data.

NATS subjects are dot-separated tokens; `*` and `>` are wildcards and whitespace ends a
subject. Kubernetes names are DNS labels or subdomains (`[a-z0-9.-]`), so mapping `.` to
`_` keeps distinct names distinct while making them single tokens.
"""

from __future__ import annotations

import re

_UNSAFE = re.compile(r"[^A-Za-z0-9_\-:@+=~]")
_FALCO_RULE = re.compile(r"[^a-z0-9]+")


def token(value: object) -> str:
    """One safe subject token: unsafe characters become `_`, empty becomes `_`."""
    text = str(value)
    if text.isalnum() and text.isascii():  # the common case, without a regex
        return text
    return _UNSAFE.sub("_", text) or "_"


def subject(prefix: str, *parts: object) -> str:
    """`prefix` (a literal such as `gpu.health`, used as is) then one sanitised token per part."""
    return ".".join((prefix, *(token(p) for p in parts)))


def falco_rule_token(rule: str) -> str:
    """Falcosidekick's rule token: lower-case, runs outside [a-z0-9] become `_`, trimmed."""
    return _FALCO_RULE.sub("_", rule.lower()).strip("_") or "_"
