"""Each seam defect's figure on hand-built batches, the answer derived in the comments.

The defects live in bench/seam_defects.py (bench-only, never rowgrove.algo); these tests pin what
`rowgrove bench seam` reports for them. Do not "fix" an expected number: derive it again.
"""

from __future__ import annotations

import numpy as np
import pytest

from rowgrove.algo import assign_advantages, loss_weights
from rowgrove.types import Call, Row

from seam_defects import (
    compare,
    never_sampled,
    rejected_rows,
    reshape_advantages,
    retokenize_rows,
    row_baseline_advantages,
    row_divisor_weights,
    seq_mean_weights,
    template_text,
    weight_fn,
)


def _row(rollout_id, group_id, reward, n_tokens=2, n_generated=1, valid=True):
    mask = [0] * (n_tokens - n_generated) + [1] * n_generated
    return Row(rollout_id, group_id, list(range(n_tokens)), mask, reward=reward, valid=valid,
               logprobs=[0.0] * n_tokens)


def _figures(rows, defect_rows, mode="token-mean", defect_weights=None, **adv):
    ref = assign_advantages(rows, **adv)
    w_ref = loss_weights(ref, mode)
    w = defect_weights(defect_rows, mode) if defect_weights else loss_weights(defect_rows, mode)
    return compare(ref, w_ref, defect_rows, w)


# ---------------------------------------------------------------- (2) reshape, slime PR #2204
# Groups a = [9, 5, 9, 5], b = [5, 5, 5], c = [8, 4, 8, 4], one row each, in batch order. The
# reshape expects 4 x 3 = 12 rewards, gets 11, and falls back to one batch-wide group:
# mean (28 + 15 + 24) / 11 = 67/11, so every b gets 5 - 67/11 = -12/11 = -1.090909 (dr_grpo).
SEED004 = [_row(f"{g}{i}", g, r) for g, rs in (("a", [9, 5, 9, 5]), ("b", [5, 5, 5]), ("c", [8, 4, 8, 4]))
           for i, r in enumerate(rs)]


def test_reshape_of_uneven_groups_falls_back_to_the_batch_and_gives_b_minus_12_over_11():
    out = reshape_advantages(SEED004, group_size=4, n_groups=3, estimator="dr_grpo")
    b = [r.advantage for r in out if r.group_id == "b"]
    assert b == pytest.approx([-12 / 11] * 3, rel=1e-12)
    assert round(b[0], 6) == -1.090909
    # Figures, token-mean, one generated token per rollout (each weighs 1/11):
    # rowgrove: a, c at +-2, b at 0 -> mass 8 * 2 / 11 = 16/11.
    # reshape: signs of a and c unchanged (9, 8 above 67/11; 5, 4 below), b 0 -> negative: 3 of 11
    # wrong, all "spurious". Mass: |9-67/11|=32/11 (x2), |5-67/11|=12/11 (x2 in a, x3 in b),
    # |8-67/11|=21/11 (x2), |4-67/11|=23/11 (x2): (64+24+36+42+46)/11 = 212/11, times 1/11;
    # ratio (212/121) / (16/11) = 53/44.
    f = _figures(SEED004, out, estimator="dr_grpo")
    assert f["wrong_sign"] == pytest.approx(3 / 11) and f["spurious"] == pytest.approx(3 / 11)
    assert f["flipped"] == 0.0
    assert f["mass_ratio"] == pytest.approx(53 / 44, rel=1e-12)


def test_reshape_that_fits_by_count_still_cuts_rollouts_apart():
    # p: A (1.0) in 2 rows, B (0.0) in 1 row; q: C (0.0) alone. 4 rows = 2 x 2, so the reshape
    # "fits": chunks [A, A] and [B, C], both uniform -> every advantage 0. rowgrove: A +0.5,
    # B -0.5 (dr_grpo), C 0 (a group of one). A and B flipped to 0: 2 of 3 wrong, mass ratio 0.
    rows = [_row("A", "p", 1.0), _row("A", "p", 1.0), _row("B", "p", 0.0), _row("C", "q", 0.0)]
    out = reshape_advantages(rows, group_size=2, n_groups=2, estimator="dr_grpo")
    assert [r.advantage for r in out] == [0.0, 0.0, 0.0, 0.0]
    f = _figures(rows, out, estimator="dr_grpo")
    assert f["wrong_sign"] == pytest.approx(2 / 3) and f["flipped"] == pytest.approx(2 / 3)
    assert f["mass_ratio"] == 0.0


def test_reshape_leaves_invalid_rows_out_and_at_zero():
    rows = [_row("A", "p", 1.0), _row("B", "p", 0.0), _row("X", "p", 7.0, valid=False)]
    out = reshape_advantages(rows, group_size=2, n_groups=1, estimator="dr_grpo")
    # 2 valid rows = 2 x 1: one chunk [1, 0] -> +-0.5; X takes no part
    assert [r.advantage for r in out] == [0.5, -0.5, 0.0]


# ---------------------------------------------------------------- (1) baseline over rows, NeMo RL #4124
def test_row_baseline_counts_a_split_rollout_k_times_and_flips_a_sign():
    # One group: A (1.0) in 3 rows, B (0.6) and C (0.0) in one row each. dr_grpo.
    # rowgrove: mean over rollouts (1 + 0.6 + 0) / 3 = 1.6/3, so B = 0.6 - 0.5333 = +1/15.
    # rows vote: mean (3 + 0.6 + 0) / 5 = 0.72, so B = 0.6 - 0.72 = -0.12: B's sign flips;
    # A = 1 - 0.72 = +0.28 and C = -0.72 keep theirs. wrong_sign = flipped = 1/3.
    rows = [_row("A", "g", 1.0), _row("A", "g", 1.0), _row("A", "g", 1.0), _row("B", "g", 0.6), _row("C", "g", 0.0)]
    out = row_baseline_advantages(rows, estimator="dr_grpo")
    assert [r.advantage for r in out] == pytest.approx([0.28, 0.28, 0.28, -0.12, -0.72], rel=1e-12)
    assert [r.rollout_id for r in out] == [r.rollout_id for r in rows]
    f = _figures(rows, out, "rollout-mean", estimator="dr_grpo")
    assert f["wrong_sign"] == pytest.approx(1 / 3) and f["flipped"] == pytest.approx(1 / 3)
    # rollout-mean, each rollout weighs 1/3: rowgrove mass (7/15 + 1/15 + 8/15) / 3 = 16/45;
    # rows: (0.28 + 0.12 + 0.72) / 3 = 1.12/3; ratio 1.12 * 15 / 16 = 1.05
    assert f["mass_ratio"] == pytest.approx(1.05, rel=1e-12)


def test_row_baseline_equals_rowgrove_when_every_rollout_is_one_row():
    rows = [_row(f"r{i}", f"g{i % 2}", float(i % 3)) for i in range(6)]
    ref = assign_advantages(rows)
    assert [r.advantage for r in row_baseline_advantages(rows)] == [r.advantage for r in ref]


# ---------------------------------------------------------------- (3) row divisor, agent-lightning Eq. 16
TWO_OVER_THREE = [_row("A", "g", 1.0, 4, 2), _row("A", "g", 1.0, 6, 3), _row("B", "g", 0.0, 5, 2)]


def test_row_divisor_keeps_two_thirds_of_the_mass_for_two_rollouts_over_three_rows():
    # rollout-mean: A's 5 tokens weigh 1/(R*5) = 1/10 each, B's 2 tokens 1/(2*2): each rollout 1/2.
    # Divided by rows (N = 3) instead: A 5 * 1/(3*5) = 1/3, B 2 * 1/(3*2) = 1/3: total 2/3.
    w = row_divisor_weights(TWO_OVER_THREE)
    assert sum(x.sum() for x in w) == pytest.approx(2 / 3, rel=1e-12)
    np.testing.assert_allclose(w[0], np.array([0, 0, 1, 1]) / 15)
    f = _figures(TWO_OVER_THREE, assign_advantages(TWO_OVER_THREE), "rollout-mean",
                 defect_weights=row_divisor_weights)
    # advantages unchanged (+-0.7071 under grpo), weights 1/3 instead of 1/2 -> mass ratio 2/3;
    # relative weight (x R = 2) is 2/3 for both, so the spread is 0 and no sign changes
    assert f["mass_ratio"] == pytest.approx(2 / 3, rel=1e-12)
    assert f["relative_weight_by_rows"] == pytest.approx({1: 2 / 3, 2: 2 / 3})
    assert f["weight_cv"] == pytest.approx(0.0, abs=1e-12) and f["wrong_sign"] == 0.0


# ---------------------------------------------------------------- (4) sequence mean over rows
def test_seq_mean_over_rows_gives_a_two_row_rollout_twice_the_weight():
    # every row 1/N = 1/3: A (2 rows) 2/3, B 1/3; x R = 2: A 4/3, B 2/3; mean 1, std 1/3 -> cv 1/3.
    # dr_grpo +-0.5: rowgrove mass 0.5 * 1/2 + 0.5 * 1/2 = 1/2; seq-mean 0.5 * 2/3 + 0.5 * 1/3 = 1/2.
    w = seq_mean_weights(TWO_OVER_THREE)
    assert [x.sum() for x in w] == pytest.approx([1 / 3] * 3)
    adv = assign_advantages(TWO_OVER_THREE, estimator="dr_grpo")
    f = _figures(TWO_OVER_THREE, adv, "rollout-mean", defect_weights=seq_mean_weights, estimator="dr_grpo")
    assert f["relative_weight_by_rows"] == pytest.approx({1: 2 / 3, 2: 4 / 3})
    assert f["weight_cv"] == pytest.approx(1 / 3)
    assert f["mass_ratio"] == pytest.approx(1.0)


def test_weight_fn_ladder():
    assert weight_fn("rowgrove") is loss_weights and weight_fn("retokenized") is loss_weights
    assert weight_fn("row_divisor") is row_divisor_weights
    with pytest.raises(ValueError, match="unknown seam"):
        weight_fn("nope")


# ---------------------------------------------------------------- (5) re-tokenized text
def test_never_sampled_counts_ids_outside_the_alignment():
    # sampled 5 6 7 8, re-tokenized 5 9 8: 5 and 8 align, 9 was never sampled -> 1
    assert never_sampled([5, 6, 7, 8], [5, 9, 8]) == 1
    assert never_sampled([1, 2, 3], [1, 2, 3]) == 0
    assert never_sampled([1, 2], [3, 4, 5]) == 3


@pytest.fixture(scope="module")
def tok():
    from rowgrove.envs import task_corpus
    from rowgrove.model.load import load_tokenizer
    from rowgrove.model.tiny import tiny_model_dir

    return load_tokenizer(str(tiny_model_dir(seed=0, extra_corpus=tuple(task_corpus("counter")))))


def test_retokenized_span_is_the_same_text_in_other_ids(tok):
    # The model sampled "add(3)" one character at a time (a valid, non-canonical tokenization);
    # the text path encodes it again to the tokenizer's canonical ids: the same text, and every
    # canonical id that is not one of those single characters was never sampled.
    text = "add(3)"
    chars = [i for ch in text for i in tok.encode(ch, add_special_tokens=False)]
    canon = tok.encode(text, add_special_tokens=False)
    assert chars != canon, "the tiny tokenizer merges this text"
    prompt = tok.encode("count", add_special_tokens=False)
    row = Row("A", "g", prompt + chars + prompt, [0] * len(prompt) + [1] * len(chars) + [0] * len(prompt),
              reward=1.0, logprobs=[0.0] * len(prompt) + [-0.5] * len(chars) + [0.0] * len(prompt))
    out = retokenize_rows([row], tok)
    new = out.rows[0]
    assert list(new.input_ids) == prompt + canon + prompt
    assert list(new.loss_mask) == [0] * len(prompt) + [1] * len(canon) + [0] * len(prompt)
    assert tok.decode(list(new.input_ids)) == tok.decode(list(row.input_ids))
    assert out.never_sampled_tokens == never_sampled(chars, canon) > 0
    assert out.changed_spans == 1 and out.trained_tokens == len(canon)
    # canonical sampled ids come back unchanged: nothing never-sampled
    same = retokenize_rows([Row("B", "g", prompt + canon, [0] * len(prompt) + [1] * len(canon), reward=0.0,
                                logprobs=[0.0] * (len(prompt) + len(canon)))], tok)
    assert same.never_sampled_tokens == 0 and same.changed_spans == 0


# ---------------------------------------------------------------- (6) rejected calls trained
def _call(cid, ordinal, parent, prompt, sampled):
    return Call(id=cid, rollout_id="A", ordinal=ordinal, parent_id=parent, root=parent is None,
                status="completed", prompt_ids=np.asarray(prompt, np.int32), prompt_len=0,
                sampled_ids=np.asarray(sampled, np.int32), logprobs=np.full(len(sampled), -1.0, np.float32))


def test_rejected_call_becomes_a_row_trained_on_its_own_sampled_ids():
    # c1 root: prompt 1 2 3, sampled 4 5. c2 (rejected) and c3 (its resample) both continue c1
    # with the new part 6; c2 sampled 7 8, c3 sampled 9. The accepted row is 1..6 9; the defect
    # adds a row 1 2 3 4 5 6 7 8 with mask 1 on 7 8 only (4 5 are trained in the accepted row).
    calls = [_call("c1", 1, None, [1, 2, 3], [4, 5]), _call("c2", 2, "c1", [6], [7, 8]),
             _call("c3", 3, "c1", [6], [9])]
    accepted_row = Row("A", "g", [1, 2, 3, 4, 5, 6, 9], [0, 0, 0, 1, 1, 0, 1], reward=1.0, advantage=0.5,
                       logprobs=[0, 0, 0, -1, -1, 0, -1], call_ids=["c1", "c3"])
    extra = rejected_rows([accepted_row], calls, ["c1", "c3"])
    assert len(extra) == 1
    r = extra[0]
    assert list(r.input_ids) == [1, 2, 3, 4, 5, 6, 7, 8]
    assert list(r.loss_mask) == [0, 0, 0, 0, 0, 0, 1, 1]
    assert list(r.logprobs) == [0, 0, 0, 0, 0, 0, -1, -1]
    assert r.advantage == 0.5 and r.reward == 1.0 and list(r.call_ids) == ["c1", "c2"]
    # under rollout-mean the rollout still weighs 1, but 2 of its 5 trained tokens were rejected
    w = loss_weights([accepted_row, r], "rollout-mean")
    assert float(w[1].sum()) == pytest.approx(2 / 5)
    assert rejected_rows([accepted_row], calls, ["c1", "c2", "c3"]) == []


def test_template_text_is_the_turn_as_the_template_writes_it(tok):
    msg = {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                                                "function": {"name": "add", "arguments": '{"n": 1}'}}]}
    # the tiny ChatML template writes a tool call as <tool_call>\n{json}\n</tool_call>, then <|im_end|>
    assert template_text(tok, msg) == '<tool_call>\n{"name": "add", "arguments": {"n": 1}}\n</tool_call><|im_end|>'


def test_text_path_reorders_what_the_model_sampled_and_trains_ids_it_never_sampled(tok):
    # The model sampled a tool call followed by stray text; the parser kept both (tool call +
    # content), and the template writes the content first: the same words in another order.
    # Every re-rendered id outside the difflib alignment with the sampled ids was never sampled.
    sampled_text = '<tool_call>\n{"name": "add", "arguments": {"n": 1}}\n</tool_call> add more<|im_end|>'
    sampled = tok.encode(sampled_text, add_special_tokens=False)
    msg = {"role": "assistant", "content": " add more",
           "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"n": 1}'}}]}
    rerendered = tok.encode(template_text(tok, msg), add_special_tokens=False)
    assert rerendered != sampled
    prompt = tok.encode("go", add_special_tokens=False)
    row = Row("A", "g", prompt + sampled, [0] * len(prompt) + [1] * len(sampled), reward=1.0,
              logprobs=[0.0] * (len(prompt) + len(sampled)))
    out = retokenize_rows([row], tok, lambda i, ids: template_text(tok, msg))
    assert list(out.rows[0].input_ids) == prompt + rerendered
    assert out.never_sampled_tokens == never_sampled(sampled, rerendered) > 0
    assert out.changed_spans == 1


def test_compare_of_a_step_with_no_rows_gives_zero_figures_not_an_index_error():
    # a step where every rollout was masked (e.g. a finish whose record names no reply) has no rows
    figures = compare([], [], [], [])
    assert figures["rollouts"] == 0 and figures["wrong_sign"] == 0.0 and figures["mass_ratio"] is None
