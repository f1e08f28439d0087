"""The `sglang` engine: an SGLang server's native `POST /generate` with the prompt as `input_ids`.

Why this endpoint: `/generate` is SGLang's own token-in/token-out route. It takes `input_ids`,
returns the sampled ids (`output_ids`, the stop token included) with one logprob triple per id
(`meta_info.output_token_logprobs`), streams, names the request by `rid` (which `/abort_request`
takes), and, in recent builds, reports the weight version of every sampled token
(`meta_info.weight_versions` spans). Its shapes live in python/sglang/srt/managers/io_struct.py
(`GenerateReqInput`), python/sglang/srt/sampling/sampling_params.py and
python/sglang/srt/managers/tokenizer_manager_components/output_processor.py.

Request (per call): `input_ids` = the ids rowgrove rendered; `rid` = the call id;
`sampling_params` with every sampling parameter explicit (`temperature`, `top_p`, `top_k: -1`,
`min_p: 0`, penalties off; newer SGLang would otherwise take defaults from
generation_config.json), `max_new_tokens`, `stop`, `stop_token_ids` = the model folder's stop ids
plus the request's, `sampling_seed` when the request has a seed (the native key; `seed` is the
OpenAI name and unknown keys make SGLang fail), `skip_special_tokens: false`, `no_stop_trim: true`,
`ignore_eos: false`; `return_logprob: true`, `logprob_start_len: -1` (output tokens only),
`top_logprobs_num`, `stream`.

Reply: `output_ids`; `meta_info.output_token_logprobs` as `[logprob | null, id, text | null]`
triples (their ids must equal `output_ids`, else the reply is an engine fault);
`meta_info.output_top_logprobs`; `meta_info.finish_reason` (`{"type": "stop" | "length" |
"abort", ...}`; abort is an engine failure, or "overloaded" when it carries status 503/429);
`meta_info.completion_tokens`, checked against the ids. A stream (`data: {...}` events, then
`data: [DONE]`) comes in one of two forms: cumulative (SGLang's default: each chunk holds
everything so far) or incremental (`--incremental-streaming-output`, formerly `--stream-output`:
each chunk holds only the new ids and logprobs). `check()` reads the form from `/server_info`
(or the older `/get_server_info`); every chunk is also checked against `completion_tokens`, which
tells the two forms apart on its own (so a server whose form was not read, or an older one that
streamed ids incrementally and logprobs cumulatively, is still read right). `data: {"error":
...}` before any token is the server refusing the request (400, as the same request without
streaming would get); after tokens it is an engine failure.

Weight versions: SGLang names versions with strings (`--weight-version`, default "default").
rowgrove's `update_weights` names version N `"N"` (`/update_weights_from_disk` with
`weight_version`), so names read back as integers; a name that is not a non-negative integer
(e.g. "default") counts as the engine's own `weights_version` when the request was sent. The
final output's `meta_info.weight_versions` spans (`[{"version", "start", "end"}]`, newer builds;
python/sglang/srt/utils/weight_versions.py) give each token its version and must cover exactly
the sampled tokens; without spans each streamed chunk's `meta_info.weight_version` stamps the
tokens it brought, and a non-streamed reply's stamps all.

Start SGLang with:

    SGLANG_RETURN_ORIGINAL_LOGPROB=1 python -m sglang.launch_server --model-path PATH --port 30000

- `SGLANG_RETURN_ORIGINAL_LOGPROB=1`: logprobs are log_softmax of the raw logits (temperature 1,
  before top-k/top-p), what `Generation.logprobs` promises. Without it SGLang reports the
  temperature-scaled logprobs (python/sglang/srt/layers/sampler.py), which equal the raw ones only
  at temperature 1.
- Optional: `--incremental-streaming-output` (less data per chunk on long outputs).
- Do not use `--skip-tokenizer-init`: the start-up check needs `/tokenize`.
- `--served-model-name NAME` when rowgrove's `--model` path is not the server's `--model-path`
  (then pass the same name as rowgrove's `--served-model-name`).

Weight sync (`_reload`): `POST /update_weights_from_disk {"model_path": FOLDER, "weight_version":
"N", "abort_all_requests": false}`; requests in flight continue and their later tokens carry the
new version. The NCCL path (`POST /init_weights_update_group {"master_address", "master_port",
"rank_offset", "world_size", "group_name", "backend": "nccl"}` once, then per update
`POST /update_weights_from_distributed {"names", "dtypes", "shapes", "group_name", "flush_cache",
"weight_version"}` while the trainer's ranks broadcast each tensor in that order) is not
implemented: it cannot be tested without GPUs. It would be a subclass overriding `_reload`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
import orjson

from rowgrove.engines.base import Generation, SamplingParams
from rowgrove.engines.http import ServerClient
from rowgrove.engines.remote import PROBE_TEXT, RemoteEngine, server_message
from rowgrove.errors import BadRequest, EngineError, Unavailable


class SGLangEngine(RemoteEngine):
    """Engine over one or more SGLang servers (see the module docstring).

    `stream`: read each answer as a server-sent event stream (default) or as one JSON body.
    `incremental`: the servers' streaming form (True: `--incremental-streaming-output`, False:
    cumulative); None (default) reads it from each server at `check()`.
    """

    kind = "sglang"
    takes_images = True

    def __init__(self, model: str, urls: Any, *, stream: bool = True, incremental: bool | None = None,
                 **kw: Any):
        super().__init__(model, urls, **kw)
        self.stream = stream
        self.incremental_override = incremental
        # per server URL: True incremental, False cumulative, None not known (chunks decide)
        self.incremental: dict[str, bool | None] = {u: incremental for u in self.urls}

    # ---- generation -----------------------------------------------------------------------

    def request_body(self, prompt: Sequence[int], sampling: SamplingParams, rid: str) -> dict[str, Any]:
        """The /generate body for one call (only keys SGLang's SamplingParams knows). `prompt` as
        given: a continuation's is an `engines.base.ExtendedIds` (`list(prompt)` joins it), which
        `_generate` replaces with the prompt's JSON, reused from the rollout's last prompt."""
        params: dict[str, Any] = {
            "max_new_tokens": sampling.max_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": -1,
            "min_p": 0.0,
            "repetition_penalty": 1.0,
            "frequency_penalty": 0.0,
            "presence_penalty": 0.0,
            "stop": list(sampling.stop),
            "stop_token_ids": sorted(set(self.stop_ids) | set(sampling.stop_token_ids)),
            "ignore_eos": False,
            "skip_special_tokens": False,
            "no_stop_trim": True,
        }
        if sampling.seed is not None:
            params["sampling_seed"] = sampling.seed
        return {
            "input_ids": prompt,
            "rid": rid,
            "sampling_params": params,
            "return_logprob": True,
            "logprob_start_len": -1,
            "top_logprobs_num": sampling.top_logprobs,
            "stream": self.stream,
        }

    async def _generate(self, client: ServerClient, url: str, prompt: list[int],
                        sampling: SamplingParams, rid: str, images: Sequence[Any] = ()) -> Generation:
        body = self.request_body(prompt, sampling, rid)
        body["input_ids"] = orjson.Fragment(self.prompt_json(prompt))  # the rollout's last prompt's JSON reused
        if images:
            # SGLang's GenerateReqInput.image_data: one entry per image of the prompt, in order
            # (URLs, paths or base64 data URLs); the prompt's placeholder ids are already expanded
            import base64

            body["image_data"] = [f"data:{im.mime};base64,{base64.b64encode(im.data).decode()}" for im in images]
        held = self.weights_version  # what a version name that is not a number stands for
        reply = ReplyReader(f"sglang server {url}", rid, sampling.top_logprobs,
                            incremental=self.incremental.get(url),
                            version_of=lambda name: version_number(name, held))
        async with client.stream("POST", f"{url}/generate", content=orjson.dumps(body),
                                 headers={"content-type": "application/json"}) as r:
            if r.status_code >= 400:
                await r.aread()
                self.raise_for_status(url, r, rid)
            if not self.stream:
                data = _json(await r.aread(), url)
                if isinstance(data, list) and len(data) == 1:
                    data = data[0]
                reply.add(data)
            else:
                async for data in r.sse_data():
                    reply.add(_json(data, url))
                reply.done = r.done
        return reply.result(streamed=self.stream)

    async def _abort(self, client: ServerClient, url: str, rid: str) -> None:
        # SGLang notices a disconnect only after a while (it polls); say it explicitly
        await client.post(f"{url}/abort_request", content=orjson.dumps({"rid": rid}),
                          headers={"content-type": "application/json"}, timeout=5.0)

    # ---- start-up check -------------------------------------------------------------------

    def _probe(self, http: httpx.Client, url: str) -> list[str]:
        problems: list[str] = []
        r = http.get(f"{url}/get_model_info")
        if r.status_code >= 400:
            return [f"GET /get_model_info answered {r.status_code}: is it an SGLang server? check --engine"]
        info = r.json()
        if not isinstance(info, dict) or "is_generation" not in info:
            return [f"GET /get_model_info gave {str(info)[:200]!r}, not SGLang's model info: check --engine"]
        if not info.get("is_generation"):
            problems.append(f"it serves {info.get('model_path')!r} as an embedding/reward model "
                            "(is_generation false): start it on a generative model")
        server = self._server_info(http, url)
        problems += self._compare_model(info, server)
        r = http.post(f"{url}/tokenize", json={"prompt": PROBE_TEXT, "add_special_tokens": False})
        if r.status_code < 400:
            theirs = r.json().get("tokens")
        else:
            theirs = self._prompt_ids_of(http, url)  # older servers: no /tokenize
            if theirs is None:
                return problems + [f"POST /tokenize answered {r.status_code} ({server_message(r)}) and /generate "
                                   "reported no input ids: the tokenizer cannot be checked (is the server "
                                   "started with --skip-tokenizer-init?)"]
        problems += self.compare_ids(theirs)
        if self.incremental_override is None and server is not None:
            mode = server.get("incremental_streaming_output", server.get("stream_output"))
            self.incremental[url] = bool(mode) if isinstance(mode, bool) else None
        return problems

    def _prompt_ids_of(self, http: httpx.Client, url: str) -> list[int] | None:
        """The server's ids for the probe text, from a one-token `/generate` on `text` with the
        prompt's logprobs (`input_token_logprobs` triples carry the ids); None if it gives none.
        The tokenizer may add a BOS id in front, which is dropped when it is the tokenizer's."""
        r = http.post(f"{url}/generate", json={"text": PROBE_TEXT, "sampling_params": {"max_new_tokens": 1},
                                               "return_logprob": True, "logprob_start_len": 0})
        if r.status_code >= 400:
            return None
        body = r.json()
        triples = (body.get("meta_info") or {}).get("input_token_logprobs") if isinstance(body, dict) else None
        if not isinstance(triples, list) or not triples:
            return None
        ids = [t[1] for t in triples if isinstance(t, list | tuple) and len(t) >= 2]
        bos = self.tokenizer.bos_token_id
        if ids and bos is not None and ids[0] == bos and ids[1:] == self.probe_ids():
            ids = ids[1:]
        return ids

    def _server_info(self, http: httpx.Client, url: str) -> dict[str, Any] | None:
        """The server's arguments (`/server_info`, else the older `/get_server_info`), or None."""
        for path in ("/server_info", "/get_server_info"):
            r = http.get(f"{url}{path}")
            if r.status_code < 400:
                try:
                    body = r.json()
                except ValueError:
                    continue
                if isinstance(body, dict):
                    return body
        return None

    def _compare_model(self, info: dict[str, Any], server: dict[str, Any] | None) -> list[str]:
        """[] when the server's model is this model folder's: its served name (default: its
        --model-path) is `served_model`, or names the same folder; and its architectures, when it
        reports them, are config.json's."""
        problems: list[str] = []
        path = info.get("model_path")
        name = (server or {}).get("served_model_name") or path
        ours = {self.served_model, str(self.model_path)}
        if isinstance(name, str) and name:
            same = name in ours or _tail(name) in {_tail(o) for o in ours}
            if not same and isinstance(path, str) and path:
                same = path in ours or _tail(path) in {_tail(o) for o in ours}
            if not same and self.sync_dir is not None and isinstance(path, str):
                # after an update the server's model_path is the checkpoint rowgrove synced
                same = Path(path).parent.resolve() == self.sync_dir.resolve()
            if not same:
                problems.append(f"it serves {name!r} (model_path {path!r}), not {self.served_model!r}: start "
                                f"it on {self.model_path}, or pass --served-model-name as the server was started")
        theirs = info.get("architectures")
        local = _local_architectures(self.model_path)
        if isinstance(theirs, list) and theirs and local and list(theirs) != local:
            problems.append(f"its model is a {theirs} but {self.model_path} holds a {local}")
        return problems

    # ---- weights --------------------------------------------------------------------------

    def _reload(self, http: httpx.Client, url: str, folder: Path, version: int) -> None:
        """`/update_weights_from_disk` naming the new version `str(version)`; requests in flight
        keep running (their later tokens carry the new version)."""
        r = http.post(f"{url}/update_weights_from_disk",
                      json={"model_path": str(folder), "weight_version": str(version), "abort_all_requests": False})
        try:
            body = r.json()
        except ValueError:
            body = None
        ok = isinstance(body, dict) and body.get("success") is True
        if r.status_code >= 400 or not ok:
            msg = body.get("message") if isinstance(body, dict) and body.get("message") else server_message(r)
            hint = ": is it an SGLang server? check --engine" if r.status_code == 404 else ""
            raise EngineError(f"sglang server {url}: loading weights from {folder} failed "
                              f"({r.status_code}): {msg}{hint}")

    def _score(self, http: httpx.Client, url: str, ids: list[int]) -> list[float] | None:
        """`/generate` on `input_ids` with `logprob_start_len: 0` and one greedy token: SGLang's
        `input_token_logprobs` triples `[logprob, id, text]`, the first (no prefix) dropped."""
        r = http.post(f"{url}/generate", json={"input_ids": ids, "sampling_params": {"max_new_tokens": 1,
                                                                                      "temperature": 0.0},
                                               "return_logprob": True, "logprob_start_len": 0})
        if r.status_code >= 400:
            raise httpx.HTTPStatusError(f"POST /generate with logprob_start_len 0 answered {r.status_code}: "
                                        f"{r.text[:200]}", request=r.request, response=r)
        body = r.json()
        triples = (body.get("meta_info") or {}).get("input_token_logprobs") if isinstance(body, dict) else None
        if not isinstance(triples, list) or len(triples) != len(ids):
            return None
        out = [t[0] if isinstance(t, list | tuple) and t else None for t in triples[1:]]
        return [float(v) for v in out] if all(isinstance(v, int | float) for v in out) else None


def version_number(name: Any, held: int) -> int:
    """The integer a server's weight version name stands for: "N" (how rowgrove names its
    updates) is N; any other name ("default", a tag) is `held`, the engine's own counter."""
    if isinstance(name, str) and name.isascii() and name.isdigit() and len(name) < 10:
        return int(name)
    if isinstance(name, int) and not isinstance(name, bool) and 0 <= name < 2**31:
        return name
    return held


class ReplyReader:
    """Joins a /generate reply (one object, or the chunks of a stream) into one Generation,
    checking it as it goes (see the module docstring). `incremental`: the stream's form if known.
    `version_of`: a version name → its integer."""

    def __init__(self, where: str, rid: str, top: int, *, incremental: bool | None = None,
                 version_of: Callable[[Any], int] = lambda name: version_number(name, 0)):
        self.where, self.rid, self.top = where, rid, top
        self.incremental = incremental
        self.version_of = version_of
        self.ids: list[int] = []
        self.triples: list[Any] = []
        self.tops: list[Any] = []
        self.names: list[Any] = []      # per token: the weight_version of the chunk that brought it
        self.spans: Any = None
        self.finish: Any = None
        self.done = False

    def _fail(self, what: str) -> EngineError:
        return EngineError(f"{self.where}: request {self.rid}: {what}: an engine fault, the call is not stored")

    def add(self, chunk: Any) -> None:
        """One reply object or stream chunk."""
        if not isinstance(chunk, dict):
            raise self._fail(f"sent {type(chunk).__name__} where a JSON object belongs")
        if "error" in chunk and "output_ids" not in chunk:
            err = chunk["error"]
            msg = err.get("message") if isinstance(err, dict) else err
            if not self.ids:  # SGLang's ValueError path: the request itself was refused
                raise BadRequest(f"{self.where} refused request {self.rid}: {msg}", code="engine_rejected")
            raise EngineError(f"{self.where} failed in the middle of request {self.rid}: {msg}")
        if self.finish is not None:
            return  # nothing belongs after the final output
        ids = chunk.get("output_ids")
        meta = chunk.get("meta_info")
        if not isinstance(ids, list) or not isinstance(meta, dict):
            raise self._fail("the reply has no output_ids or meta_info: is it an SGLang server?")
        total = meta.get("completion_tokens")
        total = total if isinstance(total, int) and not isinstance(total, bool) else None
        triples = meta.get("output_token_logprobs")
        if triples is None:
            if ids:
                raise self._fail("the reply has no output_token_logprobs (return_logprob was ignored)")
            triples = []
        new_ids = self._merge("output_ids", self.ids, ids, total, check_prefix=True)
        self.ids += new_ids
        self.triples += self._merge("output_token_logprobs", self.triples, triples, total)
        if self.top:
            tops = meta.get("output_top_logprobs")
            if tops is None:
                if ids:
                    raise self._fail("the reply has no output_top_logprobs though top_logprobs_num was sent")
                tops = []
            self.tops += self._merge("output_top_logprobs", self.tops, tops, total)
        self.names += [meta.get("weight_version")] * len(new_ids)
        finish = meta.get("finish_reason")
        if finish is not None:
            self.finish = finish
            self.spans = meta.get("weight_versions")
            if total is not None and total != len(self.ids):
                raise self._fail(f"completion_tokens is {total} but {len(self.ids)} ids came")

    def _merge(self, name: str, acc: list[Any], items: Any, total: int | None, *,
               check_prefix: bool = False) -> list[Any]:
        """The new items of one chunk's list `items`, given `acc` so far: a cumulative chunk
        repeats `acc` first, an incremental one holds only new items. `completion_tokens` says
        which (a chunk can hold all tokens so far, or the ones after `acc`, not both unless `acc`
        is empty); without it the known form decides (cumulative when unknown)."""
        if not isinstance(items, list):
            raise self._fail(f"{name} is {type(items).__name__}, not a list")
        n = len(acc)
        if total is not None:
            if len(items) == total:
                cumulative = True
            elif n + len(items) == total:
                cumulative = False
            else:
                raise self._fail(f"a chunk's {name} holds {len(items)} entries after {n}, which matches "
                                 f"neither streaming form for completion_tokens {total}")
        else:
            cumulative = not self.incremental
        if not cumulative:
            return list(items)
        if len(items) < n or (check_prefix and items[:n] != acc):
            raise self._fail(f"a cumulative chunk's {name} does not extend the earlier ones")
        return list(items[n:])

    def result(self, *, streamed: bool) -> Generation:
        if self.finish is None:
            raise EngineError(f"{self.where}: request {self.rid} ended without a finish reason "
                              f"({'the stream was cut' if streamed else 'malformed body'}): retry the call")
        kind = self.finish.get("type") if isinstance(self.finish, dict) else self.finish
        if kind == "abort":
            msg = self.finish.get("message") if isinstance(self.finish, dict) else None
            status = self.finish.get("status_code") if isinstance(self.finish, dict) else None
            if status in (429, 503):
                raise Unavailable(f"{self.where} turned request {self.rid} away ({status}: {msg}): "
                                  "it is overloaded, retry later", 1.0)
            if status == 400:
                raise BadRequest(f"{self.where} refused request {self.rid}: {msg}", code="engine_rejected")
            raise EngineError(f"{self.where} aborted request {self.rid} ({msg or 'no reason given'}; paused "
                              "with mode abort, or aborted by another client): retry the call")
        if kind not in ("stop", "length"):
            raise self._fail(f"unknown finish reason {self.finish!r}")
        n = len(self.ids)
        if len(self.triples) != n:
            raise self._fail(f"{n} output_ids but {len(self.triples)} output_token_logprobs")
        logprobs: list[float] = []
        for i, (t, tid) in enumerate(zip(self.triples, self.ids, strict=True)):
            if not isinstance(t, list | tuple) or len(t) < 2:
                raise self._fail(f"output_token_logprobs[{i}] is {t!r}, not [logprob, id, text]")
            if t[1] != tid:
                raise self._fail(f"output_token_logprobs[{i}] is for id {t[1]!r} but output_ids[{i}] is {tid!r}")
            if t[0] is None:
                raise self._fail(f"sampled token {i} (id {tid}) has no logprob (null: -inf)")
            if not isinstance(t[0], int | float) or isinstance(t[0], bool):
                raise self._fail(f"output_token_logprobs[{i}] has logprob {t[0]!r}, not a number")
            logprobs.append(float(t[0]))
        tops = None
        if self.top:
            if len(self.tops) != n:
                raise self._fail(f"{n} output_ids but {len(self.tops)} output_top_logprobs")
            tops = [_alternatives(alt, self.top) for alt in self.tops]
        return Generation(token_ids=list(self.ids), logprobs=logprobs, finish_reason=kind,
                          top_logprobs=tops, weight_versions=self._versions(n))

    def _versions(self, n: int) -> list[int] | None:
        """One version per token: from the spans when the server gives them, else from each
        chunk's weight_version; None when the server names no version at all."""
        if self.spans is not None:
            spans = self.spans
            if not isinstance(spans, list):
                raise self._fail(f"weight_versions is {type(spans).__name__}, not a list of spans")
            out: list[int] = []
            for s in spans:
                if not (isinstance(s, dict) and isinstance(s.get("start"), int) and isinstance(s.get("end"), int)
                        and s["start"] == len(out) and s["end"] >= s["start"]):
                    raise self._fail(f"weight_versions spans {spans!r} are not contiguous from 0")
                out += [self.version_of(s.get("version"))] * (s["end"] - s["start"])
            if len(out) != n:
                raise self._fail(f"weight_versions spans cover {len(out)} tokens, not the {n} sampled")
            return out
        if all(name is None for name in self.names):
            return None
        return [self.version_of(name) for name in self.names]


def _alternatives(alt: Any, k: int) -> list[tuple[int, float]]:
    """One position's `[[logprob, id, text], ...]` (or null) → [(id, logprob)] best first, at
    most k; -inf (null) alternatives are dropped."""
    if not isinstance(alt, list):
        return []
    pairs = []
    for t in alt:
        if (isinstance(t, list | tuple) and len(t) >= 2 and isinstance(t[0], int | float)
                and not isinstance(t[0], bool) and isinstance(t[1], int) and not isinstance(t[1], bool)):
            pairs.append((int(t[1]), float(t[0])))
    pairs.sort(key=lambda p: (-p[1], p[0]))
    return pairs[:k]


def _tail(name: str) -> str:
    """The last path component of a model path or hub name ("Qwen/Qwen3-8B" → "Qwen3-8B")."""
    return name.rstrip("/").rsplit("/", 1)[-1]


def _local_architectures(folder: Path) -> list[str] | None:
    try:
        cfg = orjson.loads((folder / "config.json").read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    arch = cfg.get("architectures") if isinstance(cfg, dict) else None
    return list(arch) if isinstance(arch, list) and arch else None


def _json(raw: bytes, url: str) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise EngineError(f"sglang server {url} sent a reply that is not JSON: {raw[:200]!r}") from None
