"""The retry key and the context held beside it, made cheap for long conversations: the key of a
request body hashed from a recent body's state is the body's SHA-256, whatever the bodies share;
a call's context kept as prompt and sampled ids side by side reads as the joined list."""

import hashlib

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from rowgrove.gateway.core.decide import RolloutIndex
from rowgrove.gateway.dialects.openai_format import request_key
from rowgrove.hashing import PrefixHasher


class _SmallSteps(PrefixHasher):
    STEP = 8  # many kept states, so bisection and the partial tail are exercised on short strings


_edits = st.lists(st.tuples(st.integers(0, 60), st.binary(max_size=40)), min_size=1, max_size=12)


@settings(max_examples=200, deadline=None)
@given(edits=_edits)
def test_prefix_hasher_gives_the_sha256_of_every_body(edits):
    hasher, plain, body = _SmallSteps(), PrefixHasher(), b""
    for cut, added in edits:
        body = body[: max(len(body) - cut, 0)] + added  # a later body: an earlier one cut, plus more
        assert hasher.hexdigest(body) == hashlib.sha256(body).hexdigest()
        assert plain.hexdigest(body)[:32] == request_key(body)


def test_identical_retries_match_and_different_bodies_differ():
    hasher = PrefixHasher()
    first = b'{"messages":[{"role":"user","content":"hi"}],"temperature":1.0}'
    assert hasher.hexdigest(first) == hasher.hexdigest(first)
    assert hasher.hexdigest(first.replace(b"1.0", b"0.5")) != hasher.hexdigest(first)


def test_a_context_added_as_prompt_and_sampled_ids_reads_as_their_join():
    a, b = RolloutIndex(), RolloutIndex()
    prompt, sampled = [1, 2, 3, 4], [5, 9]
    a.add_call("r", "s0", prompt, sampled_ids=sampled)
    b.add_call("r", "s0", prompt + sampled)
    child = prompt + sampled + [6, 7]
    a.add_call("c", "s1", child, sampled_ids=[8, 9], parent_id="r")
    b.add_call("c", "s1", child + [8, 9], parent_id="r")
    for cid in ("r", "c"):
        assert a.extended(cid, [11]) == b.context_list(cid) + [11]
        assert a.context_list(cid) == b.context_list(cid)
        assert np.array_equal(a.context(cid), b.context(cid))
        assert a.last_token(cid) == b.last_token(cid) == 9
    assert prompt == [1, 2, 3, 4]  # the lists given are kept, never changed
