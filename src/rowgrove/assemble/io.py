"""Row files: Parquet (pyarrow; list<int32> / list<float32> columns) and JSON lines.

One schema, declared once (`ROW_SCHEMA`), used by both writers and by `row_to_json`, the shape of
`GET /v1/rollouts/{id}/rows`. Reading a file back gives rows equal to the ones written: ids and
mask as int32 arrays, logprobs as float32 (a float32 written as JSON text reads back exactly),
weight versions as int32 or None (a null column value / JSON null). Files written before a
column existed (`OPTIONAL`) still read: the column reads as None.
"""

from __future__ import annotations

import os

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from rowgrove.errors import InputError
from rowgrove.types import Row

ROW_SCHEMA = pa.schema([
    ("rollout_id", pa.string()),
    ("group_id", pa.string()),
    ("segment", pa.int32()),
    ("call_ids", pa.list_(pa.string())),
    ("input_ids", pa.list_(pa.int32())),
    ("loss_mask", pa.list_(pa.int32())),
    ("logprobs", pa.list_(pa.float32())),
    ("reward", pa.float64()),
    ("advantage", pa.float64()),
    ("valid", pa.bool_()),
    ("mask_reason", pa.string()),
    ("weight_versions", pa.list_(pa.int32())),   # null: versions unknown
    ("images", pa.list_(pa.string())),           # pixel digests of the row's images (ledger media table)
])
FIELDS = tuple(ROW_SCHEMA.names)
OPTIONAL = ("weight_versions", "images")   # added later: older row files lack them (None, no images)


def _floats(xs: Any) -> list[float]:
    return np.asarray(xs, dtype=np.float32).tolist()


def row_to_json(row: Row) -> dict[str, Any]:
    """A row as a JSON-ready dict with the keys of `ROW_SCHEMA` (the HTTP rows endpoint's shape)."""
    n = len(row.input_ids)
    return {
        "rollout_id": row.rollout_id,
        "group_id": row.group_id,
        "segment": int(row.segment),
        "call_ids": list(row.call_ids),
        "input_ids": np.asarray(row.input_ids, dtype=np.int32).tolist(),
        "loss_mask": np.asarray(row.loss_mask, dtype=np.int32).tolist(),
        "logprobs": _floats(row.logprobs) if row.logprobs is not None else [0.0] * n,
        "reward": None if row.reward is None else float(row.reward),
        "advantage": None if row.advantage is None else float(row.advantage),
        "valid": bool(row.valid),
        "mask_reason": row.mask_reason,
        "weight_versions": (None if row.weight_versions is None
                            else np.asarray(row.weight_versions, dtype=np.int32).tolist()),
        "images": list(row.images),
    }


def row_from_json(d: dict[str, Any]) -> Row:
    """The inverse of `row_to_json` (numpy arrays for the token columns)."""
    missing = [k for k in ("rollout_id", "input_ids", "loss_mask") if k not in d]
    if missing:
        raise InputError(f"row is missing {', '.join(missing)}: write rows with rowgrove.assemble.write_rows")
    return Row(
        rollout_id=d["rollout_id"],
        group_id=d.get("group_id"),
        input_ids=np.asarray(d["input_ids"], dtype=np.int32),
        loss_mask=np.asarray(d["loss_mask"], dtype=np.int32),
        reward=d.get("reward"),
        valid=bool(d.get("valid", True)),
        advantage=d.get("advantage"),
        logprobs=np.asarray(d.get("logprobs") or [0.0] * len(d["input_ids"]), dtype=np.float32),
        segment=int(d.get("segment", 0)),
        call_ids=list(d.get("call_ids") or ()),
        mask_reason=d.get("mask_reason"),
        weight_versions=None if d.get("weight_versions") is None else np.asarray(d["weight_versions"], dtype=np.int32),
        images=list(d.get("images") or ()),
    )


def _format(path: Path) -> str:
    name = path.name.lower()
    if name.endswith(".parquet") or name.endswith(".pq"):
        return "parquet"
    if name.endswith(".jsonl") or name.endswith(".ndjson"):
        return "jsonl"
    raise InputError(f"{path}: unknown row file type: name it *.parquet or *.jsonl")


def _list_array(arrays: list[np.ndarray | None], dtype: Any, pa_type: pa.DataType) -> pa.Array:
    """A list array of `arrays`; a None entry becomes a null list."""
    nulls = np.fromiter((a is None for a in arrays), dtype=bool, count=len(arrays))
    present = [a for a in arrays if a is not None]
    lengths = np.fromiter((0 if a is None else len(a) for a in arrays), dtype=np.int64, count=len(arrays))
    offsets = np.zeros(len(arrays) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.concatenate(present).astype(dtype, copy=False) if present else np.zeros(0, dtype)
    mask = pa.array(nulls, pa.bool_()) if nulls.any() else None
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(flat, pa_type), mask=mask)


def rows_to_table(rows: list[Row]) -> pa.Table:
    """Rows as an Arrow table with `ROW_SCHEMA`; token columns are built without per-token Python."""
    ids = [np.asarray(r.input_ids, dtype=np.int32) for r in rows]
    masks = [np.asarray(r.loss_mask, dtype=np.int32) for r in rows]
    lps = [np.asarray(r.logprobs if r.logprobs is not None else np.zeros(len(i)), dtype=np.float32)
           for r, i in zip(rows, ids, strict=True)]
    cols = {
        "rollout_id": pa.array([r.rollout_id for r in rows], pa.string()),
        "group_id": pa.array([r.group_id for r in rows], pa.string()),
        "segment": pa.array([int(r.segment) for r in rows], pa.int32()),
        "call_ids": pa.array([list(r.call_ids) for r in rows], pa.list_(pa.string())),
        "input_ids": _list_array(ids, np.int32, pa.int32()),
        "loss_mask": _list_array(masks, np.int32, pa.int32()),
        "logprobs": _list_array(lps, np.float32, pa.float32()),
        "reward": pa.array([None if r.reward is None else float(r.reward) for r in rows], pa.float64()),
        "advantage": pa.array([None if r.advantage is None else float(r.advantage) for r in rows], pa.float64()),
        "valid": pa.array([bool(r.valid) for r in rows], pa.bool_()),
        "mask_reason": pa.array([r.mask_reason for r in rows], pa.string()),
        "weight_versions": _list_array(
            [None if r.weight_versions is None else np.asarray(r.weight_versions, dtype=np.int32) for r in rows],
            np.int32, pa.int32()),
        "images": pa.array([list(r.images) for r in rows], pa.list_(pa.string())),
    }
    return pa.table(cols, schema=ROW_SCHEMA)


def _split(col: pa.ChunkedArray, dtype: Any) -> list[np.ndarray]:
    arr = col.combine_chunks()
    offsets = arr.offsets.to_numpy()
    flat = arr.values.to_numpy(zero_copy_only=False).astype(dtype, copy=False)
    return [flat[offsets[i]:offsets[i + 1]] for i in range(len(arr))]


def _split_nullable(table: pa.Table, name: str, dtype: Any) -> list[np.ndarray | None]:
    """`_split` of an optional list column: None for a null entry, or for every row of a table
    written before the column existed."""
    if name not in table.column_names:
        return [None] * table.num_rows
    col = table[name]
    nulls = col.combine_chunks().is_null().to_numpy(zero_copy_only=False)
    return [None if null else a for a, null in zip(_split(col, dtype), nulls, strict=True)]


def table_to_rows(table: pa.Table) -> list[Row]:
    """The inverse of `rows_to_table`."""
    missing = [f for f in FIELDS if f not in table.column_names and f not in OPTIONAL]
    if missing:
        raise InputError(f"row table lacks columns {', '.join(missing)}: write it with rowgrove.assemble.write_rows")
    ids = _split(table["input_ids"], np.int32)
    masks = _split(table["loss_mask"], np.int32)
    lps = _split(table["logprobs"], np.float32)
    versions = _split_nullable(table, "weight_versions", np.int32)
    images = table["images"].to_pylist() if "images" in table.column_names else [None] * table.num_rows
    plain = {k: table[k].to_pylist() for k in FIELDS
             if k not in ("input_ids", "loss_mask", "logprobs") and k not in OPTIONAL}
    return [
        Row(
            rollout_id=plain["rollout_id"][i], group_id=plain["group_id"][i], input_ids=ids[i],
            loss_mask=masks[i], reward=plain["reward"][i], valid=plain["valid"][i],
            advantage=plain["advantage"][i], logprobs=lps[i], segment=plain["segment"][i],
            call_ids=plain["call_ids"][i], mask_reason=plain["mask_reason"][i], weight_versions=versions[i],
            images=list(images[i] or ()),
        )
        for i in range(table.num_rows)
    ]


def check_out_path(path: str | Path) -> Path:
    """`path` as a row file to write: its suffix known and nothing in the way (not a folder, the
    folder above creatable and writable); InputError naming what to change otherwise. Called
    before any work, so a bad --out costs nothing."""
    path = Path(path)
    if path.is_dir():
        raise InputError(f"--out {path} is a folder: name a file in it, e.g. {path / 'rows.parquet'}")
    _format(path)
    parent = next((p for p in [path.parent, *path.parent.parents] if p.exists()), Path("."))
    if not parent.is_dir():
        raise InputError(f"--out {path}: {parent} is a file, not a folder: pick another path")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(f"--out {path}: cannot write in {parent}: pick a path you can write")
    return path


def write_rows(rows: Iterable[Row], path: str | Path) -> Path:
    """Write rows to `path` (*.parquet or *.jsonl, chosen by the name); returns the path. The file
    appears whole or not at all (written beside it, then renamed); an unwritable path is an
    InputError naming it."""
    path = check_out_path(path)
    fmt = _format(path)
    rows = list(rows)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if fmt == "parquet":
            pq.write_table(rows_to_table(rows), tmp)
        else:
            with open(tmp, "wb") as f:
                for r in rows:
                    f.write(orjson.dumps(row_to_json(r)))
                    f.write(b"\n")
        os.replace(tmp, path)
    except OSError as e:
        raise InputError(f"cannot write rows to {path} ({e.strerror or e}): pick a path you can write") from None
    finally:
        tmp.unlink(missing_ok=True)
    return path


def read_rows(path: str | Path) -> list[Row]:
    """Rows from a file `write_rows` wrote."""
    path = Path(path)
    fmt = _format(path)
    if not path.exists():
        raise InputError(f"row file {path} does not exist: write it with `rowgrove rows --out {path}`")
    if fmt == "parquet":
        return table_to_rows(pq.read_table(path))
    out: list[Row] = []
    with open(path, "rb") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    out.append(row_from_json(orjson.loads(line)))
                except orjson.JSONDecodeError as e:
                    raise InputError(f"{path} line {n} is not JSON ({e}): the file is truncated or not a row file") from None
    return out
