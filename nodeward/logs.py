"""structlog setup: JSON lines when not on a terminal, readable lines on one.

Context (daemon, event id, subject, node, pod, action) is bound with
`structlog.contextvars.bound_contextvars(...)` around each handled message, so every
line logged inside a handler carries it.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any, Literal

import structlog

_SECRET_KEYS = ("password", "token", "secret", "keytab", "refresh_token", "access_token", "seed")


def _redact(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """Never log secret values, whatever a caller passes."""
    for key in list(event_dict):
        if any(s in key.lower() for s in _SECRET_KEYS) and key != "event":
            event_dict[key] = "***"
    return event_dict


def configure_logging(
    level: str = "info", fmt: Literal["auto", "json", "console"] = "auto", *, stream: Any = None
) -> None:
    """Configure structlog for this process. Without `stream`, lines go to whatever
    `sys.stderr` is when each logger is made (so a replaced stderr is followed)."""
    probe = stream or sys.stderr
    use_json = fmt == "json" or (fmt == "auto" and not probe.isatty())
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if use_json
        else structlog.dev.ConsoleRenderer(colors=probe.isatty())
    )

    def logger_factory(*_: Any) -> structlog.PrintLogger:
        return structlog.PrintLogger(file=stream or sys.stderr)

    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            _redact,
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            logging.getLevelNamesMapping()[level.upper()]
        ),
        logger_factory=logger_factory,
        cache_logger_on_first_use=False,
    )


def get_logger(**context: Any) -> Any:
    return structlog.get_logger().bind(**context)
