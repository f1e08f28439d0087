"""Prompts against the model's context (config.json max_position_embeddings, 131,072 for the tiny
models, room for a coding agent's real prompt): a prompt that fills it is refused with 400 before the ledger is touched; otherwise
max_tokens is capped to the room left, so no request ties up the engine with an impossible
generation."""

from __future__ import annotations

import httpx

from rowgrove.gateway.testing import start_gateway
from rowgrove.model.tiny import CONTEXT


def _chat(gw, ro, content, max_tokens=None):
    body = {"model": "m", "messages": [{"role": "user", "content": content}]}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return httpx.post(f"{ro['base_url']}/chat/completions", json=body,
                      headers={"authorization": f"Bearer {ro['api_key']}"}, timeout=120)


def test_a_prompt_longer_than_the_context_is_400_and_not_recorded():
    with start_gateway("tiny", engine="scripted") as gw:
        assert gw.gateway.max_context == CONTEXT == 131_072
        ro = gw.create_rollout("g")
        r = _chat(gw, ro, "word " * (CONTEXT + 1000))
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["code"] == "context_length_exceeded" and str(CONTEXT) in err["message"]
        assert gw.ledger.calls(ro["rollout_id"]) == []


def test_max_tokens_is_capped_to_the_room_left():
    with start_gateway("tiny", engine="scripted") as gw:
        ro = gw.create_rollout("g")
        seen = []
        real = gw.engine.generate

        async def spy(prompt_ids, sampling, *, hints=None):
            seen.append((len(prompt_ids), sampling.max_tokens))
            # the reply scored on the prompt's tail: a full pass over ~128k positions on a CPU takes
            # minutes, and what is checked here is the cap the gateway sent, not the scores
            return await real(prompt_ids[-64:], sampling, hints=hints)

        gw.engine.generate = spy
        r = _chat(gw, ro, "word " * (CONTEXT - 3000), max_tokens=4000)
        assert r.status_code == 200, r.text
        (prompt_len, max_tokens), = seen
        assert prompt_len + max_tokens == CONTEXT and max_tokens < 4000
        short = _chat(gw, ro, "hi", max_tokens=7)
        assert short.status_code == 200 and seen[-1][1] == 7
