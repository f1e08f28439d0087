"""Rows round-trip through Parquet and JSON lines unchanged; the JSON shape is the HTTP shape."""

from __future__ import annotations

import numpy as np
import orjson
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rowgrove.assemble import read_rows, row_to_json, write_rows
from rowgrove.assemble.io import ROW_SCHEMA, rows_to_table, table_to_rows
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
        weight_versions=draw(st.none() | st.lists(st.integers(-1, 2**31 - 1), min_size=n, max_size=n).map(
            lambda v: np.asarray(v, np.int32))),
    )


def _same(a: Row, b: Row) -> bool:
    return (
        (a.rollout_id, a.group_id, a.reward, a.valid, a.advantage, a.segment, list(a.call_ids), a.mask_reason)
        == (b.rollout_id, b.group_id, b.reward, b.valid, b.advantage, b.segment, list(b.call_ids), b.mask_reason)
        and np.array_equal(np.asarray(a.input_ids), np.asarray(b.input_ids))
        and np.array_equal(np.asarray(a.loss_mask), np.asarray(b.loss_mask))
        and np.array_equal(np.asarray(a.logprobs), np.asarray(b.logprobs))
        and (a.weight_versions is None) == (b.weight_versions is None)
        and (a.weight_versions is None or (np.asarray(b.weight_versions).dtype == np.int32
                                           and np.array_equal(np.asarray(a.weight_versions), b.weight_versions)))
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


def _versioned_rows():
    return [
        Row("r1", "g", np.array([1, 2, 3], np.int32), np.array([0, 1, 1], np.int32), reward=1.0,
            logprobs=np.array([0, -0.5, -1], np.float32), weight_versions=np.array([-1, 4, 5], np.int32)),
        Row("r2", "g", np.array([4], np.int32), np.array([1], np.int32), reward=0.0,
            logprobs=np.array([-2], np.float32)),   # versions unknown
        Row("r3", "g", np.array([], np.int32), np.array([], np.int32), logprobs=np.array([], np.float32),
            weight_versions=np.array([], np.int32)),
    ]


@pytest.mark.parametrize("name", ["rows.parquet", "rows.jsonl"])
def test_weight_versions_round_trip_with_and_without(tmp_path, name):
    rs = _versioned_rows()
    back = read_rows(write_rows(rs, tmp_path / name))
    assert [None if r.weight_versions is None else list(r.weight_versions) for r in back] == [[-1, 4, 5], None, []]
    assert all(_same(a, b) for a, b in zip(rs, back, strict=True))
    assert row_to_json(rs[0])["weight_versions"] == [-1, 4, 5] and row_to_json(rs[1])["weight_versions"] is None


def test_files_written_before_weight_versions_still_read(tmp_path):
    rs = _versioned_rows()
    old = rows_to_table(rs).drop_columns(["weight_versions"])   # the schema before the column existed
    pq.write_table(old, tmp_path / "old.parquet")
    with open(tmp_path / "old.jsonl", "wb") as f:
        for r in rs:
            d = row_to_json(r)
            del d["weight_versions"]
            f.write(orjson.dumps(d) + b"\n")
    for name in ("old.parquet", "old.jsonl"):
        back = read_rows(tmp_path / name)
        assert [list(r.input_ids) for r in back] == [[1, 2, 3], [4], []]
        assert [r.weight_versions for r in back] == [None, None, None]
    with pytest.raises(InputError, match="lacks columns input_ids"):   # required columns stay required
        table_to_rows(old.drop_columns(["input_ids"]))
