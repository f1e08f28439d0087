"""Helpers for the trainer tests: a tiny random Llama (no tokenizer) and synthetic rows."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rowgrove.types import Row


def tiny_llama(seed: int = 0, vocab: int = 64):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=True)
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg)


def synthetic_rollouts(n_groups: int = 3, per_group: int = 4, seed: int = 0, vocab: int = 64) -> list[Row]:
    """One row per rollout: a prompt, then 2-3 sampled segments separated by tool-result tokens
    (mask 0), with made-up engine logprobs and a 0/1 reward."""
    rng = np.random.default_rng(seed)
    rows = []
    for g in range(n_groups):
        for k in range(per_group):
            ids, mask = list(rng.integers(0, vocab, rng.integers(3, 8))), None
            mask = [0] * len(ids)
            for _ in range(rng.integers(2, 4)):
                n = int(rng.integers(2, 9))
                ids += list(rng.integers(0, vocab, n))
                mask += [1] * n
                m = int(rng.integers(1, 5))
                ids += list(rng.integers(0, vocab, m))
                mask += [0] * m
            lp = [float(-rng.uniform(0.5, 5)) if b else 0.0 for b in mask]
            rows.append(Row(rollout_id=f"r{g}-{k}", group_id=f"g{g}", input_ids=[int(i) for i in ids],
                            loss_mask=mask, reward=float(rng.integers(0, 2)), logprobs=lp))
    return rows


def split_row(row: Row, cut: int) -> list[Row]:
    """Two rows of one rollout: tokens [:cut] with their mask, and the whole sequence with the
    mask zeroed before `cut` (the second row keeps the full prefix as its prompt)."""
    a = Row(rollout_id=row.rollout_id, group_id=row.group_id, input_ids=list(row.input_ids[:cut]),
            loss_mask=list(row.loss_mask[:cut]), reward=row.reward, valid=row.valid, advantage=row.advantage,
            logprobs=list(row.logprobs[:cut]), segment=0)
    b = Row(rollout_id=row.rollout_id, group_id=row.group_id, input_ids=list(row.input_ids),
            loss_mask=[0] * cut + list(row.loss_mask[cut:]), reward=row.reward, valid=row.valid,
            advantage=row.advantage, logprobs=[0.0] * cut + list(row.logprobs[cut:]), segment=1)
    return [a, b]
