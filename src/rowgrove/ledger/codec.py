"""A ledger row's values as stored and as read: token ids, logprobs and weight versions as packed
little-endian arrays, JSON as bytes, a row as a `Call` or `Rollout`, and ids that sort by the
time they were made."""

from __future__ import annotations

import random
import sys
import time
from array import array
from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson

from rowgrove.errors import InputError
from rowgrove.types import Call, Rollout


def ordered_hex(n: int) -> str:
    """`n` (> 13) hex digits: the microsecond clock (13 digits, good to the year 2112), then random
    ones. Ids made later sort later, so each insert lands at the end of the ledger's indexes on
    call and rollout ids; a random id dirties a random index page at every insert, and every dirty
    page is written to the WAL at the next commit (with an index fewer, the ledger's CPU per call
    at 32 concurrent rollouts went from about 70 to 40 µs). The random part keeps ids unique
    across processes (the random module reseeds in a forked child); an id is a name, never a
    secret, so it is drawn without a system call per id."""
    clock, k = f"{time.time_ns() // 1000:013x}", n - 13
    return clock + f"{random.getrandbits(4 * k):0{k}x}" if k > 0 else clock[:n]


# a list (ids from a tokenizer or an engine, logprobs) packs through `array` without a numpy
# round trip; anything else, or a value array refuses, goes through numpy as before
_ARRAY_OK = sys.byteorder == "little" and array("i").itemsize == 4 and array("f").itemsize == 4


def _pack(xs: Sequence[Any] | np.ndarray, code: str, dtype: str) -> bytes:
    if _ARRAY_OK and type(xs) is list:
        try:
            return array(code, xs).tobytes()
        except (TypeError, OverflowError):
            pass
    return np.asarray(xs, dtype=dtype).tobytes()


def pack_ids(ids: Sequence[int] | np.ndarray) -> bytes:
    return _pack(ids, "i", "<i4")


def unpack_ids(blob: bytes | None) -> np.ndarray:
    return np.frombuffer(blob, dtype="<i4") if blob else np.zeros(0, np.int32)


def pack_floats(xs: Sequence[float] | np.ndarray) -> bytes:
    return _pack(xs, "f", "<f4")


def unpack_floats(blob: bytes | None) -> np.ndarray:
    return np.frombuffer(blob, dtype="<f4") if blob else np.zeros(0, np.float32)


def unpack_versions(blob: bytes | None) -> np.ndarray | None:
    """Weight versions of a call's sampled ids; None where the ledger does not know them (NULL)."""
    return None if blob is None else np.frombuffer(blob, dtype="<i4")


def check_versions(call_id: str, sampled_ids: Sequence[int] | np.ndarray,
                    weight_versions: Sequence[int] | np.ndarray | None) -> bytes | None:
    """The packed versions, or None; InputError unless there is one version >= 0 per sampled id."""
    if weight_versions is None:
        return None
    if type(weight_versions) is list and len(weight_versions) == len(sampled_ids) \
            and all(type(v) is int and 0 <= v <= 2**31 - 1 for v in weight_versions):
        return pack_ids(weight_versions)  # the gateway's usual case, without numpy's per-array cost
    vs = np.asarray(weight_versions)
    if vs.ndim != 1 or len(vs) != len(sampled_ids):
        raise InputError(
            f"call {call_id}: {len(sampled_ids)} sampled ids but {vs.size} weight versions: give one per sampled id"
        )
    if len(vs) and (not np.issubdtype(vs.dtype, np.integer) or vs.min() < 0 or vs.max() > np.iinfo(np.int32).max):
        raise InputError(f"call {call_id}: weight versions must be integers in [0, 2**31), got {vs[:5].tolist()}")
    return pack_ids(vs)


def to_json(value: Any) -> bytes | None:
    return None if value is None else orjson.dumps(value)


def from_json(blob: bytes | str | None) -> Any:
    return None if blob is None else orjson.loads(blob)


def call_from_row(r: tuple) -> Call:
    return Call(
        id=r[0], rollout_id=r[1], ordinal=r[2], parent_id=r[3], root=bool(r[4]), status=r[5],
        prompt_ids=unpack_ids(r[6]), prompt_len=r[7], sampled_ids=unpack_ids(r[8]),
        logprobs=unpack_floats(r[9]), finish_reason=r[10], request_hash=r[11],
        summary_hash=r[12], response_hash=r[13], request_key=r[14], response=from_json(r[15]),
        error=r[16], created_at=r[17], completed_at=r[18], history_drift=bool(r[19]),
        weight_versions=unpack_versions(r[20]),
    )


def rollout_from_row(r: tuple) -> Rollout:
    return Rollout(
        id=r[0], group_id=r[1], api_key=r[2], status=r[3], metadata=from_json(r[4]) or {},
        reward=r[5], valid=bool(r[6]), record=from_json(r[7]), created_at=r[8], finished_at=r[9],
    )


__all__ = ["call_from_row", "check_versions", "from_json", "ordered_hex", "pack_floats", "pack_ids",
           "rollout_from_row", "to_json", "unpack_floats", "unpack_ids", "unpack_versions"]
