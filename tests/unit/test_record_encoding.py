"""KV record encoding: large records compressed, small ones plain JSON, bad gzip refused."""

from __future__ import annotations

import gzip

import pytest

from schemas.state.encoding import COMPRESS_ABOVE, dump_record, load_record
from schemas.state.lease import LeaseRecord


def test_small_records_stay_json_and_large_ones_round_trip_compressed() -> None:
    small = LeaseRecord(holder="a", expires_at=1.0, acquired_at=0.0)
    assert dump_record(small) == small.model_dump_json().encode()
    large = LeaseRecord(holder="h" * (2 * COMPRESS_ABOVE), expires_at=1.0, acquired_at=0.0)
    stored = dump_record(large)
    assert stored[:2] == b"\x1f\x8b" and len(stored) < COMPRESS_ABOVE
    assert gzip.decompress(stored) == large.model_dump_json().encode()  # `gunzip` reads it
    assert load_record(LeaseRecord, stored) == large
    assert load_record(LeaseRecord, small.model_dump_json()) == small


def test_a_value_with_gzips_magic_that_does_not_decompress_is_refused() -> None:
    with pytest.raises(ValueError, match="does not decompress"):
        load_record(LeaseRecord, b"\x1f\x8bnot gzip at all")
