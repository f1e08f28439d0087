"""The calls of one loop turn pass `Gateway.complete`'s stages together (`Gateway._next_stage`):
all decide, then all write their pending rows, when other calls are in flight; a lone call
never waits; and what a wait may change (the rollout finished, the server closing) is checked
again after it, before anything is written."""

from __future__ import annotations

import asyncio

import pytest

from fixtures_http import TestEngine, scripted_engine
from rowgrove.errors import Conflict, Unavailable
from rowgrove.gateway import sessions
from rowgrove.gateway.dialects.openai_format import parse_chat_request, request_key
from rowgrove.gateway.sessions import Gateway, GatewaySettings
from rowgrove.ledger import Ledger


@pytest.fixture
def gateway(tmp_path):
    with Ledger(tmp_path / "g.db") as led:
        yield Gateway(TestEngine(scripted_engine("tiny")), led, GatewaySettings())


def _body(k: int) -> dict:
    return {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": f"task {k}"}]}


async def _call(gw: Gateway, session, k: int):
    body = _body(k)
    return await gw.complete(session, parse_chat_request(body), key=request_key(body), retry=False)


def _record(gw: Gateway, monkeypatch) -> list[tuple[str, str]]:
    """(stage, rollout id) in the order the calls reach `decide` and the pending write."""
    events: list[tuple[str, str]] = []
    decide = sessions.decide

    def spied_decide(index, messages, *a, **kw):
        events.append(("decide", messages[-1]["content"]))
        return decide(index, messages, *a, **kw)

    abegin, begin = gw.ledger.abegin_call, gw.ledger.begin_call

    async def spied_abegin(rollout_id, **kw):
        events.append(("begin", rollout_id))
        return await abegin(rollout_id, **kw)

    def spied_begin(rollout_id, **kw):
        events.append(("begin at once", rollout_id))
        return begin(rollout_id, **kw)

    monkeypatch.setattr(sessions, "decide", spied_decide)
    monkeypatch.setattr(gw.ledger, "abegin_call", spied_abegin)
    monkeypatch.setattr(gw.ledger, "begin_call", spied_begin)
    return events


def test_calls_of_one_turn_decide_together_then_write_together(gateway, monkeypatch):
    gw = gateway
    events = _record(gw, monkeypatch)
    ros = [gw.create_rollout(f"g{k}", None) for k in range(3)]

    async def go():
        gw.in_flight = 1  # another generation is in flight: the turn's calls go stage by stage
        try:
            return await asyncio.gather(*(_call(gw, gw.session(ro.id), k) for k, ro in enumerate(ros)))
        finally:
            gw.in_flight -= 1

    done = asyncio.run(go())
    assert [e[0] for e in events] == ["decide"] * 3 + ["begin"] * 3
    assert [e[1] for e in events] == [f"task {k}" for k in range(3)] + [ro.id for ro in ros]
    assert all(d.generated for d in done)
    assert [len(gw.ledger.calls(ro.id)) for ro in ros] == [1, 1, 1]
    assert gw.in_flight == 0


def test_a_lone_call_does_not_wait(gateway, monkeypatch):
    gw = gateway
    events = _record(gw, monkeypatch)
    ro = gw.create_rollout("g", None)

    async def go():
        task = asyncio.ensure_future(_call(gw, gw.session(ro.id), 0))
        # runs after the call's first step: only if that step yielded before writing its row
        asyncio.get_running_loop().call_soon(events.append, ("next turn", ""))
        await task

    asyncio.run(go())
    # alone, its pending row is committed at once, not in a group commit two turns later
    assert [e[0] for e in events] == ["decide", "begin at once", "next turn"]


def test_a_lone_call_commits_each_write_at_once(gateway, monkeypatch):
    """Alone, a call's pending row is committed before the engine is asked and its completion
    before it returns, each in a commit of its own (no group commit to wait for); with other
    calls being served, they share group commits."""
    gw = gateway
    ro = gw.create_rollout("g", None)
    seen: list[str] = []
    generate = gw.engine.generate

    async def spied_generate(*a, **kw):
        with Ledger(gw.ledger.path, readonly=True) as other:
            (status,) = {c.status for c in other.calls(ro.id)}
        seen.append(status)  # what another connection reads while the engine is asked
        return await generate(*a, **kw)

    monkeypatch.setattr(gw.engine, "generate", spied_generate)
    monkeypatch.setattr(gw.ledger, "abegin_call", None)  # the grouped writes are not used
    monkeypatch.setattr(gw.ledger, "acomplete_call", None)
    done = asyncio.run(_call(gw, gw.session(ro.id), 0))
    assert seen == ["pending"]
    with Ledger(gw.ledger.path, readonly=True) as other:
        (call,) = other.calls(ro.id)
    assert call.status == "completed" and call.id == done.call_id


@pytest.mark.parametrize("change, error", [("finished", Conflict), ("closing", Unavailable)])
def test_what_changed_during_a_wait_is_refused_before_any_write(gateway, monkeypatch, change, error):
    gw = gateway
    ro = gw.create_rollout("g", None)
    session = gw.session(ro.id)

    def change_it() -> None:
        if change == "finished":
            session.finished = True
        else:
            gw.closing = True

    async def go():
        gw.in_flight = 1
        task = asyncio.ensure_future(_call(gw, session, 0))
        asyncio.get_running_loop().call_soon(change_it)  # while the call waits for the next stage
        with pytest.raises(error):
            await task

    asyncio.run(go())
    assert gw.ledger.calls(ro.id) == []


def test_a_retry_arriving_while_its_original_waits_at_a_stage_is_its_replay(gateway):
    """Issue 36: with other calls in flight the original yields at its stages before its pending
    row; an SDK retry of the same body arriving then waits for the original's answer (it was
    registered in flight before the first yield) instead of generating the call a second time."""
    gw = gateway
    ro, other = gw.create_rollout("g", None), gw.create_rollout("g", None)
    s = gw.session(ro.id)
    body = _body(0)
    req, key = parse_chat_request(body), request_key(body)

    async def go():
        gw.engine.delay = 0.2
        busy = asyncio.ensure_future(_call(gw, gw.session(other.id), 1))  # in flight: the stages yield
        await asyncio.sleep(0.05)
        gw.engine.delay = 0.0
        first = asyncio.ensure_future(gw.complete(s, req, key=key, retry=False))
        await asyncio.sleep(0)  # the original is at its first stage yield, no pending row yet
        assert not gw.ledger.calls(ro.id)
        again = await gw.complete(s, req, key=key, retry=True)
        return await first, again, await busy

    first, again, _ = asyncio.run(go())
    assert first.generated and not again.generated
    assert again.body == first.body
    assert len(gw.ledger.calls(ro.id)) == 1
