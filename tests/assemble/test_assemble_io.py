"""Rows round-trip through Parquet and JSON lines unchanged; the JSON shape is the HTTP shape."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rowgrove.assemble import read_rows, row_to_json, write_rows
from rowgrove.assemble.io import ROW_SCHEMA
from rowgrove.errors import InputError
from rowgrove.types import Row

f32 = st.floats(width=32, allow_nan=False, allow_infinity=False)
text = st.text(max_size=12)


@st.composite
def rows(draw):
    n = draw(st.integers(0, 40))
    return Row(
        rollout_id=draw(text),
        group_id=draw(st.none() | text),
        input_ids=np.asarray(draw(st.lists(st.integers(-2**31, 2**31 - 1), min_size=n, max_size=n)), np.int32),
        loss_mask=np.asarray(draw(st.lists(st.integers(0, 1), min_size=n, max_size=n)), np.int32),
        reward=draw(st.none() | st.floats(allow_nan=False, allow_infinity=False)),
        valid=draw(st.booleans()),
        advantage=draw(st.none() | st.floats(allow_nan=False, allow_infinity=False)),
        logprobs=np.asarray(draw(st.lists(f32, min_size=n, max_size=n)), np.float32),
        segment=draw(st.integers(0, 1000)),
        call_ids=draw(st.lists(text, max_size=4)),
        mask_reason=draw(st.none() | text),
    )


def _same(a: Row, b: Row) -> bool:
    return (
        (a.rollout_id, a.group_id, a.reward, a.valid, a.advantage, a.segment, list(a.call_ids), a.mask_reason)
        == (b.rollout_id, b.group_id, b.reward, b.valid, b.advantage, b.segment, list(b.call_ids), b.mask_reason)
        and np.array_equal(np.asarray(a.input_ids), np.asarray(b.input_ids))
        and np.array_equal(np.asarray(a.loss_mask), np.asarray(b.loss_mask))
        and np.array_equal(np.asarray(a.logprobs), np.asarray(b.logprobs))
    )


@settings(max_examples=40, deadline=None)
@given(st.lists(rows(), max_size=5), st.sampled_from(["rows.parquet", "rows.jsonl"]))
def test_round_trip(tmp_path_factory, rs, name):
    path = tmp_path_factory.mktemp("rows") / name
    write_rows(rs, path)
    back = read_rows(path)
    assert len(back) == len(rs)
    assert all(_same(a, b) for a, b in zip(rs, back, strict=True))


def test_parquet_columns_are_typed(tmp_path):
    r = Row("r", "g", np.array([1, 2], np.int32), np.array([0, 1], np.int32), reward=1.0,
            logprobs=np.array([0, -0.5], np.float32), call_ids=["c1"])
    write_rows([r], tmp_path / "x.parquet")
    assert pq.read_schema(tmp_path / "x.parquet").equals(ROW_SCHEMA, check_metadata=False)
    d = row_to_json(r)
    assert set(d) == set(ROW_SCHEMA.names)
    assert d["input_ids"] == [1, 2] and d["logprobs"] == [0.0, -0.5] and d["advantage"] is None


def test_bad_paths(tmp_path):
    with pytest.raises(InputError, match=r"\*.parquet or \*.jsonl"):
        write_rows([], tmp_path / "rows.csv")
    with pytest.raises(InputError, match="does not exist"):
        read_rows(tmp_path / "missing.jsonl")
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    with pytest.raises(InputError, match="line 1"):
        read_rows(tmp_path / "bad.jsonl")
