"""The `hf` engine: local transformers generation on CPU or GPU with continuous batching.

    generate() ──> pending queue ──> worker thread (all torch work, off the event loop)
                                      each step: 1. decode one token for the running rows (KV cache)
                                                 2. prefill newly admitted rows (left-padded), merge
                                                    their KV cache into the running one
                                                 3. sample every row with its own temperature,
                                                    top_p and torch.Generator; finish/prune rows
                  future resolved <── call_soon_threadsafe

Concurrent requests are batched: a request joins the running batch at the next step and leaves
it as soon as it finishes or its awaiting coroutine is cancelled (client disconnect).

What the numbers mean:
- `Generation.logprobs[i]` is log_softmax of the model's raw logits (temperature 1, no top-p) at
  the sampled token: the quantity a PPO/GRPO ratio compares against the trainer's policy
  logprob. It is not the logprob under the tempered/truncated sampling distribution.
- temperature 0 is greedy (argmax, ties to the lowest id). Otherwise a token is drawn by inverse
  CDF with one uniform from the request's own `torch.Generator` per step (seeded from
  `SamplingParams.seed`, else from the OS): a seeded request gives the same tokens whatever else
  is in the batch (up to float rounding of batched matmuls, which moves a draw only when it lands
  within ~1e-7 of a CDF boundary).
- Stop strings: after each token the last few tokens are decoded; the first token whose decoded
  tail contains a stop string ends the turn and is kept (so `token_ids` may run past the stop
  string inside that token; the gateway trims text, never ids). The end-of-turn id and
  `stop_token_ids` end the turn too and are kept. max_tokens reached → "length".

Weights: `update_weights(state_dict)` blocks until applied. It is applied when no row is running
(admission pauses while an update waits), so every generation comes from a single weight version;
`weights_version` counts updates, and `Generation.weight_versions` carries it on every token.

Supports models whose cache is transformers' DynamicCache of full-attention layers (Llama, Qwen2,
Qwen3, Mistral without sliding window, ...).
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from rowgrove.engines.base import Generation, SamplingParams, StopChecker, check_prompt
from rowgrove.errors import EngineError, InputError
from rowgrove.model.load import end_of_turn_id, stop_token_ids

_OS_RANDOM = random.SystemRandom()


@dataclass(eq=False)
class _Request:
    prompt: list[int]
    sampling: SamplingParams
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    cancelled: threading.Event = field(default_factory=threading.Event)
    generator: torch.Generator | None = None
    stop_checker: StopChecker | None = None
    stop_ids: frozenset[int] = frozenset()
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    tops: list[list[tuple[int, float]]] | None = None
    pixels: dict[str, Any] | None = None  # a vision model's pixel_values / image_grid_thw

    def resolve(self, result: Generation | None = None, error: BaseException | None = None) -> None:
        """Hand the result (or error) to the awaiting coroutine, from any thread."""
        def _set() -> None:
            if self.future.done():
                return
            if error is not None:
                self.future.set_exception(error)
            else:
                self.future.set_result(result)
        try:
            self.loop.call_soon_threadsafe(_set)
        except RuntimeError:  # the caller's loop is closed: nobody is waiting any more
            pass


@dataclass(eq=False)
class _WeightUpdate:
    state_dict: Mapping[str, torch.Tensor]
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None


class HFEngine:
    """Continuous-batching transformers engine (see the module docstring for the guarantees).

    max_batch: most rows decoded together. threads: if set, `torch.set_num_threads(threads)` in
    the worker (torch's intra-op pool is process-wide, so this affects the whole process).
    `step_batch_sizes` records the number of rows of each decode step (most recent 10,000).
    """

    def __init__(self, model: Any, tokenizer: Any, *, max_batch: int = 32, threads: int | None = None):
        if max_batch < 1:
            raise InputError(f"max_batch must be >= 1, got {max_batch}")
        self.model = model
        self.tokenizer = tokenizer
        self.eot_id = end_of_turn_id(tokenizer)
        self.stop_ids = frozenset(stop_token_ids(tokenizer))
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eot_id
        self.vocab_size = int(model.get_input_embeddings().weight.shape[0])
        self.device = next(model.parameters()).device
        self.max_batch = max_batch
        self.threads = threads
        self.weights_version = 0
        self.step_batch_sizes: deque[int] = deque(maxlen=10_000)
        self._cond = threading.Condition()
        self._pending: deque[_Request] = deque()
        self._updates: deque[_WeightUpdate] = deque()
        self._closed = False
        from rowgrove.model.vision import vision_of

        # a vision model (Qwen2-VL): 3-D rotary positions set by each prompt's images, so its
        # requests run one at a time (`_run_alone`) instead of in the left-padded batch
        self.vision = vision_of(tokenizer)
        self._thread = threading.Thread(target=self._worker, name="rowgrove-hf-engine", daemon=True)
        self._thread.start()

    # ---- public API -------------------------------------------------------------------------

    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams, *,
                       hints: Mapping[str, Any] | None = None) -> Generation:
        """Sample a turn after `prompt_ids`. `hints` are accepted and ignored (the scripted
        engine uses them). Cancelling the awaiting task drops the request at the next step."""
        prompt = check_prompt(prompt_ids, self.vocab_size)
        loop = asyncio.get_running_loop()
        gen = torch.Generator(device=self.device)
        gen.manual_seed(sampling.seed if sampling.seed is not None else _OS_RANDOM.getrandbits(63))
        req = _Request(prompt=prompt, sampling=sampling, future=loop.create_future(), loop=loop, generator=gen,
                       stop_checker=StopChecker(self.tokenizer, sampling.stop),
                       stop_ids=frozenset(sampling.stop_token_ids) | self.stop_ids,
                       tops=[] if sampling.top_logprobs else None)
        images = (hints or {}).get("images") or ()
        if images:
            if self.vision is None:
                raise InputError("this model takes no images: serve a vision model (e.g. --model tiny-vl)")
            req.pixels = self.vision.pixel_inputs(images)
        with self._cond:
            if self._closed:
                raise EngineError("hf engine is closed: create a new one")
            self._pending.append(req)
            self._cond.notify()
        try:
            return await req.future
        except asyncio.CancelledError:
            req.cancelled.set()
            raise

    def update_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Load `state_dict` (names as in `model.state_dict()`, a subset allowed) into the model
        once no row is running; blocks until applied. Call it from a thread (e.g.
        `asyncio.to_thread`) when an event loop in this thread serves requests."""
        known = set(self.model.state_dict())
        unknown = [k for k in state_dict if k not in known]
        if unknown:
            raise InputError(f"update_weights: {len(unknown)} names not in the model ({', '.join(unknown[:5])}): "
                             "pass names from model.state_dict()")
        upd = _WeightUpdate(state_dict)
        with self._cond:
            if self._closed:
                raise EngineError("hf engine is closed: create a new one")
            self._updates.append(upd)
            self._cond.notify()
        upd.done.wait()
        if upd.error is not None:
            raise EngineError(f"update_weights failed: {upd.error}") from upd.error

    async def aclose(self) -> None:
        """Stop the worker; requests still waiting or running fail with EngineError."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        await asyncio.to_thread(self._thread.join)

    # ---- worker -----------------------------------------------------------------------------

    def _worker(self) -> None:
        if self.threads:
            torch.set_num_threads(self.threads)
        active: list[_Request] = []
        state: dict[str, Any] = {}
        while True:
            with self._cond:
                while not self._closed and not active and not self._pending and not self._updates:
                    self._cond.wait()
                if self._closed:
                    break
                if not active:
                    while self._updates:
                        self._apply(self._updates.popleft())
                admitted: list[_Request] = []
                if not self._updates:  # an update waits: let running rows drain, admit nobody
                    while self._pending and len(active) + len(admitted) < self.max_batch:
                        req = self._pending.popleft()
                        if not req.cancelled.is_set():
                            admitted.append(req)
            if not active and not admitted:
                continue
            if self.vision is not None:
                for req in admitted:
                    try:
                        self._run_alone(req)
                    except Exception as e:  # noqa: BLE001 - reaches the caller as EngineError
                        req.resolve(error=EngineError(f"hf engine step failed: {type(e).__name__}: {e}"))
                continue
            try:
                active = self._step(active, admitted, state)
            except Exception as e:  # noqa: BLE001 - every failure reaches the callers as EngineError
                err = EngineError(f"hf engine step failed: {type(e).__name__}: {e}")
                for req in active + admitted:
                    req.resolve(error=err)
                active, state = [], {}
        err = EngineError("hf engine closed while the request was waiting or running")
        with self._cond:
            leftovers = list(self._pending) + active
            self._pending.clear()
            for upd in self._updates:
                upd.error = err
                upd.done.set()
            self._updates.clear()
        for req in leftovers:
            req.resolve(error=err)

    def _apply(self, upd: _WeightUpdate) -> None:
        try:
            with torch.no_grad():
                params = self.model.state_dict()
                for name, value in upd.state_dict.items():
                    params[name].copy_(value.to(device=params[name].device, dtype=params[name].dtype))
            self.weights_version += 1
        except Exception as e:  # noqa: BLE001 - handed back to the caller of update_weights
            upd.error = e
        upd.done.set()

    @torch.no_grad()
    def _step(self, active: list[_Request], admitted: list[_Request], state: dict[str, Any]) -> list[_Request]:
        """One decode step for `active` plus prefill for `admitted`; returns the rows still running.

        state: "cache" (DynamicCache, rows in `active` order), "mask" (B, S) attention mask.
        """
        from transformers import DynamicCache

        logits_parts = []
        if active:
            last = torch.tensor([[r.token_ids[-1]] for r in active], device=self.device)
            mask = torch.cat([state["mask"], state["mask"].new_ones(len(active), 1)], dim=1)
            pos = mask.sum(dim=1, keepdim=True) - 1
            out = self.model(input_ids=last, attention_mask=mask, position_ids=pos,
                             past_key_values=state["cache"], use_cache=True)
            state["mask"] = mask
            logits_parts.append(out.logits[:, -1, :])
        if admitted:
            width = max(len(r.prompt) for r in admitted)
            ids = torch.full((len(admitted), width), self.pad_id, dtype=torch.long)
            new_mask = torch.zeros((len(admitted), width), dtype=torch.long)
            for i, r in enumerate(admitted):
                ids[i, width - len(r.prompt):] = torch.tensor(r.prompt)
                new_mask[i, width - len(r.prompt):] = 1
            ids, new_mask = ids.to(self.device), new_mask.to(self.device)
            pos = (new_mask.cumsum(dim=1) - 1).clamp(min=0)
            cache = DynamicCache()
            out = self.model(input_ids=ids, attention_mask=new_mask, position_ids=pos,
                             past_key_values=cache, use_cache=True, logits_to_keep=1)
            logits_parts.append(out.logits[:, -1, :])
            if active:
                state["cache"], state["mask"] = _merge(state["cache"], state["mask"], cache, new_mask)
            else:
                state["cache"], state["mask"] = cache, new_mask
        rows = active + admitted
        self.step_batch_sizes.append(len(rows))
        logits = torch.cat(logits_parts, dim=0).float()
        tokens, logp = self._sample(rows, logits)
        keep: list[int] = []
        max_top = max(r.sampling.top_logprobs for r in rows)
        top_vals, top_idx = logp.topk(max_top, dim=-1) if max_top else (None, None)
        chosen = logp.gather(1, tokens[:, None])[:, 0].tolist()
        for i, (r, tok, lp) in enumerate(zip(rows, tokens.tolist(), chosen, strict=True)):
            r.token_ids.append(tok)
            r.logprobs.append(lp)
            if r.tops is not None:
                k = r.sampling.top_logprobs
                r.tops.append([(int(t), float(v)) for t, v in zip(top_idx[i, :k].tolist(), top_vals[i, :k].tolist(), strict=True)])
            if not self._resolve_if_done(r, tok) and not r.cancelled.is_set():
                keep.append(i)
        if len(keep) < len(rows):
            if keep:
                idx = torch.tensor(keep, device=self.device)
                state["cache"].batch_select_indices(idx)
                state["mask"] = state["mask"][idx]
            else:
                state.clear()
        return [rows[i] for i in keep]

    def _resolve_if_done(self, r: _Request, tok: int) -> bool:
        """Answer `r` if `tok` (just appended) ends it: a stop id or stop string, or max_tokens."""
        if tok in r.stop_ids or r.stop_checker.hit(r.token_ids):
            finish = "stop"
        elif len(r.token_ids) >= r.sampling.max_tokens:
            finish = "length"
        else:
            return False
        # updates apply only while no row runs, so one version sampled every token of it
        r.resolve(Generation(token_ids=r.token_ids, logprobs=r.logprobs, finish_reason=finish,
                             top_logprobs=r.tops, weight_versions=[self.weights_version] * len(r.token_ids)))
        return True

    @torch.no_grad()
    def _run_alone(self, r: _Request) -> None:
        """Generate one request of a vision model to its end: a prefill with its images (the model
        sets its 3-D positions from `image_grid_thw`), then one token per step on the KV cache.
        Sampling, logprobs and stopping are those of `_step`."""
        from transformers import DynamicCache

        ids = torch.tensor([r.prompt], device=self.device)
        from rowgrove.model.vision import model_kwargs

        extra = model_kwargs(ids, r.pixels)
        cache = DynamicCache()
        out = self.model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1, **extra)
        while True:
            self.step_batch_sizes.append(1)
            tokens, logp = self._sample([r], out.logits[:, -1, :].float())
            tok = int(tokens[0])
            r.token_ids.append(tok)
            r.logprobs.append(float(logp[0, tok]))
            if r.tops is not None:
                vals, idx = logp[0].topk(r.sampling.top_logprobs)
                r.tops.append([(int(t), float(v)) for t, v in zip(idx.tolist(), vals.tolist(), strict=True)])
            if self._resolve_if_done(r, tok):
                return
            if r.cancelled.is_set():
                return
            out = self.model(input_ids=tokens[:, None], past_key_values=cache, use_cache=True)

    def _sample(self, rows: list[_Request], logits_BV: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(sampled id per row, raw log-softmax B×V). Per row: greedy at temperature 0, else
        inverse-CDF on the tempered, top-p-truncated distribution with one uniform draw from the
        row's own generator."""
        logp_BV = torch.log_softmax(logits_BV, dim=-1)
        greedy = logits_BV.argmax(dim=-1)
        sampled_rows = [i for i, r in enumerate(rows) if r.sampling.temperature > 0]
        if not sampled_rows:
            return greedy, logp_BV
        sel = torch.tensor(sampled_rows, device=self.device)
        temps = torch.tensor([rows[i].sampling.temperature for i in sampled_rows], device=self.device)
        top_p = torch.tensor([rows[i].sampling.top_p for i in sampled_rows], device=self.device)
        probs = torch.softmax(logits_BV[sel] / temps[:, None], dim=-1)
        sorted_p, order = probs.sort(dim=-1, descending=True, stable=True)
        before = sorted_p.cumsum(dim=-1) - sorted_p
        sorted_p = sorted_p.masked_fill(before >= top_p[:, None], 0.0)  # the top token always stays
        cdf = sorted_p.cumsum(dim=-1)
        u = torch.cat([torch.rand(1, generator=rows[i].generator, device=self.device) for i in sampled_rows])
        pos = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None]).clamp(max=cdf.shape[1] - 1)
        greedy[sel] = order.gather(1, pos)[:, 0]
        return greedy, logp_BV


def _merge(cache: Any, mask: torch.Tensor, new_cache: Any, new_mask: torch.Tensor) -> tuple[Any, torch.Tensor]:
    """Stack two left-padded KV caches along the batch: the shorter is padded on the left (with
    mask 0) so both reach the same length."""
    s_old, s_new = mask.shape[1], new_mask.shape[1]
    width = max(s_old, s_new)
    for layer, new_layer in zip(cache.layers, new_cache.layers, strict=True):
        layer.keys = torch.cat([F.pad(layer.keys, (0, 0, width - s_old, 0)), F.pad(new_layer.keys, (0, 0, width - s_new, 0))])
        layer.values = torch.cat([F.pad(layer.values, (0, 0, width - s_old, 0)), F.pad(new_layer.values, (0, 0, width - s_new, 0))])
    merged_mask = torch.cat([F.pad(mask, (width - s_old, 0)), F.pad(new_mask, (width - s_new, 0))])
    return cache, merged_mask
