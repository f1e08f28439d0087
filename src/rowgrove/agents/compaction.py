"""Compaction policies: pure functions that rewrite the context the model sees.

A context is `head + [note] + rounds`: the head is the system/user prompt, a round is one accepted
assistant message followed by its tool results. A rewrite changes messages the model already
saw, so the gateway's next call is a new root and the rollout becomes several rows. The policies
mirror real harnesses (see NeMo RL PR #4124): keep the last N tool rounds (BrowseComp agent's
`keep_rounds`), drop old reasoning every K actions (Gym's compaction client), collapse old
environment states (Aviary's `collapse_old_env_states`).

No policy ever edits an assistant message's content or tool calls: the model's own words are
only removed or, for reasoning, shortened by dropping `reasoning_content`, never rewritten.
"""

from __future__ import annotations

from typing import Any

Message = dict[str, Any]
Round = list[Message]

COLLAPSED = "[old state hidden]"


def omitted_note(k: int) -> Message:
    """The user note that stands for `k` dropped rounds."""
    return {"role": "user", "content": f"[{k} earlier rounds omitted]"}


def keep_last_rounds(rounds: list[Round], n: int) -> tuple[list[Round], int]:
    """(the last `n` rounds, how many were dropped)."""
    dropped = max(0, len(rounds) - n)
    return rounds[dropped:], dropped


def drop_reasoning(rounds: list[Round]) -> list[Round]:
    """Rounds with `reasoning_content` / `reasoning` removed from every assistant message."""
    return [[{k: v for k, v in m.items() if not (m["role"] == "assistant" and k in ("reasoning_content", "reasoning"))}
             for m in rnd] for rnd in rounds]


def collapse_env(rounds: list[Round]) -> list[Round]:
    """Rounds whose tool results, except the last round's, are replaced by one line (`COLLAPSED`)."""
    out = []
    for i, rnd in enumerate(rounds):
        last = i == len(rounds) - 1
        out.append([m if last or m["role"] != "tool" else {**m, "content": COLLAPSED} for m in rnd])
    return out


DROPPED_IMAGE = {"type": "text", "text": "[earlier screen dropped]"}


def keep_newest_images(messages: list[Message], n: int) -> list[Message]:
    """`messages` with every image part but the newest `n` replaced by `DROPPED_IMAGE` (messages
    without a dropped image are the same objects; no assistant message ever holds an image)."""
    where = [(i, k) for i, m in enumerate(messages) if isinstance(m.get("content"), list)
             for k, p in enumerate(m["content"]) if isinstance(p, dict) and p.get("type") == "image_url"]
    drop: dict[int, set[int]] = {}
    for i, k in where[: max(0, len(where) - n)]:
        drop.setdefault(i, set()).add(k)
    return [m if i not in drop else {**m, "content": [DROPPED_IMAGE if k in drop[i] else p
                                                      for k, p in enumerate(m["content"])]}
            for i, m in enumerate(messages)]


def render_context(head: list[Message], rounds: list[Round], omitted: int) -> list[Message]:
    """The message list sent to the model: head, the omitted-rounds note if any, the rounds."""
    return [*head, *([omitted_note(omitted)] if omitted else []), *(m for rnd in rounds for m in rnd)]


def compact(policy: str, rounds: list[Round], omitted: int, *, keep_rounds: int) -> tuple[list[Round], int]:
    """Apply `policy` to the context's rounds; (new rounds, total omitted rounds so far)."""
    if policy == "none":
        return rounds, omitted
    elif policy == "keep_last_rounds":
        kept, dropped = keep_last_rounds(rounds, keep_rounds)
        return kept, omitted + dropped
    elif policy == "drop_reasoning":
        return drop_reasoning(rounds), omitted
    elif policy == "collapse_env":
        return collapse_env(rounds), omitted
    elif policy == "keep_newest_image":  # applied to each context as it is sent (loop.run_episode)
        return rounds, omitted
    raise ValueError(f"unknown compaction {policy!r}")
