"""Answering a vLLM /v1/completions request: the sampled pieces (pause, abort and faults
applied), then the JSON body (CS request_output_to_completion_response) or the server-sent event
stream (CS completion_stream_generator), with vLLM's logprobs (CS _create_completion_logprobs),
prompt logprobs, stop_reason (CP) and text as its detokenizer shows it. Short names (CP, CS) are
the sources listed in `rowgrove.standins.vllm`'s docstring; `CompletionOutput` is one part of
`VLLMStandin` there.
"""

from __future__ import annotations

import asyncio
import time
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.responses import Response

from rowgrove.standins.common import Send, StandinCut, WatchedResponse, sample_segments
from rowgrove.standins.vllm_request import ParsedCompletion, error_response


@dataclass
class Piece:
    token_ids: list[int]
    logprobs: list[float]
    tops: list[list[tuple[int, float]]] | None
    finish: str | None
    versions: list[int] = field(default_factory=list)


class _Text:
    """The output text as vLLM's detokenizer shows it: special tokens skipped or not, a matched
    stop string cut unless include_stop_str_in_output, text that may still become a stop string
    (or an incomplete UTF-8 character) held back until it is settled."""

    def __init__(self, tokenizer: Any, req: ParsedCompletion):
        self.tokenizer = tokenizer
        self.req = req
        self.sent = ""

    def visible(self, ids: list[int], finished: bool) -> str:
        text = self.tokenizer.decode(ids, skip_special_tokens=self.req.skip_special)
        if self.req.stop and not self.req.include_stop_str:
            hits = [text.find(s) for s in self.req.stop if s in text]
            if hits:
                return text[: min(hits)]
            if not finished:
                text = text[: max(0, len(text) - (max(len(s) for s in self.req.stop) - 1))]
        if not finished:
            text = text.rstrip("\ufffd")
        return text

    def delta(self, ids: list[int], finished: bool) -> str:
        now = self.visible(ids, finished)
        if not now.startswith(self.sent):
            return ""
        out, self.sent = now[len(self.sent):], now
        return out


class CompletionOutput:
    """Sampling and the answer's bodies, for `VLLMStandin` (which holds `engine`, `state`,
    `tokenizer`, `served`, `vocab_size`, `segment` and the `active` set)."""

    def prompt_logprobs_obj(self, req: ParsedCompletion) -> list[dict[str, Any] | None] | None:
        """CS's `prompt_logprobs`: None for the first prompt token, then per token a dict keyed by
        token id (as a string) of {logprob, rank, decoded_token}: the prompt token's own entry
        first, then the k best (raw log_softmax of one teacher-forced pass of the sampling model)."""
        if req.prompt_logprobs is None:
            return None
        import torch

        model = self.engine.model
        device = next(model.parameters()).device
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([req.prompt], device=device), use_cache=False).logits[0].float()
        logp_TV = torch.log_softmax(logits[:-1], dim=-1)
        out: list[dict[str, Any] | None] = [None]
        for row, tid in zip(logp_TV, req.prompt[1:], strict=True):
            lp = float(row[tid])
            entry = {str(tid): {"logprob": lp, "rank": int((row > row[tid]).sum()) + 1,
                                "decoded_token": self.tokenizer.decode([tid])}}
            if req.prompt_logprobs:
                vals, idx = torch.topk(row, min(req.prompt_logprobs, row.numel()))
                for rank, (v, t) in enumerate(zip(vals.tolist(), idx.tolist(), strict=True), start=1):
                    entry.setdefault(str(t), {"logprob": float(v), "rank": rank,
                                              "decoded_token": self.tokenizer.decode([t])})
            out.append(entry)
        return out

    # ---- sampling -------------------------------------------------------------------------

    async def pieces(self, req: ParsedCompletion, rid: str, entry: dict[str, Any], fault: str | None):
        """The request's sampled pieces, pause, abort and faults applied; logs into `entry`."""
        state = self.state
        if fault == "hang":
            while rid not in state.abort_requested:
                await asyncio.sleep(0.02)
        elif fault == "slow":
            await asyncio.sleep(state.delay)
        while state.paused and rid not in state.abort_requested:  # new requests wait out any pause
            await asyncio.sleep(0.01)
        if rid in state.abort_requested:
            yield Piece([], [], [] if req.logprobs else None, "abort")
            return
        self.active.add(rid)
        try:
            gen = sample_segments(self.engine, req.prompt, req.sampling, segment=self.segment)
            async with aclosing(gen):
                async for seg in gen:
                    n = len(seg.token_ids)
                    entry["token_ids"] += seg.token_ids
                    entry["logprobs"] += seg.logprobs
                    entry["weight_versions"] += [seg.version] * n
                    if seg.tops is not None:
                        entry["top_logprobs"] += [[list(p) for p in t] for t in seg.tops]
                    finish = "abort" if fault == "abort" else seg.finish_reason
                    yield Piece(seg.token_ids, seg.logprobs, seg.tops, finish, [seg.version] * n)
                    if finish is not None:
                        return
                    if state.segment_delay:
                        await asyncio.sleep(state.segment_delay)
                    while state.paused and state.pause_mode == "keep" and rid not in state.abort_requested:
                        await asyncio.sleep(0.01)  # frozen between pieces until /resume
                    if rid in state.abort_requested:
                        yield Piece([], [], [] if req.logprobs else None, "abort")
                        return
        finally:
            self.active.discard(rid)

    def stop_reason(self, req: ParsedCompletion, ids: list[int], finish: str | None) -> int | str | None:
        """CP stop_reason: the stop id or stop string that ended the turn; None for EOS or length."""
        if finish != "stop" or not ids:
            return None
        last = ids[-1]
        if last == self.tokenizer.eos_token_id:
            return None
        if last in req.stop_token_ids or last in getattr(self.engine, "stop_ids", ()):
            return int(last)
        text = self.tokenizer.decode(ids, skip_special_tokens=False)
        hits = sorted((text.find(s), s) for s in req.stop if s in text)
        return hits[0][1] if hits else None

    def logprobs_obj(self, req: ParsedCompletion, ids: list[int], lps: list[float],
                     tops: list[list[tuple[int, float]]] | None, offset: int) -> dict[str, Any] | None:
        """CS _create_completion_logprobs: per token its string (or "token_id:N"), its logprob
        (clamped at -9999), a dict of the sampled token first then the top `logprobs`
        alternatives (so logprobs + 1 entries, fewer when the sampled one is among them), and
        running text offsets."""
        if req.logprobs is None:
            return None

        def name(t: int) -> str:
            return f"token_id:{t}" if req.as_token_ids else self.tokenizer.decode([t])

        out: dict[str, list[Any]] = {"text_offset": [], "token_logprobs": [], "tokens": [], "top_logprobs": []}
        last_len = 0
        for j, (t, lp) in enumerate(zip(ids, lps, strict=False)):
            token = name(t)
            out["tokens"].append(token)
            out["token_logprobs"].append(max(lp, -9999.0))
            alt = {token: max(lp, -9999.0)}
            for a, v in (tops[j] if tops and j < len(tops) else [])[: req.logprobs]:
                alt.setdefault(name(a), max(v, -9999.0))
            out["top_logprobs"].append(alt)
            out["text_offset"].append(offset if j == 0 else out["text_offset"][-1] + last_len)
            last_len = len(token)
        return out

    def _finish_entry(self, entry: dict[str, Any], finish: str | None) -> None:
        entry["finish_reason"] = finish
        entry["status"] = "aborted" if finish == "abort" else "finished"

    async def whole(self, send: Send, handle: WatchedResponse, req: ParsedCompletion, rid: str,
                    entry: dict[str, Any], fault: str | None) -> None:
        """The non-streaming answer (CS request_output_to_completion_response)."""
        self.state.running[rid] = handle.task  # type: ignore[assignment]
        ids: list[int] = []
        lps: list[float] = []
        tops: list[list[tuple[int, float]]] = []
        finish = None
        try:
            async with aclosing(self.pieces(req, rid, entry, fault)) as pieces:
                async for p in pieces:
                    ids += p.token_ids
                    lps += p.logprobs
                    tops += p.tops or []
                    finish = p.finish
        except Exception as e:  # noqa: BLE001 - the sampling engine failed: a 500, as vLLM's GenerationError
            entry["status"] = "failed"
            await _send_all(send, handle, error_response(f"Internal server error: {type(e).__name__}: {e}", 500))
            return
        self._finish_entry(entry, finish)
        text = _Text(self.tokenizer, req).visible(ids, True)
        out_ids, logprobs = list(ids), self.logprobs_obj(req, ids, lps, tops, 0)
        if fault == "bad_id" and out_ids:
            out_ids[0] = self.vocab_size + 7
            _bad_token(req, logprobs, out_ids[0])
        if fault == "short_logprobs" and logprobs is not None:
            for k in logprobs:  # the tokens (the ids, when named by id) stay whole
                if k != "tokens":
                    logprobs[k] = logprobs[k][:-1]
        body = {
            "id": f"cmpl-{rid}", "object": "text_completion", "created": int(time.time()), "model": self.served,
            "choices": [{
                "index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish,
                "stop_reason": self.stop_reason(req, ids, finish),
                "token_ids": out_ids if req.return_token_ids else None,
                "prompt_logprobs": self.prompt_logprobs_obj(req),
                "prompt_token_ids": req.prompt if req.return_token_ids else None,
            }],
            "service_tier": None, "system_fingerprint": None,
            "usage": {"prompt_tokens": len(req.prompt), "total_tokens": len(req.prompt) + len(ids),
                      "completion_tokens": len(ids), "prompt_tokens_details": None},
            "kv_transfer_params": None,
            # vLLM 0.32 (CP CompletionResponse): encoder-cache transfer and per-request metrics
            "ec_transfer_params": None, "metrics": None,
        }
        raw = orjson.dumps(body)
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]
        if fault == "cut":
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": raw[: len(raw) // 2], "more_body": True})
            raise StandinCut(f"request {rid}: body cut")
        handle.mark_done()
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": raw, "more_body": False})

    async def stream(self, send: Send, handle: WatchedResponse, req: ParsedCompletion, rid: str,
                     entry: dict[str, Any], fault: str | None) -> None:
        """The server-sent event stream (CS completion_stream_generator): one choice per chunk,
        deltas of text/token_ids/logprobs, prompt_token_ids in the first chunk only, the last delta
        with finish_reason and stop_reason, a usage chunk with `choices: []` when asked, then
        `data: [DONE]`."""
        self.state.running[rid] = handle.task  # type: ignore[assignment]
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream; charset=utf-8")]})
        cid, created = f"cmpl-{rid}", int(time.time())
        text = _Text(self.tokenizer, req)
        ids: list[int] = []
        first = True
        finish = None
        try:
            async with aclosing(self.pieces(req, rid, entry, fault)) as pieces:
                async for p in pieces:
                    offset = len(text.sent)
                    ids += p.token_ids
                    finish = p.finish
                    delta_ids = list(p.token_ids)
                    logprobs = self.logprobs_obj(req, p.token_ids, p.logprobs, p.tops, offset)
                    chunk_finish = finish
                    if first and fault == "bad_id" and delta_ids:
                        delta_ids[0] = self.vocab_size + 7
                        _bad_token(req, logprobs, delta_ids[0])
                    if first and fault == "short_logprobs" and logprobs is not None:
                        for k in logprobs:  # the tokens (the ids, when named by id) stay whole
                            if k != "tokens":
                                logprobs[k] = logprobs[k][:-1]
                    if fault == "cut":
                        chunk_finish = None
                    choice = {
                        "index": 0, "text": text.delta(ids, finish is not None), "logprobs": logprobs,
                        "finish_reason": chunk_finish,
                        "stop_reason": self.stop_reason(req, ids, finish) if chunk_finish else None,
                        "prompt_token_ids": req.prompt if first and req.return_token_ids else None,
                        "token_ids": delta_ids if req.return_token_ids else None,
                    }
                    chunk = {"id": cid, "object": "text_completion", "created": created, "model": self.served,
                             "choices": [choice]}
                    if req.continuous_usage:  # CS dumps chunks with exclude_unset: no usage key otherwise
                        chunk["usage"] = {"prompt_tokens": len(req.prompt), "total_tokens": len(req.prompt) + len(ids),
                                          "completion_tokens": len(ids), "prompt_tokens_details": None}
                    await send({"type": "http.response.body", "body": _event(chunk), "more_body": True})
                    first = False
                    if fault == "cut":
                        raise StandinCut(f"request {rid}: stream cut")
        except StandinCut:
            raise
        except Exception as e:  # noqa: BLE001 - after the 200: an error event, then [DONE] (CS)
            entry["status"] = "failed"
            err = {"error": {"message": f"Internal server error: {type(e).__name__}: {e}",
                             "type": "InternalServerError", "param": None, "code": 500}}
            handle.mark_done()
            await send({"type": "http.response.body", "body": _event(err) + b"data: [DONE]\n\n", "more_body": False})
            return
        self._finish_entry(entry, finish)
        tail = b""
        if req.include_usage:  # dumped with exclude_none: no prompt_tokens_details
            tail += _event({"id": cid, "object": "text_completion", "created": created, "model": self.served,
                            "choices": [], "usage": {"prompt_tokens": len(req.prompt),
                                                     "total_tokens": len(req.prompt) + len(ids),
                                                     "completion_tokens": len(ids)}})
        handle.mark_done()
        await send({"type": "http.response.body", "body": tail + b"data: [DONE]\n\n", "more_body": False})


def _event(data: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(data) + b"\n\n"


async def _send_all(send: Send, handle: WatchedResponse, response: Response) -> None:
    handle.mark_done()
    await send({"type": "http.response.start", "status": response.status_code,
                "headers": response.raw_headers})
    await send({"type": "http.response.body", "body": response.body, "more_body": False})


def _bad_token(req: ParsedCompletion, logprobs: dict[str, Any] | None, bad: int) -> None:
    """The "bad_id" fault as a server that sampled `bad` would show it in its logprobs too: the
    first token named by that id (where tokens are named by id)."""
    if logprobs is not None and req.as_token_ids and logprobs["tokens"]:
        logprobs["tokens"][0] = f"token_id:{bad}"
