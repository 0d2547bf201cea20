"""`nodeward replay --since`: a duration back from now, or an RFC 3339 time with its offset."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from nodeward.cli.replay import parse_since

NOW = datetime(2026, 11, 29, 20, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("5m", NOW - timedelta(minutes=5)),
        ("1h30m", NOW - timedelta(hours=1, minutes=30)),
        ("90s", NOW - timedelta(seconds=90)),
        ("2026-11-29T19:00:00Z", datetime(2026, 11, 29, 19, tzinfo=UTC)),
        ("2026-11-29T21:00:00+02:00", datetime(2026, 11, 29, 19, tzinfo=UTC)),
    ],
)
def test_valid(text: str, expected: datetime) -> None:
    assert parse_since(text, now=NOW) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("yesterday", "neither a duration"),
        ("5 parsecs", "neither a duration"),
        ("2026-11-29T19:00:00", "no UTC offset"),
        ("2026-11-30T19:00:00Z", "in the future"),
        ("", "neither a duration"),
    ],
)
def test_invalid_says_why_in_one_line(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        parse_since(text, now=NOW)
    assert "\n" not in str(info.value)
