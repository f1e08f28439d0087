"""The certificate: splitting a rollout into rows never changes the step's gradient.

A rollout is a token sequence with a loss mask. Split it anywhere into rows, each row keeping the
full prefix as its prompt and training only its own tokens; with a causal model the prefix decides
each token's logits, so the per-token losses are the same. What could still differ is the
weighting: the number of mini-batches, which rollouts share one, and each token's weight. Here a
tiny real torch LM (fp64) runs the whole path, assign_advantages -> minibatches -> loss_weights ->
micro-batches with gradient accumulation (loss = sum(weight * per-token loss), no extra
division), and the gradients of every optimizer update must equal those of the unsplit data.
"""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rowgrove.algo import assign_advantages, loss_weights, minibatches
from rowgrove.types import Row

V = 11


class TinyLM(torch.nn.Module):
    """Embedding -> GRU -> linear: causal by construction."""

    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.emb = torch.nn.Embedding(V, 6)
        self.rnn = torch.nn.GRU(6, 6, batch_first=True)
        self.head = torch.nn.Linear(6, V)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
        self.double()

    def token_logprobs(self, ids):
        """logprob of token t given tokens < t, for t >= 1; position 0 gets 0 (never trained)."""
        x = torch.as_tensor(ids, dtype=torch.int64)[None]
        h, _ = self.rnn(self.emb(x))
        lp = torch.log_softmax(self.head(h[0, :-1]), -1).gather(1, x[0, 1:, None])[:, 0]
        return torch.cat([lp.new_zeros(1), lp])


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    return TinyLM()


def per_token_loss(lp, adv, surrogate):
    if surrogate == "pg":
        return -adv * lp
    # PPO-clip at ratio 1 (old logprobs = current): same gradient as the policy gradient
    ratio = torch.exp(lp - lp.detach())
    return -torch.minimum(ratio * adv, torch.clamp(ratio, 0.8, 1.2) * adv)


def step_grads(model, rows, mode, k, micro, seed, surrogate="pg", weights_fn=loss_weights):
    """Flattened gradient of each optimizer update of one step."""
    rows = assign_advantages(rows, estimator="grpo")
    grads = []
    for mb in minibatches(rows, k, seed=seed):
        weights = weights_fn(mb, mode)
        model.zero_grad()
        for start in range(0, len(mb), micro):
            loss = torch.zeros((), dtype=torch.float64)
            for row, w_T in zip(mb[start:start + micro], weights[start:start + micro], strict=True):
                lp = model.token_logprobs(row.input_ids)
                loss = loss + (torch.as_tensor(w_T) * per_token_loss(lp, row.advantage, surrogate)).sum()
            loss.backward()  # accumulate: no division by the number of micro-batches
        grads.append(torch.cat([p.grad.flatten().clone() for p in model.parameters()]))
    return grads


def split(row, cuts):
    """Rows of one rollout cut before each position in `cuts`; each keeps the full prefix."""
    bounds = [0, *sorted(set(cuts)), len(row.input_ids)]
    out = []
    for seg, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        mask = [0] * a + list(row.loss_mask[a:b])
        out.append(Row(row.rollout_id, row.group_id, list(row.input_ids[:b]), mask, reward=row.reward,
                       valid=row.valid, segment=seg))
    return out


@st.composite
def step_data(draw):
    """(unsplit rows, split rows): a few rollouts in 1-3 groups, each split at random points."""
    whole, pieces = [], []
    for r in range(draw(st.integers(2, 6))):
        n = draw(st.integers(3, 10))
        ids = draw(st.lists(st.integers(0, V - 1), min_size=n, max_size=n))
        mask = [0] + draw(st.lists(st.integers(0, 1), min_size=n - 1, max_size=n - 1))
        row = Row(f"r{r}", f"g{draw(st.integers(0, 2))}", ids, mask,
                  reward=float(draw(st.integers(0, 3))), valid=draw(st.integers(0, 5)) > 0)
        whole.append(row)
        pieces += split(row, draw(st.lists(st.integers(1, n - 1), max_size=3)))
    return whole, draw(st.permutations(pieces))


@settings(max_examples=30, deadline=None)
@given(step_data(), st.sampled_from(["token-mean", "rollout-mean"]), st.integers(1, 4), st.integers(1, 5),
       st.integers(1, 5), st.integers(0, 9), st.sampled_from(["pg", "ppo_clip"]))
def test_split_rollouts_give_the_same_gradient_per_update(model, data, mode, k, micro_whole, micro_split,
                                                          seed, surrogate):
    whole, pieces = data
    g_whole = step_grads(model, whole, mode, k, micro_whole, seed, surrogate)
    g_split = step_grads(model, pieces, mode, k, micro_split, seed, surrogate)
    assert len(g_whole) == len(g_split) == -(-len(whole) // k)  # same number of updates
    for a, b in zip(g_whole, g_split, strict=True):
        assert torch.allclose(a, b, rtol=1e-9, atol=1e-12)


def test_certificate_is_not_vacuous(model):
    # r0 (reward 1) and r1 (reward 0) in one group; r0 split into 3 rows
    r0 = Row("r0", "p", [1, 2, 3, 4, 5, 6, 7, 8], [0, 0, 1, 1, 0, 1, 1, 1], reward=1.0)
    r1 = Row("r1", "p", [1, 2, 9, 9, 3], [0, 0, 1, 1, 1], reward=0.0)
    pieces = split(r0, [4, 6]) + [r1]
    for mode in ("token-mean", "rollout-mean"):
        (g_whole,) = step_grads(model, [r0, r1], mode, 2, 1, 0)
        (g_split,) = step_grads(model, pieces, mode, 2, 2, 0)
        assert g_whole.norm() > 1e-3
        assert torch.allclose(g_whole, g_split, rtol=1e-9, atol=1e-12)

    # a divisor that counts rows (each row weighs 1/N_rows, shared by its tokens) breaks it
    def per_row_mean(rows, mode):
        gen = [float(np.sum(r.loss_mask)) for r in rows]
        live = sum(g > 0 for g in gen)
        return [np.asarray(r.loss_mask, float) / (live * g) if g else np.zeros(len(r.loss_mask))
                for r, g in zip(rows, gen, strict=True)]

    (g_whole,) = step_grads(model, [r0, r1], "token-mean", 2, 1, 0, weights_fn=per_row_mean)
    (g_split,) = step_grads(model, pieces, "token-mean", 2, 1, 0, weights_fn=per_row_mean)
    assert not torch.allclose(g_whole, g_split, rtol=1e-6)


@settings(max_examples=30, deadline=None)
@given(step_data(), st.integers(1, 4), st.integers(0, 9), st.sampled_from(["token-mean", "rollout-mean"]))
def test_minibatches_carry_the_same_rollouts_and_total_weight_split_or_not(data, k, seed, mode):
    whole, pieces = data
    mb_whole, mb_split = minibatches(whole, k, seed=seed), minibatches(pieces, k, seed=seed)
    assert len(mb_whole) == len(mb_split)
    for a, b in zip(mb_whole, mb_split, strict=True):
        assert {r.rollout_id for r in a} == {r.rollout_id for r in b}
        mass_a = sum(w.sum() for w in loss_weights(a, mode))
        mass_b = sum(w.sum() for w in loss_weights(b, mode))
        assert mass_a == pytest.approx(mass_b, abs=1e-12)
