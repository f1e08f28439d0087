"""The trainer's update: packed equals padded, split rows train the same, accumulation and the
number of optimizer steps do not depend on rows."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rowgrove.algo import assign_advantages, loss_weights
from rowgrove.errors import InputError
from rowgrove.train.update import build_microbatches, ppo_clip_loss, update_policy

from rg_train_helpers import split_row, synthetic_rollouts, tiny_llama


def _step(rows, *, packed=True, capacity=64, mode="token-mean", seed=0):
    model = tiny_llama(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    stats = update_policy(model, opt, rows, loss_mode=mode, rollouts_per_minibatch=5,
                          microbatch_tokens=capacity, clip_eps=0.2, seed=3, packed=packed)
    return model, stats


def _params(model):
    return [p.detach().clone() for p in model.parameters()]


def _close(a, b, tol=1e-5):
    for x, y in zip(_params(a), _params(b), strict=True):
        torch.testing.assert_close(x, y, rtol=tol, atol=tol)


@pytest.mark.parametrize("mode", ["token-mean", "rollout-mean"])
def test_split_rows_give_the_same_update(mode):
    rows = assign_advantages(synthetic_rollouts(), estimator="grpo")
    split = []
    for i, r in enumerate(rows):
        cut = [k for k, m in enumerate(r.loss_mask) if m][len([m for m in r.loss_mask if m]) // 2]
        split += split_row(r, cut) if i % 2 == 0 else [r]
    assert len(split) > len(rows)
    a, sa = _step(rows, mode=mode)
    b, sb = _step(split, mode=mode)
    assert sa["updates"] == sb["updates"] == 3  # 12 rollouts, 5 per mini-batch, rows do not matter
    assert sa["tokens_trained"] == sb["tokens_trained"]
    _close(a, b)
    # and the update did something
    c = tiny_llama(0)
    assert any(not torch.equal(x, y) for x, y in zip(_params(a), _params(c), strict=True))


def test_packed_equals_padded_and_capacity_does_not_matter():
    rows = assign_advantages(synthetic_rollouts(seed=1), estimator="grpo")
    a, _ = _step(rows, packed=True, capacity=40)
    b, _ = _step(rows, packed=False, capacity=40)
    c, _ = _step(rows, packed=True, capacity=100000)  # one micro-batch per mini-batch
    # fp32, two attention kernels (masked batch vs causal), three Adam steps at lr 1e-2
    _close(a, b, tol=1e-4)
    _close(a, c, tol=1e-4)


def test_microbatch_loss_sums_to_the_full_loss():
    # the loss of a mini-batch split into micro-batches is the sum of their losses (no division)
    rows = assign_advantages(synthetic_rollouts(seed=2), estimator="grpo")
    w = loss_weights(rows, "token-mean")
    model = tiny_llama()
    small = build_microbatches(rows, w, capacity=30, packed=True)
    whole = build_microbatches(rows, w, capacity=10**6, packed=True)
    assert len(small) > 1 and len(whole) == 1
    total = sum(float(ppo_clip_loss(model, m, 0.2)[0].detach()) for m in small)
    assert total == pytest.approx(float(ppo_clip_loss(model, whole[0], 0.2)[0].detach()), abs=1e-6)


def test_loss_at_ratio_one_is_minus_weighted_advantage():
    # engine logprobs equal to the policy's: ratio 1, loss = -sum(w * A) (hand check of the formula)
    rows = assign_advantages(synthetic_rollouts(n_groups=1, seed=4), estimator="grpo")
    model = tiny_llama()
    w = loss_weights(rows, "token-mean")
    mb = build_microbatches(rows, w, capacity=10**6)[0]
    from rowgrove.train.update import microbatch_logits

    with torch.no_grad():
        logits = microbatch_logits(model, mb)
        keep = mb.trained.any(0).nonzero().squeeze(-1)
        sel = mb.trained[:, keep]
        lp = torch.log_softmax(logits, -1).gather(-1, mb.target[:, keep][sel][:, None]).squeeze(-1)
        mb.old_logp[:, keep] = mb.old_logp[:, keep].masked_scatter(sel, lp)
    loss, stats = ppo_clip_loss(model, mb, 0.2)
    expected = -sum(float(np.sum(wi)) * r.advantage for wi, r in zip(w, rows, strict=True))
    assert float(loss.detach()) == pytest.approx(expected, abs=1e-6)
    assert stats["clipped"] == 0 and abs(stats["kl"]) < 1e-5


def test_invalid_rollouts_get_no_gradient_and_missing_advantage_is_refused():
    rows = assign_advantages(synthetic_rollouts(n_groups=1, per_group=2, seed=5), estimator="grpo")
    bad = [type(r)(**{**r.__dict__, "valid": False}) for r in rows]
    model = tiny_llama()
    before = _params(model)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    stats = update_policy(model, opt, bad, rollouts_per_minibatch=4)
    assert stats["tokens_trained"] == 0
    assert all(torch.equal(x, y) for x, y in zip(before, _params(model), strict=True))
    raw = synthetic_rollouts(n_groups=1, per_group=2)
    with pytest.raises(InputError, match="no advantage"):
        update_policy(model, opt, raw)


def test_kl_penalty_keeps_the_policy_nearer_the_reference_and_is_zero_on_it():
    rows = assign_advantages(synthetic_rollouts(seed=2), estimator="grpo")
    ref = tiny_llama(0).eval().requires_grad_(False)

    def run(kl_coef):
        model = tiny_llama(0)
        opt = torch.optim.SGD(model.parameters(), lr=0.2)
        stats = [update_policy(model, opt, rows, rollouts_per_minibatch=4, seed=s, max_grad_norm=0,
                               ref_model=ref, kl_coef=kl_coef) for s in range(4)]
        gap = sum(float((p.detach() - q).pow(2).sum()) for p, q in zip(model.parameters(), ref.parameters(), strict=True))
        return gap, stats

    free, s_free = run(0.0)
    held, s_held = run(1.0)
    assert s_held[-1]["ref_kl"] > 0
    # on the reference itself the penalty and its measure are exactly zero
    mb = build_microbatches(rows, loss_weights(rows), capacity=4096)[0]
    _, on_ref = ppo_clip_loss(ref, mb, 0.2, ref_model=ref, kl_coef=1.0)
    assert on_ref["ref_kl"] == pytest.approx(0.0, abs=1e-6)
    assert held < free  # the penalty pulls the policy back towards where it started
    assert s_free[-1]["ref_kl"] == 0.0  # without a coefficient nothing is computed
