"""The gateway's service core, without HTTP: per-rollout state, authorization, the bounded count of
in-flight generations, SDK-retry replay, and the life of one call (decide → ledger pending →
engine → parse → ledger completed → answer).

Ordering promises kept here:
- every refusal (bad request, key, unknown or finished rollout, full queue) is raised before the
  ledger is touched, so a rejected request changes nothing in it;
- a call is written `pending` before the engine is asked, and `completed` (or `failed`/`aborted`)
  before its answer is returned, so no response reaches a harness without its committed call;
- an SDK retry (`x-stainless-retry-count` > 0, same body) gets the original call's response and
  is never generated or recorded twice;
- every engine's answer is checked (`check_generation`) before it is stored: a bad one is a
  failed call and a 502;
- a completed call whose answer did not reach the client is moved to aborted (`undelivered`,
  called by the HTTP layer), so it is never trained and never a parent.

Concurrency: everything here runs on the server's one event loop. The per-rollout index is read
and updated only between awaits, so concurrent calls of one rollout each see a consistent index
and find their own parent; no lock is needed beyond the loop itself. Under load a call yields the
loop after its checks and after `decide` (`_next_stage`), so the calls of one turn pass those
stages together; what a yield may change is checked again before the pending write. Ledger
writes are short SQLite transactions made directly on the loop (well under a millisecond each in
WAL mode).
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import logging
import os
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rowgrove.engines.base import Engine, check_generation
from rowgrove.errors import (
    AuthError,
    BadRequest,
    Conflict,
    EngineError,
    Overloaded,
    RowgroveError,
    Unavailable,
)
from rowgrove.gateway.core.decide import (
    NO_IMAGES,
    Decision,
    RolloutIndex,
    check_request,
    decide,
    response_message,
    summary_hashes,
)
from rowgrove.gateway.dialects.growing import GrowingBody
from rowgrove.gateway.dialects.openai_format import (
    ChatRequest,
    TokenText,
    completion_body,
    logprobs_content,
)
from rowgrove.gateway.deadlines import Deadlines
from rowgrove.gateway.metrics import GatewayMetrics, call_kind
from rowgrove.gateway.core.render import Renderer
from rowgrove.hashing import PrefixHasher
from rowgrove.ledger import Ledger
from rowgrove.parsers import parse_output, tool_call_id_style
from rowgrove.types import Call, Rollout

from rowgrove.gateway.settings import (  # noqa: F401 (re-exported: sessions was their home)
    MAX_JSON_DEPTH,
    MiB,
    BodyTimeout,
    BodyTooLarge,
    GatewaySettings,
    TooManyUploads,
    choose_parsers,
    is_loopback,
    model_context_length,
)

# ROWGROVE_TEST_DIE_AFTER_COMMIT=1: the process exits at once after a call's commit, before its
# response is sent (tests/reliability/test_crash_retry.py); read once, at import
_DIE_AFTER_COMMIT = os.environ.get("ROWGROVE_TEST_DIE_AFTER_COMMIT") == "1"

log = logging.getLogger("rowgrove.gateway")


@dataclass
class Completion:
    """What `Gateway.complete` answers: the `chat.completion` body, its call id, and whether this
    request generated it (False: an SDK retry answered with the original call's response)."""

    body: dict[str, Any]
    call_id: str
    generated: bool


@dataclass
class RolloutSession:
    """What the gateway keeps in memory for one rollout: its key, status and lineage index.

    `index` is built lazily from the ledger (so a restarted server continues where it stopped);
    `inflight` maps the request key (`request_key`) of each call still generating to a future of its response,
    for SDK retries that arrive before the original finished. `responses` keeps, per Responses
    API response id, the conversation that response ends (`gateway.dialects.responses_api`).
    """

    rollout_id: str
    group_id: str | None
    api_key: str
    finished: bool
    index: RolloutIndex | None = None
    inflight: dict[str, asyncio.Future] = field(default_factory=dict)
    # Responses API: response id -> the conversation it ends (what previous_response_id continues)
    responses: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # Responses / Messages API: input items already checked, by their JSON (validation.checked_items)
    checked: dict[bytes, Any] = field(default_factory=dict)
    # the retry keys of its request bodies (`request_key`), each hashed from a recent body's state
    body_keys: PrefixHasher = field(default_factory=PrefixHasher)
    # per route, its request bodies decoded by what each adds to the last (`dialects.growing`)
    growing: dict[str, GrowingBody] = field(default_factory=dict)

    def growing_body(self, route: str, key: str) -> GrowingBody:
        """The `GrowingBody` of this rollout's bodies on `route`, whose array `key` grows."""
        g = self.growing.get(route)
        if g is None:
            g = self.growing[route] = GrowingBody(key)
        return g

    def request_key(self, raw: bytes) -> str:
        """`openai_format.request_key(raw)` for a request body of this rollout, hashing only what
        it adds to a recent body (docs/gateway.md, "Long conversations")."""
        return self.body_keys.hexdigest(raw)[:32]


def _same_key(given: str | None, expected: str) -> bool:
    return given is not None and secrets.compare_digest(given.encode(), expected.encode())


class Gateway:
    """The capture service in front of one engine and one ledger (one per server)."""

    def __init__(self, engine: Engine, ledger: Ledger, settings: GatewaySettings | None = None):
        self.engine = engine
        self.ledger = ledger
        self.settings = settings or GatewaySettings()
        self.tokenizer = engine.tokenizer
        from rowgrove.gateway.images import gateway_vision

        self.renderer = Renderer(self.tokenizer, vision=gateway_vision(self.tokenizer, ledger, self.settings.media_folder))
        self.stop_ids = self.renderer.stop_ids
        self.eot_id = self.renderer.end_of_turn_id
        self.tool_parser, self.reasoning_parser = choose_parsers(self.tokenizer.chat_template, self.settings)
        self.tool_call_ids = tool_call_id_style(self.tokenizer.chat_template)
        self.token_text = TokenText(self.tokenizer)
        self.max_context = model_context_length(self.tokenizer, engine)
        self.vocab_size = int(getattr(engine, "vocab_size", None) or len(self.tokenizer))
        self.sessions: dict[str, RolloutSession] = {}
        self.keys: dict[str, str] = {}  # api_key -> rollout id, of the keys plain /v1 calls used
        self.deadlines = Deadlines()
        self.in_flight = 0
        self.serving = 0  # calls inside `complete` (any stage), of every rollout
        self.open_uploads = 0
        self.closing = False
        # the base of every base_url: the configured public address, else set by the server once
        # it has bound its socket (`rowgrove.gateway.server`); never taken from request headers
        self.public_url: str | None = self.settings.public_url.rstrip("/") if self.settings.public_url else None
        self.model_name: str = (self.settings.model_name or getattr(engine, "served_model", None)
                                or getattr(engine, "model_name", None) or "rowgrove")
        self._proxies = tuple(ipaddress.ip_network(p, strict=False) for p in self.settings.trusted_proxies)
        self.metrics = GatewayMetrics(in_flight=lambda: self.in_flight, open_uploads=lambda: self.open_uploads,
                                      queue_capacity=self.settings.max_queue, rollouts=ledger.count)

    # -- rollouts and keys ------------------------------------------------------------------

    def start(self) -> int:
        """Mark calls a crash left pending as aborted; returns how many."""
        return self.ledger.abort_pending()

    def create_rollout(self, group_id: str, metadata: Mapping[str, Any] | None) -> Rollout:
        """A new rollout; Unavailable (503) while the server is shutting down."""
        self._check_open()
        return self._opened(self.ledger.create_rollout(group_id, dict(metadata or {})))

    async def acreate_rollout(self, group_id: str, metadata: Mapping[str, Any] | None) -> Rollout:
        """`create_rollout` in the ledger's group commit (what the HTTP route calls): committed,
        with this loop turn's calls, before it is returned."""
        self._check_open()
        return self._opened(await self.ledger.acreate_rollout(group_id, dict(metadata or {})))

    def _check_open(self) -> None:
        if self.closing:
            raise Unavailable("the gateway is shutting down: create the rollout on a running server",
                              self.settings.retry_after)

    def _opened(self, ro: Rollout) -> Rollout:
        self.sessions[ro.id] = RolloutSession(ro.id, ro.group_id, ro.api_key, finished=False)
        return ro

    def session(self, rollout_id: str) -> RolloutSession:
        """The rollout's session, loaded from the ledger on first use; NotFound if unknown."""
        s = self.sessions.get(rollout_id)
        if s is None:
            ro = self.ledger.get_rollout(rollout_id)
            s = RolloutSession(ro.id, ro.group_id, ro.api_key, finished=ro.status == "finished")
            self.sessions[ro.id] = s
        return s

    def session_by_key(self, key: str | None) -> RolloutSession:
        """The session of the rollout whose api_key is `key`: a call at the plain base URL
        (`http://HOST:PORT/v1`) names its rollout by key alone. AuthError for no key or a key
        no rollout has."""
        if key:
            rid = self.keys.get(key)
            if rid is None:
                ro = self.ledger.rollout_by_key(key)
                rid = ro.id if ro is not None else None
            if rid is not None:
                s = self.session(rid)
                if _same_key(key, s.api_key):
                    self.keys[key] = rid
                    return s
        raise AuthError(
            ("no rollout has this API key" if key else "a call at the plain base URL needs its rollout's API key")
            + ": send the api_key POST /v1/rollouts returned (Authorization: Bearer KEY or x-api-key: KEY), "
            "or call the base_url it returned (http://HOST:PORT/rollouts/{rollout_id}/v1)"
        )

    def authorize_call(self, session: RolloutSession, key: str | None) -> None:
        """Only the rollout's own key may call its base_url."""
        if not _same_key(key, session.api_key):
            raise AuthError(
                f"wrong or missing API key for rollout {session.rollout_id}: use the api_key "
                "POST /v1/rollouts returned with this rollout's base_url"
            )

    def authorize_control(self, key: str | None, client_host: str | None,
                          session: RolloutSession | None = None) -> None:
        """Control routes: the rollout's own key for its own routes, the admin key when the server
        has one, and otherwise any loopback caller."""
        if session is not None and _same_key(key, session.api_key):
            return
        admin = self.settings.admin_key
        if admin is not None:
            if _same_key(key, admin):
                return
            raise AuthError("this route needs the admin key (rowgrove serve --admin-key) as Bearer token")
        if is_loopback(client_host):
            return
        raise AuthError(
            f"control routes are open to loopback callers only (caller {client_host}): start "
            "rowgrove serve with --admin-key and send it as Bearer token"
        )

    def client_host(self, peer: str | None, forwarded_for: str | None) -> str | None:
        """The address to authorize a control route by: the socket peer, unless the peer is a
        trusted proxy (`trusted_proxies`); then the nearest X-Forwarded-For hop that is not a
        trusted proxy (the leftmost when all are), or None when the proxy sent no such header."""
        if not self._proxies or not self._trusted(peer):
            return peer
        hops = [h.strip().strip("[]") for h in (forwarded_for or "").split(",") if h.strip()]
        if not hops:
            return None
        for hop in reversed(hops):
            if not self._trusted(hop):
                return hop
        return hops[0]

    def _trusted(self, host: str | None) -> bool:
        if not host:
            return False
        try:
            addr = ipaddress.ip_address(host)
        except ValueError:
            return False
        mapped = getattr(addr, "ipv4_mapped", None)
        return any(addr in net or (mapped is not None and mapped in net) for net in self._proxies)

    def _index(self, session: RolloutSession) -> RolloutIndex:
        if session.index is None:
            session.index = RolloutIndex.from_calls(self.ledger.calls(session.rollout_id))
            if self.renderer.vision is not None:  # the kept-image evidence, as the ledger holds it
                for cid, (blind, places) in self.ledger.image_summaries(session.rollout_id).items():
                    if cid in session.index:
                        session.index.add_images(cid, blind, places)
        return session.index

    # -- one call ---------------------------------------------------------------------------

    def _fit_context(self, req: ChatRequest, prompt_len: int) -> ChatRequest:
        """The request with max_tokens capped to the room left in the model's context; BadRequest
        (code context_length_exceeded) when the prompt alone fills it. Without this a prompt of
        millions of tokens would tie up an engine worker."""
        if self.max_context is None:
            return req
        room = self.max_context - prompt_len
        if room < 1:
            raise BadRequest(
                f"the rendered prompt has {prompt_len} tokens and the model's context is {self.max_context}: "
                "shorten the conversation (compact it) and retry", param="messages", code="context_length_exceeded")
        if req.sampling.max_tokens <= room:
            return req
        return dataclasses.replace(req, sampling=dataclasses.replace(req.sampling, max_tokens=room))

    async def replay(self, session: RolloutSession, key: str) -> dict[str, Any] | None:
        """The original response for an SDK retry of the request with this key, or None when
        there is none to give (never sent, or the original failed): then generate anew."""
        fut = session.inflight.get(key)
        if fut is not None:
            try:
                return await asyncio.shield(fut)
            except Exception:
                return None
        call = self.ledger.find_retry(session.rollout_id, key)
        if call is not None and call.status == "completed" and call.response is not None:
            return call.response
        return None

    async def chat(self, session: RolloutSession, req: ChatRequest, *, key: str,
                   retry: bool) -> dict[str, Any]:
        """Serve one chat completion: the `chat.completion` body, committed before it is returned
        (`complete` without the delivery details)."""
        return (await self.complete(session, req, key=key, retry=retry)).body

    async def complete(self, session: RolloutSession, req: ChatRequest, *, key: str,
                       retry: bool) -> Completion:
        """Serve one chat completion, committed before it is returned.

        Raises BadRequest/Conflict/Overloaded/Unavailable before any ledger write; EngineError
        (call marked failed) when the engine fails, times out (the engine request is cancelled)
        or answers something that is not a generation (`check_generation`). Cancelling the task
        (client gone) marks the call aborted and cancels the engine request.
        """
        self._check_callable(session)
        if retry:
            # an SDK retry carries the same body as its original (the key is the body's hash), which
            # was validated then; the answer is the original's, so nothing is decided or written
            original = await self.replay(session, key)
            if original is not None:
                return Completion(original, str(original.get("id", "")), generated=False)
            if session.finished:
                raise Conflict(f"rollout {session.rollout_id} is finished: start a new rollout for more calls")
        # registered before the first await (the stage yields below), so that a retry of this body
        # arriving meanwhile waits for this call's answer instead of generating it a second time
        fut: asyncio.Future = asyncio.get_running_loop().create_future()
        fut.add_done_callback(_consume_exception)
        session.inflight[key] = fut
        self.serving += 1
        try:
            return await self._complete(session, req, key, fut)
        except BaseException as e:
            if not fut.done():
                fut.set_exception(e if isinstance(e, Exception) else EngineError("call was cancelled"))
            raise
        finally:
            self.serving -= 1
            if session.inflight.get(key) is fut:
                del session.inflight[key]

    async def _complete(self, session: RolloutSession, req: ChatRequest, key: str,
                        fut: asyncio.Future) -> Completion:
        await self._next_stage(session)  # the request's checks done; decide with the turn's other calls
        plan = self._plan(session, req)
        if plan.images and not getattr(self.engine, "takes_images", True):  # refused before the ledger
            raise BadRequest(f"the {getattr(self.engine, 'kind', 'configured')} engine does not pass images to its "
                             "server: serve a vision model with --engine sglang, hf or scripted", param="messages")
        req = self._fit_context(req, len(plan.full_prompt_ids))
        await self._next_stage(session)  # decided; write pending with the turn's other calls
        if self.in_flight >= self.settings.max_queue:
            raise Overloaded(
                f"{self.in_flight} generations in flight (max_queue {self.settings.max_queue}): retry "
                f"after {self.settings.retry_after:g} s",
                self.settings.retry_after,
            )
        self.in_flight += 1
        kind = call_kind(plan.parent_id, plan.drift)
        status = "aborted"
        try:
            # the pending row is committed before the engine is asked: sharing its commit with
            # the calls of this loop turn (group commit), or at once when no other call is being
            # served (`_lone`)
            pending = dict(parent_id=plan.parent_id, prompt_ids=plan.prompt_ids, prompt_len=len(plan.full_prompt_ids),
                           request_hash=plan.request_hash, request_key=key, history_drift=plan.drift)
            if self._lone():
                call = self.ledger.begin_call(session.rollout_id, **pending)
            else:
                call = await self.ledger.abegin_call(session.rollout_id, **pending)
            if plan.images:
                self._store_images(call.id, plan)
            for tool_type in req.hosted_tools:  # not `kind`: call_ended below reports the call's kind
                self.metrics.hosted_dropped.inc(tool_type)
            body = await self._generate_and_commit(session, req, call, plan)
            status = "completed"
        except BaseException as e:
            if isinstance(e, Exception) and not isinstance(e, asyncio.CancelledError):
                status = "failed"
            if not fut.done():
                fut.set_exception(e if isinstance(e, Exception) else EngineError("call was cancelled"))
            raise
        else:
            fut.set_result(body)
            return Completion(body, call.id, generated=True)
        finally:
            self.in_flight -= 1
            self.metrics.call_ended(status, kind)

    def prompt_tokens(self, session: RolloutSession, req: ChatRequest) -> int:
        """The number of tokens of the prompt `complete` would send the engine for `req` in
        `session`: decided against the rollout's calls as a call is (a continuation counts its
        parent's exact tokens), rendered by the same path, with no generation and no ledger write
        (`POST .../v1/messages/count_tokens`). BadRequest as `complete` for what it refuses."""
        return len(self._plan(session, req).full_prompt_ids)

    def _plan(self, session: RolloutSession, req: ChatRequest):
        """`decide` for `req` against the rollout's calls, the request's images resolved once, here
        at the edge, before it."""
        messages, images = req.messages, NO_IMAGES
        vision = self.renderer.vision
        if vision is not None:
            from rowgrove.gateway.images import load_request_images

            check_request(messages, req.tools, req.chat_template_kwargs)
            messages, images = load_request_images(messages, folder=vision.folder, lookup=vision.lookup)
        return decide(self._index(session), messages, self.renderer, tools=req.tools,
                      options=req.chat_template_kwargs, images=images)

    def _lone(self) -> bool:
        """Whether the call being served is the only one: then its ledger writes commit at once
        (`Ledger.begin_call`, `complete_call`) instead of joining a group commit, which a lone
        call would wait two loop turns for with nothing to share it: a future, two turns of the
        loop and a wake-up of its task, twice per call (docs/gateway.md, "Durability"). The
        guarantees are the same: each write is committed before the call goes on."""
        return self.serving <= 1

    def _check_callable(self, session: RolloutSession) -> None:
        if session.finished:
            raise Conflict(f"rollout {session.rollout_id} is finished: start a new rollout for more calls")
        if self.closing:
            raise Unavailable("the gateway is shutting down: retry on a running server",
                              self.settings.retry_after)

    async def _next_stage(self, session: RolloutSession) -> None:
        """Yield the loop once when other calls are in flight, so that the calls which
        arrived in one loop turn pass each stage of `complete` together: all check their requests,
        then all render and tokenize (`decide`), then all write their pending rows, rather than
        each running every stage in turn. A stage's code (MiniJinja, the tokenizer, SQLite) then
        runs from a warm CPU cache for the turn's calls after the first: at 32 concurrent rollouts
        this cut the gateway's CPU per call by about 8% (bench/bench_gateway.py), where the
        renderer and tokenizer spent 3-4x their warm time. A lone call (nothing else in flight)
        does not wait. What the wait may have changed (the rollout finished, the server closing)
        is checked again after it."""
        if self.in_flight:
            await asyncio.sleep(0)
            self._check_callable(session)

    def undelivered(self, session: RolloutSession, call_id: str, why: str) -> bool:
        """Record that the response of completed call `call_id` did not reach the client in full:
        the ledger moves it to aborted (never trained, never a parent). True when it changed."""
        changed = self.ledger.mark_undelivered(call_id, why)
        if changed:
            log.warning("call %s of rollout %s was not delivered: %s", call_id, session.rollout_id, why)
            kind = "root"
            if session.index is not None and call_id in session.index:
                session.index = None  # rebuilt from the ledger, where the call is no longer completed
            try:
                c = self.ledger.get_call(call_id)
                kind = call_kind(c.parent_id, c.history_drift)
            except RowgroveError:
                pass
            self.metrics.call_ended("undelivered", kind)
        return changed

    async def _generate_and_commit(self, session: RolloutSession, req: ChatRequest, call: Call,
                                   plan: Decision) -> dict[str, Any]:
        # rollout_id keeps a rollout on one server (prefix cache); call_id names the request there
        hints = {"ordinal": call.ordinal, "script": req.script, "rollout_id": session.rollout_id,
                 "call_id": call.id}
        if plan.images:
            hints["images"] = plan.images  # rowgrove.media.Image, in prompt order: the engine's pixels
        # the weights the engine holds as it is asked: every token's version when it reports none
        version_before = getattr(self.engine, "weights_version", 0)
        t0 = time.perf_counter()
        try:
            # on timeout the engine's coroutine is cancelled: the engine drops the request (awaited
            # in this task, not wrapped in one of its own as wait_for does before Python 3.12);
            # the deadline is a coarse shared one (gateway.deadlines: no loop timer per call)
            async with self.deadlines.timeout(self.settings.engine_timeout):
                gen = await self.engine.generate(plan.full_prompt_ids, req.sampling, hints=hints)
        except asyncio.CancelledError as e:
            why = " ".join(str(a) for a in e.args) or "request cancelled"
            self.ledger.end_call(call.id, "aborted", why)
            raise
        except TimeoutError:
            self.ledger.end_call(call.id, "failed", f"engine timed out after {self.settings.engine_timeout:g} s")
            raise EngineError(
                f"the engine did not answer call {call.id} within {self.settings.engine_timeout:g} s: "
                "retry, or raise --engine-timeout", timeout=True) from None
        except Exception as e:
            self.ledger.end_call(call.id, "failed", f"{type(e).__name__}: {e}")
            # engine faults, engine overload and a server's refusal of the request keep their status
            if isinstance(e, EngineError | Overloaded | BadRequest):
                raise
            raise EngineError(f"the engine failed on call {call.id}: {type(e).__name__}: {e}") from e
        finally:
            self.metrics.engine_latency.observe(time.perf_counter() - t0)
        try:
            check_generation(gen, self.vocab_size, "the engine", versions=False)
        except EngineError as e:
            # ids outside the vocabulary, a logprob per id missing, NaN/inf logprobs: a fault of
            # the engine, never stored as completed and never the caller's (400) fault
            self.ledger.end_call(call.id, "failed", f"bad generation: {e}")
            raise EngineError(f"call {call.id}: {e}") from None
        versions, problem = call_weight_versions(gen, version_before)
        if problem is not None:
            self.ledger.end_call(call.id, "failed", f"bad weight versions from the engine: {problem}",
                                 sampled_ids=gen.token_ids, logprobs=gen.logprobs)
            raise EngineError(f"the engine answered call {call.id} with bad weight versions ({problem}): "
                              "an engine must give one version >= 0 per sampled token, or none")
        try:
            body, message, finish, reply_text = self._response(req, call, plan, gen)
            if req.hosted_tools:  # recorded on the call: which hosted tools the model was not shown
                body["hosted_tools_dropped"] = list(req.hosted_tools)
            summary, response_hash = summary_hashes(plan, message)
        except Exception as e:
            self.ledger.end_call(call.id, "failed", f"could not read the engine's answer: {type(e).__name__}: {e}",
                                 sampled_ids=gen.token_ids, logprobs=gen.logprobs, weight_versions=versions)
            raise EngineError(f"could not read the engine's answer to call {call.id}: "
                              f"{type(e).__name__}: {e}") from e
        try:
            # committed (with this turn's others, or at once when alone) before the answer
            completed = dict(sampled_ids=gen.token_ids, logprobs=gen.logprobs, finish_reason=finish,
                             summary_hash=summary, response_hash=response_hash, response=body,
                             weight_versions=versions)
            if self._lone():
                self.ledger.complete_call(call.id, **completed)
            else:
                await self.ledger.acomplete_call(call.id, **completed)
        except BaseException as e:
            self.ledger.end_call(call.id, "failed", f"could not record the response: {type(e).__name__}: {e}",
                                 sampled_ids=gen.token_ids, logprobs=gen.logprobs, weight_versions=versions)
            raise
        if _DIE_AFTER_COMMIT:  # tests: a crash between the ledger commit and the response
            os._exit(137)
        if session.index is not None:
            text = None if plan.context_text is None else plan.context_text + reply_text
            session.index.add_call(call.id, summary, plan.full_prompt_ids, sampled_ids=gen.token_ids,
                                   parent_id=plan.parent_id, context_text=text, window=plan.window)
            if plan.images and plan.messages is not None:
                from rowgrove.gateway.images import blind_summary
                from rowgrove.hashing import chain_start, message_hash
                from rowgrove.media import image_positions

                blind = blind_summary(plan.messages, chain_start(req.tools, req.chat_template_kwargs),
                                      message_hash(message))
                self.ledger.set_image_summary(call.id, blind)
                session.index.add_images(
                    call.id, blind,
                    [(i, k, img.digest) for (i, k, _), img in zip(image_positions(plan.messages), plan.images,
                                                                   strict=True)])
        return body

    def _store_images(self, call_id: str, plan: Decision) -> None:
        """Each image of the call's prompt stored once in the ledger, and the call's list of them."""
        vision = self.renderer.vision
        from rowgrove.media import image_positions

        self.ledger.put_images(plan.images, vision.config_record() if vision is not None else None)
        places = [(i, k) for i, k, _ in image_positions(plan.messages)] if plan.messages is not None else None
        self.ledger.link_images(call_id, [img.digest for img in plan.images], places)

    def _response(self, req: ChatRequest, call: Call, plan: Decision, gen: Any) -> tuple[dict, dict, str, str]:
        """(completion body, the assistant message it carries, finish reason, the exact text of
        every sampled id: what the call adds to its context)."""

        ids = list(gen.token_ids)
        kept = len(ids) - 1 if ids and gen.finish_reason == "stop" and ids[-1] in self.stop_ids else len(ids)
        reply_text, text = self.renderer.decode_reply(ids, kept)
        if gen.finish_reason == "stop" and req.sampling.stop:
            cuts = [text.find(s) for s in req.sampling.stop]
            cuts = [c for c in cuts if c >= 0]
            if cuts:
                text = text[: min(cuts)]
        parsed = parse_output(text, tool_parser=self.tool_parser, reasoning_parser=self.reasoning_parser,
                              id_seed=call.id, tools=req.tools, id_style=self.tool_call_ids)
        message = response_message(parsed)
        finish = "tool_calls" if message.get("tool_calls") and gen.finish_reason == "stop" else gen.finish_reason
        lp = None
        if req.logprobs:
            lp = logprobs_content(self.token_text, ids, gen.logprobs, gen.top_logprobs, req.top_logprobs)
        body = completion_body(
            call_id=call.id, created=int(call.created_at or time.time()), model=req.model,
            message=message, finish_reason=finish, prompt_tokens=len(plan.full_prompt_ids),
            completion_tokens=len(ids), logprobs=lp,
        )
        return body, message, finish, reply_text


def call_weight_versions(gen: Any, version_before: int) -> tuple[list[int], str | None]:
    """(one weight version per sampled token, None) for the engine's answer `gen`: its own
    `weight_versions` when it reports them, else `version_before` (the engine's `weights_version`
    read just before it was asked) on every token. A list of the wrong length, or a version that
    is not an int in [0, 2**31) (the ledger stores int32), gives ([], what is wrong)."""
    n = len(gen.token_ids)
    given = getattr(gen, "weight_versions", None)
    if given is None and n:  # one version on every token: checked once
        vs = [version_before]
        problem = _bad_versions(vs)
        return ([], problem) if problem else ([int(version_before)] * n, None)
    vs = [version_before] * n if given is None else list(given)
    if len(vs) != n:
        return [], f"{len(vs)} versions for {n} sampled tokens"
    problem = _bad_versions(vs)
    if problem:
        return [], problem
    return [int(v) for v in vs], None


def _bad_versions(vs: list[Any]) -> str | None:
    bad = [v for v in vs if isinstance(v, bool) or not isinstance(v, int | np.integer) or not 0 <= v < 2**31]
    return f"versions must be ints in [0, 2**31), got {bad[:3]}" if bad else None


def _consume_exception(fut: asyncio.Future) -> None:
    if not fut.cancelled():
        fut.exception()
