"""What the vLLM and SGLang engines share: rowgrove renders and tokenizes, the server only samples
from token ids.

    Gateway ──prompt ids──▶ RemoteEngine ──HTTP (one of several servers, a rollout stays on one)──▶ server
            ◀─Generation──   checks ids, logprobs, versions   ◀── sampled ids + logprobs ───────

- The model folder (`model`) is the Hugging Face folder the server serves: tokenizer, chat
  template and generation config are read from it, so both sides agree on every id. `check()`
  (run by `make_engine`) proves it per server before the gateway starts: the served model name,
  the ids of a probe text (`PROBE_TEXT`, `compare_ids`) and, where the server renders chat, the
  ids of a probe conversation through its chat template (`PROBE_MESSAGES`, `compare_chat_ids`),
  which tells apart folders that share a tokenizer but not a template.
- A rollout's calls go to one server (chosen least-loaded at its first call, ties taken in turn
  so that rollouts spread even when calls come one at a time), so the server's prefix cache holds
  the conversation; calls without a rollout go to the least-loaded server.
- Failures become the gateway's errors: cannot connect, a broken connection or a 5xx →
  EngineError (502); a timeout → EngineError(timeout) (504); 429 or 503 → Unavailable (503 with
  the server's Retry-After); a 4xx the server gives for the request → BadRequest (400). A reply
  with an id outside the vocabulary, a logprob list of the wrong length or no finish reason is an
  engine fault (502): it is never stored as a completed call.
- Weights: `update_weights(state_dict | folder)` writes a state dict as a safetensors checkpoint
  under `sync_dir` (a folder both sides can read) and asks every server to load it, then verifies
  it (`rowgrove.engines.verify`): each server's logprobs on a probe must equal the trainer's within
  `sync_tolerance`, else WeightSyncError and that server serves no further call until a sync
  passes. Only then is `weights_version` bumped. Each sampled token carries the version it was
  sampled under: the server's report where it gives one, else the version held when the request
  was sent.
"""

from __future__ import annotations

import asyncio
import json
from abc import ABC, abstractmethod
import shutil
import uuid
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import orjson

# check_generation lives in rowgrove.engines.base (every engine's answer is checked); kept importable here
from rowgrove.engines.base import (ExtendedIds, Generation, SamplingParams, as_list, check_generation, check_prompt,
                                   plain_ints)
from rowgrove.engines.http import ConnectFailed, Reply, ServerClient
from rowgrove.engines.verify import Reference, WeightMirror, WeightSyncError, largest_difference, with_tied_head
from rowgrove.engines.verify import sync_tolerance as resolve_tolerance
from rowgrove.errors import BadRequest, EngineError, InputError, Unavailable

# A rollout's server is remembered for this many rollouts (least recently used are forgotten).
_AFFINITY_SIZE = 200_000
# The rollouts' last checked prompts are kept up to this many ids in all (8 bytes each, the int
# objects being the caller's, plus their JSON once written: 4-8 bytes each), least recently used
# forgotten first (`RemoteEngine.checked_prompt`).
_CHECKED_IDS = 16 << 20
# The probe text of the tokenizer check: ASCII, CJK, an emoji, digits and whitespace runs, so a
# different vocabulary, normalizer or pre-tokenizer shows as different ids.
PROBE_TEXT = "Hello, world! 1234567 ½ 中文字符 🙂\n\n\tcode(x) -> y  end"
# The probe conversation of the chat-template check: user, assistant, user and the generation
# prompt, without a system message, so the template's markers, turn ends, history rendering and
# any default system prompt all show.
PROBE_MESSAGES = (
    {"role": "user", "content": "What is 2 + 2?"},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "And 3 + 3?"},
)


class _Checked:
    """A rollout's last checked prompt (`ids`, not to be mutated), its JSON once written, and
    until then the JSON of the previous prompt it extends with that prompt's length (`head`)."""

    __slots__ = ("head", "ids", "json")

    def __init__(self, ids: list[int], head: tuple[bytes, int] | None):
        self.ids, self.head = ids, head
        self.json: bytes | None = None


def parse_urls(urls: str | Sequence[str]) -> list[str]:
    """Server URLs from a comma-separated string or a list of them (each may hold commas);
    InputError when none is given or one is not http(s)."""
    items = [urls] if isinstance(urls, str) else list(urls)
    out: list[str] = []
    for item in items:
        for u in str(item).split(","):
            u = u.strip().rstrip("/")
            if not u:
                continue
            if not u.startswith(("http://", "https://")):
                raise InputError(f"engine URL {u!r} is not an http(s) URL: write e.g. http://127.0.0.1:8000")
            out.append(u)
    if not out:
        raise InputError("no engine URL given: pass --engine-url http://HOST:PORT (several: comma-separated)")
    return list(dict.fromkeys(out))


def model_vocab_size(folder: Path, tokenizer: Any) -> int:
    """The number of ids the model can emit: config.json's vocab_size (which may exceed the
    tokenizer's, padded for the GPU), else the tokenizer's length."""
    cfg_path = folder / "config.json"
    size = len(tokenizer)
    if cfg_path.is_file():
        try:
            cfg = json.loads(cfg_path.read_text())
        except (OSError, ValueError):
            return size
        text_cfg = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
        v = text_cfg.get("vocab_size", cfg.get("vocab_size"))
        if isinstance(v, int) and v > 0:
            size = max(size, v)
    return size


class RemoteEngine(ABC):
    """The shared half of a server-backed engine; `VLLMEngine` and `SGLangEngine` add the wire
    format (`_generate`, `_abort`, `_probe`, `_reload`). See the module docstring."""

    kind = "remote"
    takes_images = False  # whether `generate` passes hints["images"] to the server (sglang: image_data)

    def __init__(self, model: str, urls: str | Sequence[str], *, timeout: float = 600.0,
                 connect_timeout: float = 10.0, api_key: str | None = None,
                 sync_dir: str | Path | None = None, served_model: str | None = None,
                 sync_tolerance: float | None = None):
        from rowgrove.model.load import end_of_turn_id, load_tokenizer, model_dir, stop_token_ids

        self.model_path = model_dir(model)
        self.tokenizer = load_tokenizer(str(self.model_path))
        self.eot_id = end_of_turn_id(self.tokenizer)
        self.stop_ids = tuple(stop_token_ids(self.tokenizer, self.model_path))
        self.vocab_size = model_vocab_size(self.model_path, self.tokenizer)
        self.urls = parse_urls(urls)
        # None: the name the server serves, when it serves exactly one (read at check())
        self.served_model_given = served_model
        self.served_model = served_model or str(model)
        self.timeout = httpx.Timeout(timeout, connect=connect_timeout)
        self.headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self.sync_dir = Path(sync_dir) if sync_dir is not None else None
        self.weights_version = 0
        # weight-sync verification: the largest logprob difference accepted, the CPU mirror used as
        # the reference when the caller gives none, and the servers refused after a failed sync
        self.sync_tolerance = resolve_tolerance(sync_tolerance)
        self._mirror = WeightMirror(self.model_path)
        self.stale: dict[str, str] = {}
        self.in_flight = [0] * len(self.urls)
        self._affinity: OrderedDict[str, int] = OrderedDict()
        self._next = 0  # where the next tie among least-loaded servers is broken
        self._checked: OrderedDict[str, _Checked] = OrderedDict()  # rollout -> its last checked prompt
        self._checked_ids = 0
        self._last_checked: _Checked | None = None
        self._clients: dict[asyncio.AbstractEventLoop, ServerClient] = {}
        self._closed = False

    # ---- choosing a server ----------------------------------------------------------------

    def server_for(self, rollout_id: str | None) -> int:
        """The index of the server a call of `rollout_id` goes to (sticky per rollout): a new
        rollout gets the least-loaded server, ties broken in turn."""
        if rollout_id is not None:
            hit = self._affinity.get(rollout_id)
            if hit is not None:
                self._affinity.move_to_end(rollout_id)
                return hit
        n = len(self.urls)
        best = min(range(n), key=lambda i: (self.in_flight[i], (i - self._next) % n))
        self._next = (best + 1) % n
        if rollout_id is not None:
            self._affinity[rollout_id] = best
            if len(self._affinity) > _AFFINITY_SIZE:
                self._affinity.popitem(last=False)
        return best

    def _client(self) -> ServerClient:
        # one client per event loop: a connection pool is bound to the loop it first ran on.
        # Keyed by the loop itself (not id(loop), which a later loop may reuse); clients of
        # closed loops are dropped (their connections died with the loop).
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None or client.is_closed:
            for old in [lp for lp in self._clients if lp.is_closed()]:
                del self._clients[old]
            client = ServerClient(read_timeout=self.timeout.read, connect_timeout=self.timeout.connect or 10.0,
                                  headers=self.headers)
            self._clients[loop] = client
        return client

    # ---- generation -----------------------------------------------------------------------

    async def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams, *,
                       hints: Mapping[str, Any] | None = None) -> Generation:
        """Sample a turn after `prompt_ids` on the rollout's server. Cancelling the awaiting task
        aborts the request on the server."""
        if self._closed:
            raise EngineError(f"{self.kind} engine is closed: create a new one")
        hints = hints or {}
        prompt = self.checked_prompt(prompt_ids, hints.get("rollout_id"))
        i = self.server_for(hints.get("rollout_id"))
        url = self.urls[i]
        if url in self.stale:  # its last weight sync failed verification: never sample stale weights
            raise EngineError(self.stale[url])
        rid = str(hints.get("call_id") or f"rowgrove-{uuid.uuid4().hex}")
        version = self.weights_version
        self.in_flight[i] += 1
        try:
            images = hints.get("images") or ()
            if images:
                if not self.takes_images:
                    raise BadRequest(f"the {self.kind} engine does not pass images to its server: serve a "
                                     "vision model with --engine sglang, hf or scripted", param="messages")
                gen = await self._generate(self._client(), url, prompt, sampling, rid, images=images)
            else:
                gen = await self._generate(self._client(), url, prompt, sampling, rid)
        except asyncio.CancelledError:
            await self._abort_quietly(url, rid)
            raise
        except TimeoutError as e:  # the client's read/connect timeouts (the gateway's own is a cancel)
            await self._abort_quietly(url, rid)
            raise EngineError(f"{self.kind} server {url} timed out on request {rid} ({type(e).__name__}): "
                              "retry, or raise the engine timeout", timeout=True) from None
        except ConnectFailed as e:
            raise EngineError(f"cannot connect to the {self.kind} server {url} for request {rid} ({e.os_error or e}): "
                              "is the server running at that URL?") from None
        except OSError as e:  # ServerDisconnected (a ConnectionError) and socket errors
            raise EngineError(f"{self.kind} server {url} failed on request {rid}: {type(e).__name__}: {e or 'connection lost'}"
                              " (is the server running at that URL?)") from None
        finally:
            self.in_flight[i] -= 1
        if gen.weight_versions is None:
            gen.weight_versions = [version] * len(gen.token_ids)
        check_generation(gen, self.vocab_size, f"{self.kind} server {url}")
        return gen

    def checked_prompt(self, prompt_ids: Sequence[int], rollout_id: str | None) -> Sequence[int]:
        """`check_prompt(prompt_ids)`: the prompt as ints, InputError when it is empty or holds an
        id outside the vocabulary. A rollout's prompt starts with its previous one (that prompt,
        what was sampled, the new messages), so the part equal to the rollout's last checked
        prompt is not checked again: an `ExtendedIds` built on that very list is taken as it is
        (only what follows it is checked, and it is returned itself, never joined), any other
        prompt is compared with it (C speed): checking each id in Python cost 6-7 ms at 88k
        prompt ids, per call (docs/gateway.md, "Long conversations"). Equal values are the same
        ids, so what is returned reads as the list `check_prompt` returns."""
        held = self._checked.get(rollout_id) if rollout_id is not None else None
        n = len(held.ids) if held is not None else 0
        if held is not None and type(prompt_ids) is ExtendedIds and len(prompt_ids) > n and (
                prompt_ids.base is held.ids or prompt_ids[:n] == held.ids):
            # a continuation's prompt as the gateway builds it: when it extends the very list
            # checked last, the prefix is not even compared; the list is kept, not copied, so the
            # next call's prompt extends it
            rest = prompt_ids[n:]
            new = check_prompt(rest, self.vocab_size)
            prompt = prompt_ids if plain_ints(rest) else held.ids + new
            memo = _Checked(prompt, (held.json, n) if held.json is not None else None)
        elif held is not None and type(prompt_ids) is list and len(prompt_ids) > n and prompt_ids[:n] == held.ids:
            prompt = held.ids + check_prompt(prompt_ids[n:], self.vocab_size)
            memo = _Checked(prompt, (held.json, n) if held.json is not None else None)
        else:
            prompt = check_prompt(prompt_ids, self.vocab_size)
            memo = _Checked(prompt, None)
        self._last_checked = memo
        if rollout_id is not None:
            if held is not None:
                self._checked_ids -= n
            self._checked[rollout_id] = memo
            self._checked.move_to_end(rollout_id)
            self._checked_ids += len(prompt)
            while self._checked_ids > _CHECKED_IDS and len(self._checked) > 1:
                self._checked_ids -= len(self._checked.popitem(last=False)[1].ids)
        return prompt

    def prompt_json(self, prompt: list[int]) -> bytes:
        """`orjson.dumps(prompt)`, for the prompt `checked_prompt` returned last: when it extends
        its rollout's previous prompt, whose JSON was written, that JSON is reused and only the
        new ids are written (a copy of bytes instead of writing 88k ids anew: 0.6-1 ms a call)."""
        memo = self._last_checked
        if memo is None or memo.ids is not prompt:
            return orjson.dumps(as_list(prompt))
        if memo.json is None:
            if memo.head is not None:
                head, n = memo.head
                memo.json = b"".join((memoryview(head)[:-1], b",", memoryview(orjson.dumps(prompt[n:]))[1:]))
            else:
                memo.json = orjson.dumps(as_list(prompt))
            memo.head = None
        return memo.json

    async def _abort_quietly(self, url: str, rid: str) -> None:
        try:
            await asyncio.shield(asyncio.wait_for(self._abort(self._client(), url, rid), 5.0))
        except BaseException:  # noqa: BLE001 - a failed abort must not hide why we aborted
            pass

    def raise_for_status(self, url: str, r: httpx.Response | Reply, rid: str) -> None:
        """Map a server's error status to rowgrove's errors (see the module docstring)."""
        if r.status_code < 400:
            return
        detail = server_message(r)
        where = f"{self.kind} server {url} answered {r.status_code} for request {rid}: {detail}"
        if r.status_code in (429, 503):
            raise Unavailable(f"{where}: it is overloaded, retry later", retry_after(r))
        if r.status_code >= 500:
            raise EngineError(where)
        if r.status_code in (401, 403):
            raise EngineError(f"{where}: give the engine the server's API key (--engine-api-key)")
        if r.status_code == 404:
            raise EngineError(f"{where}: is this a {self.kind} server? check --engine and --engine-url")
        raise BadRequest(where, code="engine_rejected")

    # ---- start-up check -------------------------------------------------------------------

    def check(self) -> None:
        """Refuse to start unless every server answers and tokenizes like the local model folder.
        EngineError naming the server and what differs."""
        problems: list[str] = []
        with httpx.Client(timeout=httpx.Timeout(30.0, connect=self.timeout.connect), headers=self.headers) as http:
            for url in self.urls:
                try:
                    found = self._probe(http, url)
                except httpx.HTTPError as e:
                    found = [f"cannot reach it ({type(e).__name__}: {e}): start the server or fix --engine-url"]
                except (ValueError, KeyError, TypeError) as e:
                    found = [f"its answer is not in {self.kind}'s format ({type(e).__name__}: {e}): "
                             "check --engine"]
                problems += [f"{url}: {p}" for p in found]
        if problems:
            raise EngineError(f"refusing the {self.kind} server(s) for the model folder {self.model_path}: "
                              + "; ".join(problems))

    def probe_ids(self) -> list[int]:
        """The local tokenization of the probe text (no special tokens added)."""
        return list(self.tokenizer.encode(PROBE_TEXT, add_special_tokens=False))

    def compare_ids(self, theirs: Any, what: str = "the probe text", ours: list[int] | None = None,
                    fix: str | None = None) -> list[str]:
        """[] when the server's ids for `what` equal `ours` (default: the local ids of the probe
        text), else one problem line naming the first difference and what each side has there."""
        ours = self.probe_ids() if ours is None else ours
        if isinstance(theirs, list) and theirs == ours:
            return []
        fix = fix or f"serve the same tokenizer as {self.model_path}"
        if not isinstance(theirs, list):
            return [f"it answered {theirs!r} where the ids of {what} belong: {fix}"]
        first = next((k for k, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b),
                     min(len(ours), len(theirs)))
        return [f"it tokenizes {what} differently (local {len(ours)} ids, server {len(theirs)}; first "
                f"difference at position {first}: local {self._show(ours[first:first + 4])}, server "
                f"{self._show(theirs[first:first + 4])}): {fix}"]

    def _show(self, ids: list[Any]) -> str:
        if not ids:
            return "(end)"
        try:
            text = self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)
        except (ValueError, TypeError, OverflowError):
            return repr(ids)
        return f"{ids} {text!r}"

    def probe_chat_ids(self) -> list[int] | None:
        """The local chat template's ids for `PROBE_MESSAGES` with the generation prompt (None
        when the folder has no chat template)."""
        if not getattr(self.tokenizer, "chat_template", None):
            return None
        text = self.tokenizer.apply_chat_template(list(PROBE_MESSAGES), tokenize=False, add_generation_prompt=True)
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def compare_chat_ids(self, theirs: Any) -> list[str]:
        """[] when the server's chat template gives the local ids for `PROBE_MESSAGES`, else one
        problem line (a server that serves another folder over the same tokenizer shows here)."""
        ours = self.probe_chat_ids()
        if ours is None:
            return []
        return self.compare_ids(theirs, "the probe conversation through its chat template", ours,
                                fix=f"it serves another model folder than {self.model_path} (or was started "
                                    "with another --chat-template): serve that folder")

    # ---- weights --------------------------------------------------------------------------

    def update_weights(self, weights: Mapping[str, Any] | str | Path, *,
                       reference: Reference | None = None) -> None:
        """Make every server sample with new weights, verify it, then bump `weights_version`.

        `weights`: a state dict (written as a checkpoint under `sync_dir` first; for a model with
        tied embeddings `lm_head.weight` is written too, see `verify.with_tied_head`) or the folder
        of a checkpoint every server can read. `reference(ids)`: the trainer's logprobs of
        `ids[1:]` (`verify.policy_logprobs(model, ids)`); default: a CPU fp32 mirror of the model
        that took the same updates. Blocks until all servers report it loaded; EngineError when one
        cannot load it; WeightSyncError (naming the server, the version and the largest
        difference) when a server's probe logprobs differ beyond `sync_tolerance`: that server then
        serves no call until a later sync passes, and the version is not bumped."""
        version = self.weights_version + 1
        if isinstance(weights, str | Path):
            folder = self._loadable(Path(weights), version)
        else:
            if self.sync_dir is None:
                raise InputError(f"{self.kind} engine: update_weights with a state dict needs sync_dir, a folder "
                                 "the servers can read (rowgrove train sets it to RUN_DIR/weights)")
            weights = with_tied_head(weights, self.model_path / "config.json")
            folder = write_checkpoint(weights, self.sync_dir / f"v{version:06d}", self.model_path)
        checking = self.sync_tolerance != float("inf")
        with httpx.Client(timeout=httpx.Timeout(None, connect=self.timeout.connect), headers=self.headers) as http:
            for url in self.urls:
                try:
                    self._reload(http, url, folder, version)
                except httpx.HTTPError as e:
                    raise EngineError(f"{self.kind} server {url}: loading weights from {folder} failed: "
                                      f"{type(e).__name__}: {e}") from None
            if checking:
                self._verify(http, folder, version, reference)
        self.weights_version = version
        if self.sync_dir is not None and not isinstance(weights, str | Path):
            prune_checkpoints(self.sync_dir, keep=2)

    def _loadable(self, folder: Path, version: int) -> Path:
        """The folder to ask the servers to load for a checkpoint folder `folder` (subclasses may
        rewrite a layout their server reloads wrongly into `sync_dir`)."""
        return folder

    def sync_probe_ids(self) -> list[int]:
        """The probe a sync is verified on: the probe conversation through the chat template (the
        probe text where the folder has none), about 30 tokens of markers, words and digits."""
        return self.probe_chat_ids() or self.probe_ids()

    def _verify(self, http: httpx.Client, folder: Path, version: int, reference: Reference | None) -> None:
        """Compare every server's probe logprobs with the reference; mark and refuse the ones
        that differ beyond `sync_tolerance` (see update_weights)."""
        ids = self.sync_probe_ids()
        if reference is None:
            try:
                self._mirror.apply(folder)  # what the servers read, in the order they read it
            except OSError as e:
                msg = (f"cannot verify weight version {version}: the checkpoint {folder} is not readable here "
                       f"({e}); pass the trainer's logprobs (update_weights(..., reference=)) or a folder both "
                       "sides can read")
                for url in self.urls:
                    self.stale[url] = f"{self.kind} server {url}: {msg}"
                raise WeightSyncError(msg) from None
        expected = list(reference(ids)) if reference is not None else self._mirror.logprobs(ids)
        failures: list[str] = []
        for url in self.urls:
            try:
                got = self._score(http, url, ids)
            except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError) as e:
                got, why = None, f"{type(e).__name__}: {e}"
            else:
                why = "it gave no prompt logprobs"
            if got is None:
                msg = (f"{self.kind} server {url}: cannot verify weight version {version} (from {folder}): {why}; "
                       "it serves no call until a sync is verified")
            else:
                worst, at = largest_difference(expected, got)
                if worst <= self.sync_tolerance:
                    self.stale.pop(url, None)
                    continue
                msg = (f"{self.kind} server {url} serves other weights than the trainer after loading weight "
                       f"version {version} from {folder}: its logprobs on the {len(ids)}-token probe differ by up to "
                       f"{worst:.3g} (position {at}; tolerance {self.sync_tolerance:g}). "
                       + self._stale_hint(folder)
                       + " It serves no call until a later sync is verified.")
            self.stale[url] = msg
            failures.append(msg)
        if failures:
            raise WeightSyncError(" | ".join(failures))

    def _stale_hint(self, folder: Path) -> str:
        """What to do when a server's logprobs differ after a sync (subclasses know their server)."""
        return ("Check that the server loads this folder (same dtype, same architecture); raise the tolerance "
                "(sync_tolerance, $ROWGROVE_SYNC_TOLERANCE) only for a lower-precision server.")

    def _score(self, http: httpx.Client, url: str, ids: list[int]) -> list[float] | None:
        """The server's log p(ids[i] | ids[:i]) for i >= 1 (None when it cannot say)."""
        return None

    async def release_loop(self) -> None:
        """Close the connections of the running event loop (its server is stopping); a later call
        on another loop opens new ones."""
        client = self._clients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.aclose()

    async def aclose(self) -> None:
        """Refuse further calls and close the HTTP clients: this loop's here, another running
        loop's on that loop; those of closed loops died with them."""
        self._closed = True
        clients, self._clients = dict(self._clients), {}
        here = asyncio.get_running_loop()
        for loop, c in clients.items():
            try:
                if loop is here:
                    await c.aclose()
                elif not loop.is_closed():
                    asyncio.run_coroutine_threadsafe(c.aclose(), loop)
            except RuntimeError:  # its loop is closing: nothing left to close
                pass

    # ---- the wire format (subclasses) -----------------------------------------------------

    @abstractmethod
    async def _generate(self, client: ServerClient, url: str, prompt: list[int],
                        sampling: SamplingParams, rid: str) -> Generation:
        """One request to the server at `url`, read into a Generation."""

    async def _abort(self, client: ServerClient, url: str, rid: str) -> None:
        """Tell the server to stop request `rid` (closing the connection may be enough)."""

    @abstractmethod
    def _probe(self, http: httpx.Client, url: str) -> list[str]:
        """What makes the server at `url` unfit for this model folder ([] when nothing)."""

    @abstractmethod
    def _reload(self, http: httpx.Client, url: str, folder: Path, version: int) -> None:
        """Make the server at `url` load the checkpoint in `folder` as weight version `version`."""


def server_message(r: httpx.Response) -> str:
    """The error text of a server's reply: OpenAI's {"error": {"message"}}, vLLM's {"message"},
    FastAPI's {"detail"}, or the raw text (shortened)."""
    try:
        body = r.json()
    except ValueError:
        return (r.text or r.reason_phrase or "no body")[:300]
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])[:300]
        for key in ("message", "detail", "error"):
            if body.get(key):
                return str(body[key])[:300]
    return str(body)[:300]


def retry_after(r: httpx.Response, default: float = 1.0) -> float:
    """The server's Retry-After in seconds (numbers only), else `default`."""
    try:
        return max(0.0, float(r.headers.get("retry-after", default)))
    except ValueError:
        return default


def write_checkpoint(state_dict: Mapping[str, Any], folder: Path, model_path: Path) -> Path:
    """`state_dict` as a Hugging Face checkpoint in `folder` (model.safetensors plus the model
    folder's config files), written to a temporary name and renamed, so a server never reads a
    half-written checkpoint. Returns `folder`."""
    import torch
    from safetensors.torch import save_file

    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    # clone: tied weights share storage, which safetensors refuses to write twice
    tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in state_dict.items()
               if isinstance(v, torch.Tensor)}
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    for name in ("config.json", "generation_config.json"):
        if (model_path / name).is_file():
            shutil.copy2(model_path / name, tmp / name)
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    return folder


def prune_checkpoints(sync_dir: Path, keep: int) -> None:
    """Delete all but the newest `keep` checkpoints rowgrove wrote under `sync_dir`."""
    written = sorted(p for p in sync_dir.glob("v[0-9]*") if p.is_dir() and not p.name.endswith(".tmp"))
    for p in written[:-keep]:
        shutil.rmtree(p, ignore_errors=True)
