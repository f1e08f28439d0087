"""The vLLM stand-in (`rowgrove.standins.vllm`, what most engine tests run against) answers in the
same wire shapes as a real `vllm serve` on every route both speak: the same JSON keys, value
types and nesting (not the same values: the two sample differently). Each case sends one body to
both, the same model folder behind each.

A shape: a dict maps its keys to their shapes, a list is the set of its items' shapes, a number
is "int" or "float", a string "str", null "null". Where a real server's field may be null or a
number depending on the request, the case's request fixes which.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from rowgrove.standins import start_standin


# dicts keyed by data (a token's text or id), not by field names: their values' shapes only
MAPS = {"top_logprobs", "prompt_logprobs"}


def shape(x: Any, mapping: bool = False) -> Any:
    if isinstance(x, dict) and mapping:
        return ["map", *sorted({json.dumps(shape(v), sort_keys=True) for v in x.values()})]
    if isinstance(x, dict):
        return {k: shape(v, k in MAPS) for k, v in sorted(x.items())}
    if isinstance(x, list) and mapping:
        return ["list", *sorted({json.dumps(shape(v, True), sort_keys=True) for v in x})]
    if isinstance(x, list):
        items = {json.dumps(shape(v), sort_keys=True) for v in x}
        return ["list", *sorted(items)]
    if isinstance(x, bool):
        return "bool"
    if isinstance(x, int):
        return "int"
    if isinstance(x, float):
        return "float"
    if isinstance(x, str):
        return "str"
    if x is None:
        return "null"
    return type(x).__name__


def differences(a: Any, b: Any, path: str = "$") -> list[str]:
    """Where two JSON values differ in shape: one line per path (stand-in first, real second)."""
    if path.rsplit(".", 1)[-1] in MAPS:
        return [] if shape(a, True) == shape(b, True) else [f"{path}: stand-in {shape(a, True)}, real {shape(b, True)}"]
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{path}.{k}: only in the {'stand-in' if k in a else 'real server'}" for k in sorted(set(a) ^ set(b))]
        for k in sorted(set(a) & set(b)):
            out += differences(a[k], b[k], f"{path}.{k}")
        return out
    if isinstance(a, list) and isinstance(b, list):
        if a and b:
            out = []
            for x in a[:1] + a[-1:]:
                out += differences(x, b[0] if x is a[0] else b[-1], f"{path}[]")
            return sorted(set(out))
        return []
    return [] if shape(a) == shape(b) else [f"{path}: stand-in {shape(a)}, real {shape(b)}"]


def _stream(http: httpx.Client, url: str, body: dict) -> list[Any]:
    """The data frames of a server-sent event stream, `[DONE]` as the string."""
    frames: list[Any] = []
    with http.stream("POST", f"{url}/v1/completions", json=body) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: "):
                data = line[6:]
                frames.append(data if data == "[DONE]" else json.loads(data))
    return frames


# Volatile or engine-specific fields whose shape legitimately differs (named, with why).
IGNORED = {
    "system_fingerprint",  # vLLM: "vllm-<version>-<hash>" string; the stand-in: null
    "routed_experts",       # vLLM 0.32 (MoE routing, always null for a dense model); not in the stand-in
    "kv_transfer_params",   # the stand-in writes null; vLLM 0.32 leaves it out
    "prompt_tokens_details", "completion_tokens_details",
}


def _strip(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _strip(v) for k, v in x.items() if k not in IGNORED}
    if isinstance(x, list):
        return [_strip(v) for v in x]
    return x


@pytest.fixture(scope="module")
def pair(servers, models):
    """The real server and a stand-in over the same folder: the model that never ends its turn,
    so every answer runs to max_tokens on both sides and the same kinds of chunks appear."""
    with start_standin("vllm", str(models["tied"]), served_model_name=str(models["tied"])) as standin:
        yield servers["tied"].url, standin.url, str(models["tied"])


def _both(pair, fn) -> tuple[Any, Any]:
    real, standin, _ = pair
    with httpx.Client(timeout=120) as http:
        return _strip(fn(http, real)), _strip(fn(http, standin))


PROMPT = list(range(20, 60))


def _completion(model: str, **kw: Any) -> dict:
    return {"model": model, "prompt": PROMPT, "max_tokens": 6, "temperature": 1.0, "return_token_ids": True,
            "skip_special_tokens": False, "include_stop_str_in_output": True, **kw}


@pytest.mark.parametrize("case", ["plain", "logprobs", "top_logprobs_as_ids", "prompt_logprobs"])
def test_completions_whole_body_has_vllms_shape(pair, case):
    model = pair[2]
    extra = {"plain": {}, "logprobs": {"logprobs": 0},
             "top_logprobs_as_ids": {"logprobs": 2, "return_tokens_as_token_ids": True},
             "prompt_logprobs": {"prompt_logprobs": 0, "logprobs": 0}}[case]
    real, standin = _both(pair, lambda h, u: h.post(f"{u}/v1/completions", json=_completion(model, **extra)).json())
    for body in (real, standin):  # ids vary; every choice's top-level fields must be there
        body["id"] = body["created"] = None
    assert differences(standin, real) == []


def test_completions_stream_frames_have_vllms_shape(pair):
    model = pair[2]
    body = _completion(model, logprobs=0, return_tokens_as_token_ids=True, stream=True,
                       stream_options={"include_usage": True})
    real, standin = _both(pair, lambda h, u: _stream(h, u, body))
    assert real[-1] == standin[-1] == "[DONE]"

    def kinds(frames: list[Any]) -> dict[str, Any]:
        """First chunk, a middle chunk, the finishing chunk and the usage chunk, by shape."""
        chunks = [f for f in frames if isinstance(f, dict)]
        with_choices = [c for c in chunks if c.get("choices")]
        finishing = [c for c in with_choices if c["choices"][0].get("finish_reason") is not None]
        usage = [c for c in chunks if not c.get("choices") and c.get("usage")]
        return {"first": with_choices[0], "finish": finishing[-1], "usage": usage[-1:]}

    assert differences(kinds(standin), kinds(real)) == []


@pytest.mark.parametrize("route,body", [
    ("/tokenize", {"prompt": "Hello, world! 1234", "add_special_tokens": False}),
    ("/tokenize", {"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": True}),
    ("/detokenize", {"tokens": [20, 21, 22, 23]}),
])
def test_tokenize_routes_have_vllms_shape(pair, route, body):
    model = pair[2]
    real, standin = _both(pair, lambda h, u: h.post(f"{u}{route}", json={"model": model, **body}).json())
    assert differences(standin, real) == []


def test_models_and_dev_routes_have_vllms_shape(pair):
    def calls(h: httpx.Client, u: str) -> dict[str, Any]:
        out = {"models": h.get(f"{u}/v1/models").json()}
        out["pause"] = h.post(f"{u}/pause", params={"mode": "keep"}).json()
        out["is_paused"] = h.get(f"{u}/is_paused").json()
        out["resume"] = h.post(f"{u}/resume").json()
        out["reset_prefix_cache"] = h.post(f"{u}/reset_prefix_cache").json()
        # reloading the served folder itself: the weights stay what they were
        out["collective_rpc"] = h.post(f"{u}/collective_rpc", json={
            "method": "reload_weights", "kwargs": {"weights_path": pair[2]}}).json()
        out["update_weight_version"] = h.post(f"{u}/update_weight_version", json={"new_version": "7"}).json()
        out["weight_info"] = h.get(f"{u}/weight_info").json()
        return out

    real, standin = _both(pair, calls)
    assert differences(standin, real) == []


def test_errors_have_vllms_shape(pair):
    model = pair[2]
    bad = {"model": model, "prompt": [10**7], "max_tokens": 2}
    def post(h: httpx.Client, u: str) -> tuple[int, Any]:
        r = h.post(f"{u}/v1/completions", json=bad)
        return r.status_code, r.json()

    real, standin = _both(pair, post)
    assert standin[0] == real[0] == 400
    assert differences(standin[1], real[1]) == []
