"""`gateway.deadlines`: coarse deadlines that share loop timers, and a Timeout with
`asyncio.timeout`'s contract over them (the engine's timeout in `Gateway.complete`)."""

from __future__ import annotations

import asyncio
import time

import pytest

from rowgrove.gateway.deadlines import Deadlines


def test_a_deadline_fires_not_before_its_delay_and_within_a_sixteenth_after():
    async def go():
        d = Deadlines()
        loop = asyncio.get_running_loop()
        fired: list[float] = []
        t0 = loop.time()
        for delay in (0.05, 0.16, 0.32):
            d.call_later(delay, lambda delay=delay: fired.append((delay, loop.time() - t0)))
        for _ in range(500):  # until all three fired (at most 5 s)
            if len(fired) == 3:
                break
            await asyncio.sleep(0.01)
        return fired

    fired = asyncio.run(go())
    assert [f[0] for f in fired] == [0.05, 0.16, 0.32]
    for delay, at in fired:
        assert delay <= at <= delay + delay / 16 + 0.25, (delay, at)  # + the loop's own slack on a busy machine


def test_deadlines_in_one_tick_share_one_loop_timer_which_goes_once_they_are_cancelled():
    async def go():
        d = Deadlines()
        loop = asyncio.get_running_loop()
        armed: list[float] = []
        call_at = loop.call_at

        def counted(when, *args):
            armed.append(when)
            return call_at(when, *args)

        loop.call_at = counted  # type: ignore[method-assign]
        entries = [d.call_later(600.0, lambda: None) for _ in range(1000)]
        timers = len(armed)
        handles = [s.handle for s in d._slots.values()]
        for e in entries:
            e.cancel()
        return timers, handles, d._slots

    timers, handles, slots = asyncio.run(go())
    assert timers <= 2  # 1000 deadlines, 600 s each: one tick of 1 s (two if the clock crossed one)
    assert all(h.cancelled() for h in handles) and not slots


def test_timeout_raises_timeout_error_and_cancels_the_body():
    async def go():
        d = Deadlines()
        body_cancelled = False
        with pytest.raises(TimeoutError):
            async with d.timeout(0.05) as t:
                try:
                    await asyncio.sleep(10)
                except asyncio.CancelledError:
                    body_cancelled = True
                    raise
        assert t.expired() and body_cancelled
        assert asyncio.current_task().cancelling() == 0  # the timeout's own cancel is taken back
        async with d.timeout(10) as t2:  # a block that ends in time: nothing happens
            await asyncio.sleep(0)
        assert not t2.expired()

    asyncio.run(go())


def test_a_cancel_from_elsewhere_during_an_expired_timeout_still_cancels():
    """As asyncio.timeout: when the task was also cancelled by someone else (a client that left)
    before the block saw the deadline's cancel, the block ends cancelled, not in TimeoutError."""
    async def go(also_cancelled: bool):
        d = Deadlines()
        never = asyncio.get_running_loop().create_future()

        async def body():
            async with d.timeout(10) as t:
                t._expire()  # the deadline passes...
                if also_cancelled:
                    asyncio.current_task().cancel()  # ...and the client leaves, before the body resumes
                await never

        return (await asyncio.gather(asyncio.ensure_future(body()), return_exceptions=True))[0]

    assert isinstance(asyncio.run(go(False)), TimeoutError)
    assert isinstance(asyncio.run(go(True)), asyncio.CancelledError)


def test_an_unbounded_delay_never_fires():
    async def go():
        d = Deadlines()
        fired = []
        e = d.call_later(float("inf"), lambda: fired.append(1))
        await asyncio.sleep(0.01)
        e.cancel()
        return fired, d._slots

    assert asyncio.run(go()) == ([], {})


def test_one_deadlines_object_serves_loop_after_loop():
    d = Deadlines()
    for _ in range(2):
        t0 = time.monotonic()

        async def go():
            with pytest.raises(TimeoutError):
                async with d.timeout(0.02):
                    await asyncio.sleep(5)

        asyncio.run(go())
        assert time.monotonic() - t0 < 2
