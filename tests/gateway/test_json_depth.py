"""The request body's depth check: a body nested deeper than `max_json_depth` is refused, one at
or under it is read, whichever way the check gets there (the bracket count that spares the walk
for small bodies, or the walk itself)."""

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rowgrove.errors import BadRequest
from rowgrove.gateway.dialects.openai_format import load_json

_leaves = st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(alphabet="[]{}\"\\ab,:", max_size=6)
_json = st.recursive(_leaves, lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.text(alphabet="[]{}ab", max_size=3), inner, max_size=3), max_leaves=40)


def _depth(v) -> int:
    if isinstance(v, dict):
        return 1 + max(map(_depth, v.values()), default=0)
    if isinstance(v, list):
        return 1 + max(map(_depth, v), default=0)
    return 0


@settings(max_examples=300, deadline=None)
@given(value=_json, limit=st.integers(1, 12))
def test_a_body_is_refused_exactly_when_it_nests_deeper_than_the_limit(value, limit):
    raw = orjson.dumps(value)
    if _depth(value) > limit:
        with pytest.raises(BadRequest) as e:
            load_json(raw, limit)
        assert e.value.code == "json_too_deep"
    else:
        assert load_json(raw, limit) == value


def test_brackets_inside_strings_never_make_a_shallow_body_too_deep():
    raw = orjson.dumps({"messages": [{"role": "user", "content": "[[[[{{{{" * 40}]})
    assert load_json(raw, 3)["messages"][0]["content"].startswith("[[[[")
