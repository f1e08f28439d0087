"""pack_rows: every token once, bins within capacity, positions per row, and a packed forward
with the block-diagonal mask equal to running each row alone."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rowgrove.algo import pack_rows, pack_tokens, packed_attention_mask, unpack_tokens
from rowgrove.errors import InputError
from rowgrove.types import Row

SETTINGS = settings(max_examples=50, deadline=None)


def naive_first_fit(lengths, capacity):
    room = []
    for n in lengths:
        for j, r in enumerate(room):
            if r >= n:
                room[j] -= n
                break
        else:
            room.append(capacity - n)
    return len(room)


@SETTINGS
@given(st.integers(1, 40).flatmap(lambda cap: st.tuples(st.just(cap), st.lists(st.integers(0, cap), max_size=40))))
def test_every_token_once_no_bin_over_capacity_and_no_worse_than_first_fit(data):
    capacity, lengths = data
    rows = [Row(f"r{i}", "p", [i * 100 + t for t in range(n)], [1] * n) for i, n in enumerate(lengths)]
    bins = pack_rows(rows, capacity)
    placed = np.concatenate([b.input_ids for b in bins]) if bins else np.zeros(0, np.int64)
    expected = np.concatenate([r.input_ids for r in rows]) if rows else np.zeros(0)
    assert sorted(placed.tolist()) == sorted(np.asarray(expected, np.int64).tolist())  # each token once
    assert sorted(i for b in bins for i in b.row_indices.tolist()) == list(range(len(rows)))
    assert len(bins) <= naive_first_fit(lengths, capacity)
    for b in bins:
        assert b.length <= capacity
        assert b.cu_seqlens[0] == 0 and b.cu_seqlens[-1] == len(b.input_ids) == len(b.position_ids)
        for k, i in enumerate(b.row_indices.tolist()):
            lo, hi = b.cu_seqlens[k], b.cu_seqlens[k + 1]
            assert b.input_ids[lo:hi].tolist() == rows[i].input_ids  # rows whole, in place
            assert b.position_ids[lo:hi].tolist() == list(range(hi - lo))  # positions restart
            assert (b.segment_ids[lo:hi] == k).all()
    # packing bare lengths gives the same layout without ids
    assert [b.row_indices.tolist() for b in pack_rows(lengths, capacity)] == [b.row_indices.tolist() for b in bins]


def test_pack_tokens_round_trips_per_token_arrays():
    rows = [Row("a", "p", [1, 2, 3], [0, 1, 1]), Row("b", "p", [4, 5], [0, 1]), Row("c", "p", [6, 7, 8, 9], [0, 0, 1, 1])]
    weights = [np.array([0.0, 0.25, 0.25]), np.array([0.0, 0.25]), np.array([0.0, 0.0, 0.125, 0.125])]
    bins = pack_rows(rows, 5)
    assert len(bins) == 2
    for b, w in zip(bins, pack_tokens(bins, weights), strict=True):
        for i, back in zip(b.row_indices.tolist(), unpack_tokens(b, w), strict=True):
            np.testing.assert_array_equal(back, weights[i])
    assert sum(w.sum() for w in pack_tokens(bins, weights)) == pytest.approx(1.0)
    with pytest.raises(InputError, match="row 0 has"):
        pack_tokens(bins, [np.zeros(2), np.zeros(2), np.zeros(4)])


def test_row_longer_than_capacity_is_named():
    rows = [Row("a", "p", [1] * 3, [1] * 3), Row("big", "p", [1] * 9, [1] * 9)]
    with pytest.raises(InputError, match=r"longer than the capacity 8 \(big#1 \(9 tokens\)\)"):
        pack_rows(rows, 8)
    with pytest.raises(InputError, match="capacity must be a positive int"):
        pack_rows(rows, 0)


class TinyAttention(torch.nn.Module):
    """One causal self-attention block with learned positions: a mask and position ids decide
    everything a token sees, so it shows whether packing leaks across rows."""

    def __init__(self, vocab=13, dim=8, max_pos=32):
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.pos = torch.nn.Embedding(vocab, dim), torch.nn.Embedding(max_pos, dim)
        self.qkv, self.out = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, vocab)
        self.double()

    def forward(self, ids, position_ids, mask):
        x = self.emb(ids) + self.pos(position_ids)
        q, k, v = self.qkv(x).chunk(3, -1)
        h = torch.nn.functional.scaled_dot_product_attention(q[None], k[None], v[None], attn_mask=mask)[0]
        return torch.log_softmax(self.out(x + h), -1)


def _logprobs(model, ids, pos, mask):
    lp = model(torch.as_tensor(ids), torch.as_tensor(pos), mask)
    return lp[:-1].gather(1, torch.as_tensor(ids)[1:, None])[:, 0]


def test_packed_forward_equals_rows_one_by_one():
    torch.set_num_threads(1)
    model = TinyAttention()
    rng = np.random.default_rng(0)
    rows = [Row(f"r{i}", "p", rng.integers(0, 13, n).tolist(), [1] * n) for i, n in enumerate([5, 9, 3, 7, 12, 2, 6])]
    bins = pack_rows(rows, 16)
    assert len(bins) < len(rows)
    with torch.no_grad():
        alone = {}
        for i, r in enumerate(rows):
            n = len(r.input_ids)
            alone[i] = _logprobs(model, r.input_ids, np.arange(n), torch.ones(n, n, dtype=torch.bool).tril())
        for b in bins:
            lp = model(torch.as_tensor(b.input_ids), torch.as_tensor(b.position_ids), packed_attention_mask(b))
            leaky = model(torch.as_tensor(b.input_ids), torch.as_tensor(b.position_ids),
                          torch.ones(b.length, b.length, dtype=torch.bool).tril())
            for k, i in enumerate(b.row_indices.tolist()):
                lo, hi = int(b.cu_seqlens[k]), int(b.cu_seqlens[k + 1])
                ids = torch.as_tensor(b.input_ids[lo:hi])
                packed = lp[lo:hi - 1].gather(1, ids[1:, None])[:, 0]
                torch.testing.assert_close(packed, alone[i], rtol=1e-12, atol=1e-12)
                if k > 0:  # a plain causal mask lets later rows see earlier ones: not equal
                    assert not torch.allclose(leaky[lo:hi - 1].gather(1, ids[1:, None])[:, 0], alone[i])
