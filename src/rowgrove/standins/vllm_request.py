"""Reading a vLLM /v1/completions request: the JSON body checked field by field as vLLM's
`CompletionRequest` validators do (CP), into a `ParsedCompletion` with the engine's SamplingParams, or a
`Refusal` that `error_response` turns into vLLM's error body (EP ErrorResponse, status = code as
CR sends it). The stand-in refuses what it cannot honour with a 400 naming the field rather than
ignoring it. Short names (CP, CR, EP) are the sources listed in `rowgrove.standins.vllm`'s
docstring; `CompletionParsing` is one part of `VLLMStandin` there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from rowgrove.errors import InputError
from rowgrove.standins.common import json_response

MAX_LOGPROBS = 20                      # vLLM's --max-logprobs default
# EP ErrorResponse.error.type per status (vLLM itself sends 400/404/500; the rest come from proxies)
ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 429: "RateLimitError",
               500: "InternalServerError", 502: "BadGatewayError", 503: "ServiceUnavailableError"}
_INT64 = (-(2**63), 2**63 - 1)


class Refusal(Exception):
    def __init__(self, message: str, status: int = 400, param: str | None = None):
        super().__init__(message)
        self.status, self.param = status, param


def error_response(message: str, status: int = 400, param: str | None = None,
                   headers: dict[str, str] | None = None) -> Response:
    """EP ErrorResponse: {"error": {"message", "type", "param", "code"}}, status = code (CR)."""
    return json_response({"error": {"message": message, "type": ERROR_TYPES.get(status, "BadRequestError"),
                                    "param": param, "code": status}}, status, headers)


@dataclass
class ParsedCompletion:
    """One parsed /v1/completions request."""

    prompt: list[int]
    sampling: Any
    logprobs: int | None
    stream: bool
    include_usage: bool
    continuous_usage: bool
    return_token_ids: bool
    as_token_ids: bool
    skip_special: bool
    include_stop_str: bool
    stop: tuple[str, ...]
    stop_token_ids: tuple[int, ...]
    prompt_logprobs: int | None = None


class CompletionParsing:
    """`parse`, for `VLLMStandin` (which holds `served`, `tokenizer`, `vocab_size`, `max_model_len`)."""

    # ---- request parsing (CP CompletionRequest) ---------------------------------------------

    def parse(self, body: dict[str, Any]) -> ParsedCompletion:
        from rowgrove.engines.base import SamplingParams

        def get(name: str, kinds: tuple[type, ...], default: Any, what: str) -> Any:
            v = body.get(name, default)
            if v is None:
                return default
            if isinstance(v, bool) and bool not in kinds or not isinstance(v, kinds):
                raise Refusal(f"1 validation error for CompletionRequest: {name}: input should be {what}, "
                               f"got {v!r}", param=name)
            return v

        model = body.get("model")
        if model is not None and model != self.served:
            raise Refusal(f"The model `{model}` does not exist.", 404, "model")
        for name, off in (("n", 1), ("echo", False), ("use_beam_search", False), ("top_k", None),
                          ("min_p", 0.0), ("repetition_penalty", 1.0), ("frequency_penalty", 0.0),
                          ("presence_penalty", 0.0), ("ignore_eos", False), ("min_tokens", 0),
                          ("logit_bias", None), ("allowed_token_ids", None),
                          ("structured_outputs", None), ("prompt_embeds", None)):
            v = body.get(name)
            if v is None or v == off or (name == "top_k" and v in (0, -1)) or (name == "logit_bias" and v == {}):
                continue
            raise Refusal(f"the vLLM stand-in does not support {name}={v!r} (it samples with temperature "
                           "and top_p only): leave it unset", param=name)
        if body.get("suffix") is not None:
            raise Refusal("suffix is not currently supported", param="suffix")
        rf = body.get("response_format")
        if rf is not None and not (isinstance(rf, dict) and rf.get("type") == "text"):
            raise Refusal("the vLLM stand-in does not support response_format", param="response_format")

        prompt = body.get("prompt")
        if prompt is None or prompt == "" or prompt == []:
            raise Refusal("Either prompt or prompt_embeds must be provided and non-empty.", param="prompt")
        if isinstance(prompt, str):
            ids = list(self.tokenizer.encode(prompt, add_special_tokens=bool(body.get("add_special_tokens", True))))
        elif isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            ids = list(prompt)
        elif isinstance(prompt, list) and all(isinstance(p, list | str) for p in prompt):
            raise Refusal("the vLLM stand-in serves one prompt per request: send a list of ints", param="prompt")
        else:
            raise Refusal("1 validation error for CompletionRequest: prompt: input should be a list of ints, "
                           "a list of lists of ints, a string or a list of strings", param="prompt")
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise Refusal(f"Token id {max(bad)} is out of vocabulary")  # vLLM names no param here

        stream = bool(get("stream", (bool,), False, "a boolean"))
        stream_options = body.get("stream_options")
        if stream_options and not stream:  # CP validate_stream_options
            raise Refusal("Stream options can only be defined when `stream=True`.", param="stream_options")
        if stream_options is not None and not isinstance(stream_options, dict):
            raise Refusal("stream_options must be an object", param="stream_options")
        logprobs = get("logprobs", (int,), None, "an integer")
        if logprobs is not None and logprobs < 0:  # CP check_logprobs
            raise Refusal("`logprobs` must be a positive value.", param="logprobs")
        if logprobs is not None and logprobs > MAX_LOGPROBS:
            raise Refusal(f"Requested sample logprobs of {logprobs}, which is greater than max allowed: "
                           f"{MAX_LOGPROBS}", param="logprobs")
        max_tokens = get("max_tokens", (int,), 16 if "max_tokens" not in body else None, "an integer")
        room = self.max_model_len - len(ids)
        if max_tokens is None:
            if room < 1:
                raise Refusal(f"This model's maximum context length is {self.max_model_len} tokens. However, "
                               f"your request has {len(ids)} input tokens. Please reduce the length of the "
                               "input messages.", param="input_tokens")
            max_tokens = room
        if max_tokens < 1:
            raise Refusal(f"max_tokens must be at least 1, got {max_tokens}.", param="max_tokens")
        if len(ids) + max_tokens > self.max_model_len:  # wording of vllm/renderers/params.py (spec §4)
            raise Refusal(f"This model's maximum context length is {self.max_model_len} tokens. However, you "
                           f"requested {max_tokens} output tokens and your prompt contains {len(ids)} input "
                           f"tokens, for a total of {len(ids) + max_tokens} tokens. Please reduce the length of "
                           "the input prompt or the number of requested output tokens.", param="input_tokens")
        stop_raw = body.get("stop")
        if stop_raw is None:
            stop: tuple[str, ...] = ()
        elif isinstance(stop_raw, str):
            stop = (stop_raw,) if stop_raw else ()
        elif isinstance(stop_raw, list) and all(isinstance(s, str) for s in stop_raw):
            stop = tuple(s for s in stop_raw if s)
        else:
            raise Refusal("1 validation error for CompletionRequest: stop: input should be a string or a list "
                           "of strings", param="stop")
        stop_ids = get("stop_token_ids", (list,), [], "a list of integers")
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in stop_ids):
            raise Refusal("stop_token_ids must be a list of integers", param="stop_token_ids")
        seed = get("seed", (int,), None, "an integer")
        if seed is not None and not _INT64[0] <= seed <= _INT64[1]:
            raise Refusal("seed must fit in a signed 64-bit integer", param="seed")
        temperature = float(get("temperature", (int, float), 1.0, "a number"))  # no generation-config default in tiny
        top_p = float(get("top_p", (int, float), 1.0, "a number"))
        try:
            sampling = SamplingParams(temperature=temperature, top_p=top_p, max_tokens=max_tokens, stop=stop,
                                      stop_token_ids=tuple(stop_ids), seed=seed, top_logprobs=logprobs or 0)
        except InputError as e:
            raise Refusal(str(e)) from None
        prompt_lps = get("prompt_logprobs", (int,), None, "an integer")
        if prompt_lps is not None and (prompt_lps < -1 or prompt_lps > MAX_LOGPROBS):
            raise Refusal(f"`prompt_logprobs` must be between -1 and {MAX_LOGPROBS}", param="prompt_logprobs")
        if prompt_lps is not None and stream:
            raise Refusal("the vLLM stand-in answers prompt_logprobs only without stream: leave it unset "
                           "or set stream false", param="prompt_logprobs")
        opts = stream_options or {}
        return ParsedCompletion(
            prompt=ids, sampling=sampling, logprobs=logprobs, stream=stream,
            include_usage=stream and stream_options is not None and bool(opts.get("include_usage", True)),
            continuous_usage=stream and bool(opts.get("continuous_usage_stats", False)),
            return_token_ids=bool(get("return_token_ids", (bool,), False, "a boolean")),
            as_token_ids=bool(get("return_tokens_as_token_ids", (bool,), False, "a boolean")),
            skip_special=bool(get("skip_special_tokens", (bool,), True, "a boolean")),
            include_stop_str=bool(get("include_stop_str_in_output", (bool,), False, "a boolean")),
            stop=stop, stop_token_ids=tuple(stop_ids),
            prompt_logprobs=None if prompt_lps is None else (self.vocab_size if prompt_lps == -1 else prompt_lps),
        )


async def json_body(request: Request, detail: bool = False) -> dict[str, Any] | Response:
    raw = await request.body()
    try:
        body = orjson.loads(raw) if raw else {}
    except orjson.JSONDecodeError as e:
        return json_response({"detail": f"JSON decode error: {e}"}, 400) if detail else error_response(
            f"JSON decode error: {e}")
    if not isinstance(body, dict):
        return json_response({"detail": "Request body must be a JSON object"}, 400) if detail else error_response(
            "the request body must be a JSON object")
    return body
