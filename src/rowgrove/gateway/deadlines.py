"""Coarse deadlines for many concurrent calls of one event loop, sharing their loop timers.

Every call the gateway serves waits for its engine under a timeout (`--engine-timeout`, minutes
by default), and nearly every call ends long before it. `asyncio.timeout` arms and cancels a
loop timer per call (under uvloop a libuv timer: about 5 µs a call, 1-2% of the gateway's own
CPU per call at load). Here a deadline is rounded up to the next multiple of a tick (a
sixteenth of the delay, at most one second), and all deadlines that fall in one tick wait on
one loop timer, cancelled once its last deadline is: a call costs a set insert and removal.

The price is precision: a timeout fires between `delay` and `delay + min(delay / 16, 1 s)`
after it was set, never before.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from types import TracebackType


class _Slot:
    __slots__ = ("entries", "handle")

    def __init__(self, handle: asyncio.TimerHandle) -> None:
        self.entries: set[Deadline] = set()
        self.handle = handle


class Deadline:
    """One pending deadline (`Deadlines.call_later`); `cancel()` it once it is not needed."""

    __slots__ = ("_callback", "_owner", "_when")

    def __init__(self, owner: Deadlines, when: float, callback: Callable[[], object]):
        self._owner, self._when, self._callback = owner, when, callback

    def cancel(self) -> None:
        self._owner._drop(self)


class Deadlines:
    """Coarse timers of one event loop (see the module docstring)."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._slots: dict[float, _Slot] = {}

    def call_later(self, delay: float, callback: Callable[[], object]) -> Deadline:
        """Call `callback()` between `delay` and `delay + min(delay / 16, 1)` seconds from now,
        unless the returned deadline is cancelled first. Must be called on a running loop."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # a new loop (tests run one per case): the old timers are gone
            self._loop, self._slots = loop, {}
        if not math.isfinite(delay):
            return Deadline(self, math.inf, callback)  # never fires
        delay = max(delay, 0.0)
        tick = min(delay / 16, 1.0) or 1e-3
        when = math.ceil((loop.time() + delay) / tick) * tick
        slot = self._slots.get(when)
        if slot is None:
            slot = self._slots[when] = _Slot(loop.call_at(when, self._fire, when))
        entry = Deadline(self, when, callback)
        slot.entries.add(entry)
        return entry

    def timeout(self, delay: float) -> Timeout:
        """An async context manager like `asyncio.timeout(delay)` (the body is cancelled and
        TimeoutError raised at its end) with this coarse deadline."""
        return Timeout(self, delay)

    def _drop(self, entry: Deadline) -> None:
        slot = self._slots.get(entry._when)
        if slot is None:
            return
        slot.entries.discard(entry)
        if not slot.entries:
            del self._slots[entry._when]
            slot.handle.cancel()

    def _fire(self, when: float) -> None:
        slot = self._slots.pop(when, None)
        if slot is None:
            return
        for entry in list(slot.entries):
            entry._callback()


class Timeout:
    """`asyncio.timeout`'s contract over a shared coarse deadline: when the deadline passes
    inside the block, the task is cancelled, and the block's CancelledError leaves it as
    TimeoutError, unless the task was also cancelled by someone else meanwhile (that cancel
    goes on)."""

    __slots__ = ("_cancelling", "_deadline", "_deadlines", "_delay", "_expired", "_task")

    def __init__(self, deadlines: Deadlines, delay: float):
        self._deadlines, self._delay = deadlines, delay
        self._task: asyncio.Task | None = None
        self._deadline: Deadline | None = None
        self._expired = False
        self._cancelling = 0

    async def __aenter__(self) -> Timeout:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("Timeout should be used inside a task")
        self._task, self._cancelling = task, task.cancelling()
        self._deadline = self._deadlines.call_later(self._delay, self._expire)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        if self._expired and self._task is not None:
            if self._task.uncancel() <= self._cancelling and exc_type is not None \
                    and issubclass(exc_type, asyncio.CancelledError):
                raise TimeoutError from exc

    def expired(self) -> bool:
        """Whether the deadline passed inside the block."""
        return self._expired

    def _expire(self) -> None:
        self._deadline = None
        if self._task is not None and not self._task.done():
            self._expired = True
            self._task.cancel()


__all__ = ["Deadline", "Deadlines", "Timeout"]
