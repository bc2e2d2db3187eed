"""The cancel signal: a one-shot token behind a shared, resettable handle.

A plain flag has a check-then-wait gap: a cancel landing between "is it fired?" and
"wait for work" is missed until the work ends. Here checking and waiting are two views
of one token, so a cancel at any instant wakes every current and future waiter.

    signal = CancelSignal()
    signal.cancel()          # idempotent, from any thread; wakes asyncio waiters on their loop
    signal.is_cancelled()    # never blocks
    await signal.wait()      # returns at once if already fired
    signal.reset()           # swaps in a fresh token; there is no un-fire

A task already waiting on the old token resolves against it (it *was* cancelled);
anything asking after the swap sees the fresh one.
"""

import asyncio
import threading


class Cancelled(Exception):
    """The run was asked to stop; raised at a checkpoint. Not a failure."""


class Token:
    """One-shot: fired once, fired forever."""

    __slots__ = ("_fired", "_lock", "_waiters")

    def __init__(self):
        self._lock = threading.Lock()
        self._fired = False
        self._waiters = []  # (loop, future) of coroutines parked in wait()

    def fire(self):
        with self._lock:
            if self._fired:
                return
            self._fired = True
            waiters, self._waiters = self._waiters, []
        for loop, future in waiters:
            if _running_loop() is loop:
                _wake(future)  # same thread: wake now, not one loop turn later
            elif not loop.is_closed():
                loop.call_soon_threadsafe(_wake, future)

    def is_fired(self):
        return self._fired

    async def wait(self):
        loop = asyncio.get_running_loop()
        with self._lock:
            # Checked and registered under the lock that fire() takes: no gap between.
            if self._fired:
                return
            future = loop.create_future()
            entry = (loop, future)
            self._waiters.append(entry)
        try:
            await future
        finally:
            if not future.done():  # the waiter itself was cancelled: forget it
                with self._lock:
                    if entry in self._waiters:
                        self._waiters.remove(entry)


def _running_loop():
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _wake(future):
    if not future.done():
        future.set_result(None)


class CancelSignal:
    """The shared handle. Safe to use from any thread."""

    def __init__(self):
        self._lock = threading.Lock()
        self._token = Token()

    def token(self):
        """The current token (held only for the read): a racer captures it once."""
        with self._lock:
            return self._token

    def cancel(self):
        """Fire the current token. Idempotent."""
        self.token().fire()

    def is_cancelled(self):
        return self.token().is_fired()

    async def wait(self):
        """Return when the token current at the call fires (at once if it has)."""
        await self.token().wait()

    def raise_if_cancelled(self):
        """A poll checkpoint: raise Cancelled if fired."""
        if self.is_cancelled():
            raise Cancelled()

    def reset(self):
        """Swap in a fresh, unfired token. Waiters on the old one still resolve on it."""
        with self._lock:
            self._token = Token()
