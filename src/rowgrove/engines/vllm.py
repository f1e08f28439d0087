"""The `vllm` engine: a vLLM server's `/v1/completions` with the prompt as token ids.

Why this endpoint: `/v1/completions` takes a token-id `prompt`, returns one logprob per
sampled token named by its id (`return_tokens_as_token_ids`: `"token_id:N"` in
`logprobs.tokens`), streams, honours `X-Request-Id` and aborts on disconnect, and its shape has
been stable across vLLM releases (vllm/entrypoints/openai/completion/protocol.py). The newer token-in/token-out route
`/inference/v1/generate` (vllm/entrypoints/serve/disagg/) gained streaming only in 2026 (vLLM PR
#37171) and is still moving, so it is not used.

Request (per call): `prompt` = the ids rowgrove rendered; `logprobs` (0, or the harness's
top_logprobs) and `return_tokens_as_token_ids`: each sampled token and each alternative named by
its id, not by its text (which two tokens may share), so the sampled ids are read from
`logprobs.tokens`. Not `return_token_ids`: with it vLLM also echoes the whole prompt's ids
(`prompt_token_ids`, in the first chunk of a stream; completion/serving.py), which rowgrove sent
and does not read, and which grows with the conversation (an 88k-token prompt: about 0.5 MB of
JSON for vLLM to write and 3-4 ms for the gateway to parse, per call; docs/gateway.md, "Long
conversations"). A server's `token_ids`, if it sends them anyway, are checked against the
tokens. Every sampling parameter is sent explicitly (vLLM would otherwise fill
temperature/top_p/top_k from generation_config.json); `skip_special_tokens: false` and
`include_stop_str_in_output: true` (the ids are the truth either way; text only for logs);
`stop_token_ids` = the model folder's stop ids plus the request's; `X-Request-Id` = the call id.

With `stream=True`, streamed chunks carry deltas of `logprobs` (vllm/entrypoints/openai/completion/
serving.py, completion_stream_generator); the chunk with the last delta carries `finish_reason`
("stop" | "length" | "abort"); errors after the 200 arrive as `data: {"error": {...}}`.

Start vLLM with `--logprobs-mode raw_logprobs` (the default: log_softmax of the raw logits,
temperature 1, before top-p, what `Generation.logprobs` promises) and, for weight sync,
`VLLM_SERVER_DEV_MODE=1` (the pause / collective_rpc / reset_prefix_cache routes are dev routes);
`rowgrove.engines.launch` does. After each reload the server's `prompt_logprobs` on a probe are
compared with the trainer's (`_score`, `rowgrove.engines.verify`); a tied-embedding checkpoint
without `lm_head.weight` is rewritten with it first (`_loadable`: vLLM's CPU build otherwise keeps
a stale pre-packed output layer). See docs/engines.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import orjson

from rowgrove.engines.base import Generation, SamplingParams, of_type, plain_ints
from rowgrove.engines.http import ServerClient
from rowgrove.engines.remote import PROBE_MESSAGES, RemoteEngine
from rowgrove.errors import EngineError


class VLLMEngine(RemoteEngine):
    """Engine over one or more vLLM servers (see the module docstring).

    `stream`: read each answer as one JSON body (default) or as a server-sent event stream. One
    body, because vLLM streams a chunk per engine step (a token, for one request): each chunk is a
    line to split and a JSON object to parse on the gateway and to write on vLLM's API server, for
    nothing the gateway uses, since it answers its caller once the generation is whole; a stream
    gains nothing on time-outs either (the engine's read timeout is the gateway's engine timeout,
    which bounds the whole call). Closing the connection aborts either (vLLM's with_cancellation).
    `pause_mode`: how `update_weights` pauses generation while weights load ("keep": requests in
    flight freeze and continue with the new weights; "wait": they finish first; "abort").
    """

    kind = "vllm"

    def __init__(self, model: str, urls: Any, *, stream: bool = False, pause_mode: str = "keep", **kw: Any):
        super().__init__(model, urls, **kw)
        if pause_mode not in ("keep", "wait", "abort"):
            raise EngineError(f"pause_mode {pause_mode!r}: use keep, wait or abort")
        self.stream = stream
        self.pause_mode = pause_mode

    def request_body(self, prompt: Sequence[int], sampling: SamplingParams) -> dict[str, Any]:
        """The /v1/completions body for one call. `prompt` as given: a continuation's is an
        `engines.base.ExtendedIds` (its parts; `list(prompt)` joins them), which `_generate`
        replaces with the prompt's JSON, reused from the rollout's last prompt."""
        body: dict[str, Any] = {
            "model": self.served_model,
            "prompt": prompt,
            "max_tokens": sampling.max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": -1,
            "min_p": 0.0,
            "repetition_penalty": 1.0,
            "frequency_penalty": 0.0,
            "presence_penalty": 0.0,
            "logprobs": sampling.top_logprobs,
            "return_tokens_as_token_ids": True,
            "skip_special_tokens": False,
            "include_stop_str_in_output": True,
            "stop": list(sampling.stop),
            "stop_token_ids": sorted(set(self.stop_ids) | set(sampling.stop_token_ids)),
            "stream": self.stream,
        }
        if sampling.seed is not None:
            body["seed"] = sampling.seed
        if self.stream:
            body["stream_options"] = {"include_usage": True}
        return body

    async def _generate(self, client: ServerClient, url: str, prompt: list[int],
                        sampling: SamplingParams, rid: str) -> Generation:
        body = self.request_body(prompt, sampling)
        body["prompt"] = orjson.Fragment(self.prompt_json(prompt))  # the rollout's last prompt's JSON reused
        headers = {"x-request-id": rid, "content-type": "application/json"}
        acc = _Accumulator(sampling.top_logprobs)
        async with client.stream("POST", f"{url}/v1/completions", content=orjson.dumps(body),
                                 headers=headers) as r:
            if r.status_code >= 400:
                await r.aread()
                self.raise_for_status(url, r, rid)
            if not self.stream:
                acc.add(_json(await r.aread(), url))
            else:
                async for data in r.sse_data():
                    acc.add(_json(data, url))
                acc.done = r.done
        return acc.result(url, rid, streamed=self.stream)

    async def _abort(self, client: ServerClient, url: str, rid: str) -> None:
        # closing the connection aborts the request in vLLM (with_cancellation); nothing to send
        return None

    def _probe(self, http: httpx.Client, url: str) -> list[str]:
        """GET /v1/models (the served name), POST /tokenize of the probe text (the tokenizer) and
        of the probe conversation in the chat form (the chat template)."""
        problems: list[str] = []
        r = http.get(f"{url}/v1/models")
        if r.status_code >= 400:
            return [f"GET /v1/models answered {r.status_code}: is it a vLLM server?"]
        cards = r.json().get("data") or []
        ids = [c.get("id") for c in cards]
        if self.served_model not in ids and self.served_model_given is None and len(ids) == 1:
            self.served_model = ids[0]  # the server's one model; the tokenizer probes below prove it is ours
        if self.served_model not in ids:
            problems.append(f"it serves the model name(s) {ids}, not {self.served_model!r}: give the engine the "
                            "name the server was started with (--served-model-name)")
            return problems  # /tokenize would answer 404 for the wrong name
        r = http.post(f"{url}/tokenize", json={"model": self.served_model, "prompt": _probe_text(),
                                                "add_special_tokens": False})
        if r.status_code < 400:
            theirs = r.json().get("tokens")
        else:
            # no /tokenize: the prompt ids a one-token completion of the probe text reports
            c = http.post(f"{url}/v1/completions", json={
                "model": self.served_model, "prompt": _probe_text(), "max_tokens": 1, "temperature": 0,
                "return_token_ids": True, "add_special_tokens": False})
            choices = c.json().get("choices") if c.status_code < 400 else None
            theirs = choices[0].get("prompt_token_ids") if choices else None
            if theirs is None:
                return problems + [f"POST /tokenize answered {r.status_code} and /v1/completions gave no "
                                   "prompt_token_ids: the tokenizer cannot be checked (is the server started "
                                   "with --skip-tokenizer-init?)"]
        problems += self.compare_ids(theirs)
        ours = self.probe_chat_ids()
        if ours is not None:
            # the server's chat template is never used (rowgrove renders); comparing it tells apart
            # two folders that share a tokenizer. A server that cannot render is not refused for it.
            r = http.post(f"{url}/tokenize", json={"model": self.served_model, "messages": list(PROBE_MESSAGES),
                                                    "add_generation_prompt": True, "add_special_tokens": False})
            if r.status_code < 400 and isinstance(r.json().get("tokens"), list):
                problems += self.compare_chat_ids(r.json().get("tokens"))
        return problems

    def _reload(self, http: httpx.Client, url: str, folder: Path, version: int) -> None:
        """pause → collective_rpc reload_weights(weights_path) → reset_prefix_cache →
        update_weight_version (if the server has it) → resume."""
        def post(path: str, optional: bool = False, **kw: Any) -> httpx.Response:
            r = http.post(f"{url}{path}", **kw)
            if optional and r.status_code == 404:
                return r
            if r.status_code >= 400:
                hint = (": start vLLM with VLLM_SERVER_DEV_MODE=1 (the weight routes are dev routes)"
                        if r.status_code == 404 else "")
                raise EngineError(f"vllm server {url}: POST {path} answered {r.status_code}: "
                                  f"{r.text[:300]}{hint}")
            return r

        post("/pause", params={"mode": self.pause_mode})
        try:
            post("/collective_rpc", json={"method": "reload_weights",
                                          "kwargs": {"weights_path": str(folder)}})
            post("/reset_prefix_cache")
            post("/update_weight_version", optional=True, json={"new_version": str(version)})
        finally:
            post("/resume")


    def _score(self, http: httpx.Client, url: str, ids: list[int]) -> list[float] | None:
        """`POST /v1/completions` with `prompt_logprobs: 0` and one greedy token: vLLM's logprob of
        each prompt token after its prefix (raw logprobs, the entry keyed by the token's id)."""
        r = http.post(f"{url}/v1/completions", json={
            "model": self.served_model, "prompt": ids, "max_tokens": 1, "temperature": 0.0,
            "prompt_logprobs": 0, "skip_special_tokens": False})
        if r.status_code >= 400:
            raise httpx.HTTPStatusError(f"POST /v1/completions with prompt_logprobs answered {r.status_code}: "
                                        f"{r.text[:200]}", request=r.request, response=r)
        choices = r.json().get("choices") or [{}]
        plp = choices[0].get("prompt_logprobs")
        if not isinstance(plp, list) or len(plp) != len(ids):
            return None
        out: list[float] = []
        for entry, tid in zip(plp[1:], ids[1:], strict=True):
            item = entry.get(str(tid)) if isinstance(entry, dict) else None
            lp = item.get("logprob") if isinstance(item, dict) else None
            if not isinstance(lp, int | float):
                return None
            out.append(float(lp))
        return out

    def _loadable(self, folder: Path, version: int) -> Path:
        """A tied-embedding checkpoint without `lm_head.weight` is rewritten under `sync_dir` with
        the head named: vLLM's in-place reload (vllm/model_executor/model_loader/reload/
        layerwise.py) re-processes only layers it loaded a tensor into, and its CPU build keeps a
        pre-packed copy of the output layer (dispatch_cpu_unquantized_gemm, called from
        UnquantizedEmbeddingMethod.process_weights_after_loading), so without the name the head
        stays old. Without `sync_dir` the folder is loaded as is and the sync check decides."""
        from rowgrove.engines.verify import tied_without_head, with_tied_head

        if self.sync_dir is None or not tied_without_head(folder):
            return folder
        from safetensors.torch import load_file

        from rowgrove.engines.remote import write_checkpoint

        tensors: dict[str, Any] = {}
        for f in sorted(folder.glob("*.safetensors")):
            tensors.update(load_file(str(f)))
        return write_checkpoint(with_tied_head(tensors, folder / "config.json"),
                                self.sync_dir / f"v{version:06d}", self.model_path)

    def _stale_hint(self, folder: Path) -> str:
        from rowgrove.engines.verify import tied_without_head

        if tied_without_head(folder):
            return ("The model ties its embeddings and the checkpoint has no lm_head.weight: vLLM's CPU build "
                    "keeps its old pre-packed output layer when reloading such a checkpoint. Sync a state dict "
                    "(rowgrove writes lm_head.weight), give the engine a sync_dir so rowgrove rewrites the folder, "
                    "or save the checkpoint with lm_head.weight.")
        return super()._stale_hint(folder)


def _probe_text() -> str:
    from rowgrove.engines.remote import PROBE_TEXT

    return PROBE_TEXT


def _json(raw: bytes, url: str) -> dict[str, Any]:
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise EngineError(f"vllm server {url} sent a reply that is not JSON: {raw[:200]!r}") from None
    if not isinstance(data, dict):
        raise EngineError(f"vllm server {url} sent {type(data).__name__} where a JSON object belongs")
    return data


class _Accumulator:
    """Joins /v1/completions bodies or stream chunks (deltas) into one Generation."""

    def __init__(self, top: int):
        self.top = top
        self.ids: list[int] = []
        self.lps: list[float] = []
        self.tops: list[list[tuple[int, float]]] = []
        self.finish: str | None = None
        self.done = False

    def add(self, chunk: dict[str, Any]) -> None:
        if "error" in chunk and not chunk.get("choices"):
            err = chunk["error"]
            msg = err.get("message") if isinstance(err, dict) else err
            raise EngineError(f"the vllm server failed mid-request: {msg}")
        for choice in chunk.get("choices") or ():
            lp = choice.get("logprobs") or {}
            values = lp.get("token_logprobs") or []
            ids = _token_ids(lp.get("tokens") or [])
            given = choice.get("token_ids")
            if given is not None and list(given) != ids:
                raise EngineError(f"the vllm server's token_ids {list(given)[:8]} disagree with its logprob tokens "
                                  f"{ids[:8]}: a server bug, retry the call")
            if not ids and choice.get("text"):
                raise EngineError("the vllm server sent text without logprob tokens: it ignored the request's "
                                  "logprobs and return_tokens_as_token_ids; is it a vLLM server?")
            self.ids.extend(ids)
            self.lps.extend(values)
            if self.top:
                for alt in lp.get("top_logprobs") or [None] * len(values):
                    self.tops.append(_alternatives(alt, self.top))
            if choice.get("finish_reason") is not None:
                self.finish = choice["finish_reason"]

    def result(self, url: str, rid: str, *, streamed: bool) -> Generation:
        if self.finish is None:
            raise EngineError(f"vllm server {url}: request {rid} ended without a finish reason "
                              f"({'the stream was cut' if streamed else 'malformed body'}): retry the call")
        if self.finish == "abort":
            raise EngineError(f"vllm server {url} aborted request {rid} (paused with mode=abort, or "
                              "aborted by another client): retry the call")
        if any(v is None for v in self.lps):
            raise EngineError(f"vllm server {url}: request {rid} has a sampled token without a logprob")
        return Generation(token_ids=self.ids, logprobs=[float(v) for v in self.lps],
                          finish_reason=self.finish, top_logprobs=self.tops if self.top else None)



def _token_ids(tokens: list[Any]) -> list[int]:
    """The sampled ids named by `logprobs.tokens` (`"token_id:N"` each, as
    `return_tokens_as_token_ids` makes vLLM write them); EngineError for anything else."""
    # the usual answer, read at C speed: every item a string that starts with "token_id:" (as many
    # as there are items, each led by the comma that joins the items: none inside one) and the
    # rest of each item one JSON integer (as many as there are items); anything else (a comma or
    # a bracket inside an item, a float, an item that is not a string) is read item by item below
    if type(tokens) is list and of_type(tokens, str):
        joined = ",".join(tokens)
        if joined.count("token_id:") == len(tokens) == ("," + joined).count(",token_id:"):
            try:
                ids = orjson.loads("[" + joined.replace("token_id:", "") + "]") if tokens else []
            except orjson.JSONDecodeError:
                ids = None
            if type(ids) is list and len(ids) == len(tokens) and plain_ints(ids):
                return ids
    try:
        if all(isinstance(t, str) and t.startswith("token_id:") for t in tokens):
            return [int(t[9:]) for t in tokens]
    except ValueError:
        pass
    bad = next(t for t in tokens if not _names_id(t))
    raise EngineError(f"the vllm server named a sampled token {bad!r}, not 'token_id:N': it ignored "
                      "return_tokens_as_token_ids")


def _names_id(t: Any) -> bool:
    if not (isinstance(t, str) and t.startswith("token_id:")):
        return False
    try:
        int(t[9:])
    except ValueError:
        return False
    return True


def _alternatives(alt: Any, k: int) -> list[tuple[int, float]]:
    """`{"token_id:N": logprob, ...}` → [(N, logprob)] best first, at most k (the sampled token
    vLLM puts first is kept only if it is among the best k)."""
    if not isinstance(alt, dict):
        return []
    pairs = []
    for key, v in alt.items():
        if isinstance(key, str) and key.startswith("token_id:") and isinstance(v, int | float):
            try:
                pairs.append((int(key[9:]), float(v)))
            except ValueError:
                continue
    pairs.sort(key=lambda p: (-p[1], p[0]))
    return pairs[:k]
