"""The engine protocol (prompt token ids in; sampled token ids, their logprobs and a finish reason
out) and the small pieces every engine shares: sampling parameters, the stop-string check and
teacher-forced logprobs.

Token exactness starts here: `Generation.token_ids` are the ids the engine sampled, in order,
including the end-of-turn / stop token that ended the turn; `logprobs[i]` is the model's log-
probability of `token_ids[i]` under its raw distribution (temperature 1, before top-p). The
gateway stores these ids and never re-encodes their text.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from numbers import Integral, Real
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from rowgrove.errors import EngineError, InputError

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerFast


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one request.

    temperature: 0 means greedy. top_p: nucleus mass kept (1 = all). max_tokens: most tokens
    sampled (the end-of-turn token counts). stop: strings that end the turn once the decoded
    output contains one (the completing token is kept). stop_token_ids: ids that end the turn
    besides the end-of-turn id (kept too). seed: per-request seed; the same seed gives the same
    sample whatever else is batched with it. top_logprobs: how many alternatives to report per
    position (0 = none).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    top_logprobs: int = 0

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise InputError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise InputError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_tokens < 1:
            raise InputError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if not 0 <= self.top_logprobs <= 20:
            raise InputError(f"top_logprobs must be in [0, 20], got {self.top_logprobs}")
        if any(not s for s in self.stop):
            raise InputError("stop strings must be non-empty")


@dataclass
class Generation:
    """What an engine sampled for one request. `finish_reason` is "stop" (end-of-turn, a stop id
    or a stop string ended it; the ending token is the last of `token_ids`) or "length"
    (max_tokens reached). `top_logprobs[i]` lists (id, logprob) alternatives, best first.
    `weight_versions[i]` is the weight version (>= 0, the engine's `weights_version`) that
    sampled `token_ids[i]`; None when the engine reports none (the gateway then stamps every
    token with the version it read just before asking)."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    top_logprobs: list[list[tuple[int, float]]] | None = None
    weight_versions: list[int] | None = None


@runtime_checkable
class Engine(Protocol):
    """An inference engine. `generate` must not block the event loop; cancelling the awaiting
    task drops the request. Failures raise `rowgrove.errors.EngineError`."""

    tokenizer: PreTrainedTokenizerFast

    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams, *,
                       hints: Mapping[str, Any] | None = None) -> Generation: ...

    async def aclose(self) -> None: ...


class StopChecker:
    """Decides, token by token, whether a stop string has appeared in the decoded output.

    Only the last few tokens are decoded at each step (enough to hold the longest stop string:
    every byte-level token decodes to at least one byte), so the cost does not grow with output
    length. Stops at the first token whose addition makes the decoded tail contain a stop string.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerFast, stop: Sequence[str]):
        self.tokenizer = tokenizer
        self.stop = tuple(stop)
        self.window = max((len(s.encode()) for s in self.stop), default=0) + 1

    def hit(self, token_ids: Sequence[int]) -> bool:
        """True when the output `token_ids` (so far) contains a stop string."""
        if not self.stop:
            return False
        tail = self.tokenizer.decode(list(token_ids[-self.window:]), skip_special_tokens=False)
        return any(s in tail for s in self.stop)


class ExtendedIds(Sequence[int]):
    """A continuation's prompt ids (Python ints): the list or `ExtendedIds` `base` (the parent's
    prompt), then what follows it (the parent's sampled ids, the new part), held as the parts
    they are, never joined (`RolloutIndex.extended`). Read like the list they make (`len`, an
    index, a slice, iteration, ==, +).

    A long rollout's prompt is 51k ids at call 200: joining it cost a pass over 51k int objects
    per call (a reference count written on each) and another when the joined list was freed, and
    those passes evicted everything else the call touched from the cache. An engine that checked
    `base` as the rollout's last prompt checks only what follows it and reuses its JSON
    (`RemoteEngine.checked_prompt`, `prompt_json`), so the prompt is never joined on the way to
    vLLM or SGLang. Nothing mutates a part (they are shared with the rollout's index)."""

    __slots__ = ("base", "ends", "parts")

    def __init__(self, base: Sequence[int], *rest: Sequence[int]):
        new: list[int] = []
        for r in rest:
            new.extend(r)
        self.base = base
        if type(base) is ExtendedIds:
            self.parts, self.ends = [*base.parts, new], [*base.ends, base.ends[-1] + len(new)]
        else:
            self.parts, self.ends = [base, new], [len(base), len(base) + len(new)]

    def __len__(self) -> int:
        return self.ends[-1]

    def __iter__(self) -> Iterator[int]:
        return itertools.chain.from_iterable(self.parts)

    def __getitem__(self, k: Any) -> Any:
        if isinstance(k, slice):
            a, b, step = k.indices(len(self))
            if step != 1:
                return self.tolist()[k]
            out: list[int] = []
            i = bisect.bisect_right(self.ends, a)
            while a < b and i < len(self.parts):
                start = self.ends[i] - len(self.parts[i])
                out.extend(self.parts[i][a - start: min(b, self.ends[i]) - start])
                a = self.ends[i]
                i += 1
            return out
        n = len(self)
        if k < 0:
            k += n
        if not 0 <= k < n:
            raise IndexError("ExtendedIds index out of range")
        i = bisect.bisect_right(self.ends, k)
        return self.parts[i][k - (self.ends[i] - len(self.parts[i]))]

    def tolist(self) -> list[int]:
        """The ids as one list (a copy)."""
        return list(itertools.chain.from_iterable(self.parts))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ExtendedIds | list | tuple):
            return len(self) == len(other) and self.tolist() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __add__(self, other: Sequence[int]) -> list[int]:
        return self.tolist() + list(other)

    def __radd__(self, other: Sequence[int]) -> list[int]:
        return list(other) + self.tolist()

    def __repr__(self) -> str:
        return f"ExtendedIds({self.tolist()!r})"


def as_list(ids: Sequence[int]) -> list[int]:
    """`ids` as a list: itself when it is one (no copy)."""
    return ids if type(ids) is list else list(ids)


def of_type(items: Sequence[Any], cls: type) -> bool:
    """Whether every item of `items` is a `cls` itself (no subclass: for int, not a bool or a
    numpy integer), read at C speed."""
    return {cls}.issuperset(map(type, items))


def plain_ints(ids: Sequence[Any]) -> bool:
    """`of_type(ids, int)`."""
    return of_type(ids, int)


def check_prompt(prompt_ids: Sequence[int], vocab_size: int) -> list[int]:
    """The prompt as a new list of ints; InputError if it is empty or holds an id outside the vocab.
    A list of plain ints (what a tokenizer gives) is copied and bounded at C speed, not converted
    id by id."""
    ids = prompt_ids.copy() if type(prompt_ids) is list and plain_ints(prompt_ids) else [int(i) for i in prompt_ids]
    if not ids:
        raise InputError("prompt_ids is empty: render at least one message with the chat template")
    if min(ids) < 0 or max(ids) >= vocab_size:
        bad = [i for i in ids if not 0 <= i < vocab_size]
        raise InputError(f"prompt_ids hold {len(bad)} ids outside the vocabulary [0, {vocab_size}): {bad[:5]}")
    return ids


def _is_id(t: Any, vocab_size: int) -> bool:
    if type(t) is int:  # the usual case, checked first
        return 0 <= t < vocab_size
    return isinstance(t, Integral) and not isinstance(t, bool) and 0 <= t < vocab_size


def _is_logprob(x: Any) -> bool:
    if type(x) is not float:
        if isinstance(x, bool) or not isinstance(x, Real):
            return False
        x = float(x)
    return math.isfinite(x) and x <= 1e-3


def check_generation(gen: Generation, vocab_size: int, where: str, *, versions: bool = True) -> None:
    """EngineError unless every id is an int in the vocabulary [0, vocab_size), there is one
    finite logprob <= 0 (a little rounding above 0 allowed) and, when given (and `versions`), one
    weight version per id, and the finish reason is "stop" or "length": a reply that breaks this
    is an engine fault, never a stored call. The gateway runs it on every engine's answer before
    storing it (and checks the versions itself, `sessions.call_weight_versions`)."""
    ids, lps = gen.token_ids, gen.logprobs
    n = len(ids)
    # plain ints and floats (what engines give) are bounded at C speed; anything else id by id
    if not (type(ids) is list and plain_ints(ids) and (not ids or (min(ids) >= 0 and max(ids) < vocab_size))):
        bad = [t for t in ids if not _is_id(t, vocab_size)]
        if bad:
            raise EngineError(f"{where} returned {len(bad)} token ids outside the vocabulary [0, {vocab_size}): "
                              f"{bad[:5]}: is it serving another model?")
    if len(lps) != n:
        raise EngineError(f"{where} returned {n} token ids but {len(lps)} logprobs: "
                          "an engine fault, the call is not stored")
    # a finite sum has no NaN or infinity in it (a sum that overflows is read value by value)
    if not (type(lps) is list and of_type(lps, float)
            and (not lps or (math.isfinite(sum(lps)) and max(lps) <= 1e-3))):
        wrong = [x for x in lps if not _is_logprob(x)]
    else:
        wrong = []
    if wrong:
        raise EngineError(f"{where} returned {len(wrong)} logprobs that are not a number <= 0 (NaN, "
                          f"infinite or positive: {wrong[:3]}): an engine fault, the call is not stored")
    if versions and gen.weight_versions is not None and len(gen.weight_versions) != n:
        raise EngineError(f"{where} returned {n} token ids but {len(gen.weight_versions)} weight versions")
    if gen.finish_reason not in ("stop", "length"):
        raise EngineError(f"{where} ended the request with finish reason {gen.finish_reason!r}: "
                          "retry the call")


def top_k_pairs(logp_V: torch.Tensor, k: int) -> list[tuple[int, float]]:
    """The k most likely (id, logprob) pairs of one log-distribution, best first."""
    vals, idx = logp_V.topk(k)
    return [(int(i), float(v)) for i, v in zip(idx.tolist(), vals.tolist(), strict=True)]


def teacher_forced_logprobs(model: Any, prompt_ids: Sequence[int], token_ids: Sequence[int],
                            top_logprobs: int = 0, *, vision_inputs: Mapping[str, Any] | None = None,
                            ) -> tuple[list[float], list[list[tuple[int, float]]] | None]:
    """Log-probabilities of `token_ids` following `prompt_ids` under `model` (raw distribution,
    temperature 1), from one forward pass without gradients; plus top alternatives if asked.
    `vision_inputs`: a vision model's `pixel_values` / `image_grid_thw` for the prompt's images."""
    import torch

    if not token_ids:
        return [], ([] if top_logprobs else None)
    device = next(model.parameters()).device
    ids = torch.tensor([list(prompt_ids) + list(token_ids)], device=device)
    with torch.no_grad():
        from rowgrove.model.vision import model_kwargs

        extra = model_kwargs(ids, vision_inputs)
        logits = model(input_ids=ids, use_cache=False, **extra).logits[0].float()
    p = len(prompt_ids)
    logp_TV = torch.log_softmax(logits[p - 1: p - 1 + len(token_ids)], dim=-1)
    target = torch.tensor(list(token_ids), device=device)
    lp = logp_TV.gather(1, target[:, None])[:, 0].tolist()
    tops = [top_k_pairs(row, top_logprobs) for row in logp_TV] if top_logprobs else None
    return lp, tops
