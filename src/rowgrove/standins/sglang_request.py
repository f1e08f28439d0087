"""Reading an SGLang /generate body (`GenerateReqInput` [IO], `sampling_params` as SGLang's
`SamplingParams` [SP]) into a `GenerateRun`, refusing with SGLang's ValueError (a 400) what SGLang or the
stand-in refuses; and SGLang's error bodies (`native_error`, `http_error`, `bad_request` [HS-new,
HS-old]). Short names are the sources listed in `rowgrove.standins.sglang`'s docstring;
`GenerateParsing` is one part of the stand-in there.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from rowgrove.engines.base import SamplingParams
from rowgrove.errors import InputError
from rowgrove.standins.common import json_response

# SamplingParams' fields [SP]: any other key makes SGLang fail building the struct (a TypeError,
# not a ValueError, so a bare 500; inferred in the spec, §1).
SAMPLING_KEYS = frozenset({
    "max_new_tokens", "temperature", "top_p", "top_k", "min_p", "stop", "stop_token_ids", "stop_regex",
    "ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim", "min_new_tokens",
    "n", "frequency_penalty", "presence_penalty", "repetition_penalty", "json_schema", "regex", "ebnf",
    "structural_tag", "logit_bias", "custom_params", "stream_interval", "sampling_seed",
})
# options the stand-in cannot honour: each must be absent or hold its neutral value
NEUTRAL = {"top_k": (-1, None), "min_p": (0, 0.0, None), "frequency_penalty": (0, 0.0, None),
           "presence_penalty": (0, 0.0, None), "repetition_penalty": (1, 1.0, None),
           "min_new_tokens": (0, None), "n": (1, None), "ignore_eos": (False, None), "stop_regex": (None, [], ""),
           "json_schema": (None,), "regex": (None,), "ebnf": (None,), "structural_tag": (None,),
           "logit_bias": (None, {}), "custom_params": (None,)}


def native_error(message: str, status: int = 400) -> Response:
    """SGLang's native error: 400 {"error": {"message"}} (`_create_error_response`) [HS-old, HS-new]."""
    return json_response({"error": {"message": message}}, status)


def http_error(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    """FastAPI's HTTPException handler in SGLang: the OpenAI-style ErrorResponse [HS-new]."""
    return json_response({"object": "error", "message": message, "type": str(status), "param": None,
                          "code": status}, status, headers)


def bad_request(message: str) -> Response:
    """A request-validation error (422 remapped to 400) [HS-new]."""
    return json_response({"object": "error", "message": message, "type": "Bad Request", "param": None,
                          "code": 400}, 400)


@dataclass(eq=False)
class GenerateRun:
    """One /generate request: what has been sampled so far, and how it ended."""

    rid: str
    prompt: list[int]
    sampling: SamplingParams
    params: dict[str, Any]
    top_n: int
    return_text: bool
    fault: str | None
    started: float = field(default_factory=time.monotonic)
    ids: list[int] = field(default_factory=list)
    lps: list[float] = field(default_factory=list)
    tops: list[list[tuple[int, float]]] = field(default_factory=list)
    names: list[str] = field(default_factory=list)   # the weight version name of each token
    finish: dict[str, Any] | None = None
    error: str | None = None
    abort_message: str = "Aborted"
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    task: asyncio.Task | None = None
    logprob_start: int = -1                            # logprob_start_len
    images: list[Any] = field(default_factory=list)    # image_data decoded (rowgrove.media.Image), in order
    input_triples: list[list[Any]] | None = None       # prompt logprobs, when logprob_start >= 0


class UnknownKey(Exception):
    pass


class GenerateParsing:
    """`_parse`, for the stand-in (which holds `tokenizer`, `vocab_size`, `context_length`, `runs`)."""

    def _parse(self, obj: dict[str, Any], fault: str | None) -> GenerateRun:
        """The request as a GenerateRun; ValueError (SGLang's 400) for what SGLang or the stand-in refuses."""
        text, ids = obj.get("text"), obj.get("input_ids")
        if obj.get("input_embeds") is not None:
            raise ValueError("the stand-in does not take input_embeds")
        images = obj.get("image_data")
        if images is not None and (not isinstance(images, list) or not all(isinstance(u, str) and u for u in images)):
            raise ValueError("image_data must be a list of image URLs, paths or base64 data URLs")
        decoded = []
        if images:
            from rowgrove.media import MediaError, load_url

            try:  # the stand-in reads data URLs only (SGLang also fetches URLs and reads paths)
                decoded = [load_url(u) for u in images]
            except MediaError as e:
                raise ValueError(f"image_data: {e}") from None
        if (text is None) == (ids is None):
            raise ValueError("Either text, input_ids or input_embeds should be provided.")  # [IO]
        if ids is not None:
            if not isinstance(ids, list):
                raise ValueError("input_ids must be a list of ints")
            if not ids:
                raise ValueError("input_ids cannot be empty.")  # [IO]
            if not isinstance(ids[0], int):
                raise ValueError("the stand-in does not take batch requests")
            if any(not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < self.vocab_size for i in ids):
                raise ValueError(f"input_ids hold ids outside the vocabulary [0, {self.vocab_size})")
            prompt = list(ids)
        else:
            if not isinstance(text, str):
                raise ValueError("the stand-in does not take batch requests")
            prompt = list(self.tokenizer.encode(text))
        if len(prompt) >= self.context_length:
            raise ValueError(f"The input ({len(prompt)} tokens) is longer than the model's context length "
                             f"({self.context_length} tokens).")
        params = obj.get("sampling_params") or {}
        if not isinstance(params, dict):
            raise ValueError("the stand-in does not take batch requests (sampling_params is a list)")
        unknown = sorted(set(params) - SAMPLING_KEYS)
        if unknown:
            raise UnknownKey(unknown)
        for key, allowed in NEUTRAL.items():
            if key in params and params[key] not in allowed:
                raise ValueError(f"the stand-in cannot honour sampling_params.{key}={params[key]!r}")
        rid = obj.get("rid") if obj.get("rid") is not None else uuid.uuid4().hex
        if not isinstance(rid, str):
            raise ValueError("the stand-in does not take batch requests (rid is a list)")
        if rid in self.runs:
            raise ValueError(f"Duplicate request ID: {rid}")
        if obj.get("return_logprob") is not True:
            raise ValueError("the stand-in always needs return_logprob: true")
        start = obj.get("logprob_start_len", -1)
        start = -1 if start is None else start
        if not isinstance(start, int) or isinstance(start, bool) or start < -1:
            raise ValueError(f"logprob_start_len must be an integer >= -1, got {start!r}")
        top_n = obj.get("top_logprobs_num") or 0
        stop = params.get("stop")
        stop = [] if stop is None else [stop] if isinstance(stop, str) else list(stop)
        temperature = params.get("temperature")
        temperature = 1.0 if temperature is None else float(temperature)
        if 0 <= temperature < 1e-6:
            temperature = 0.0  # greedy [SP]
        max_new = params.get("max_new_tokens")
        max_new = 128 if max_new is None else max_new  # [SP] default
        seed = params.get("sampling_seed")
        try:
            sampling = SamplingParams(
                temperature=temperature,
                top_p=1.0 if params.get("top_p") is None else float(params["top_p"]),
                max_tokens=int(max_new),
                stop=tuple(stop),
                stop_token_ids=tuple(int(i) for i in params.get("stop_token_ids") or ()),
                seed=None if seed is None else int(seed),
                top_logprobs=int(top_n),
            )
        except InputError as e:
            raise ValueError(str(e)) from None
        return GenerateRun(rid=rid, prompt=prompt, sampling=sampling, params=params, top_n=int(top_n),
                    return_text=bool(obj.get("return_text_in_logprobs")), fault=fault, logprob_start=start,
                    images=decoded)


async def json_body(request: Request, *, strict: bool = True, kind: str = "") -> dict[str, Any] | Response:
    """The JSON object body; the OpenAI-style routes (`strict`) also need the JSON content type
    [HS-new `validate_json_request`]. `kind`: the body's type, named when it is not an object."""
    if strict and "application/json" not in request.headers.get("content-type", ""):
        return bad_request("Unsupported Media Type: Only 'application/json' is allowed")
    try:
        obj = await request.json()
    except ValueError:
        return bad_request("the body is not JSON")
    if not isinstance(obj, dict):
        return bad_request(f"the body must be a JSON object{f' ({kind})' if kind else ''}")
    return obj
