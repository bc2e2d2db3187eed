"""Racing work against the cancel signal, biased: the cancel is polled first.

`Racer.run(aw)` is the mechanism behind every "raced" checkpoint (model calls, stream
polls, tool calls): if the signal has fired, `aw` is never started; if it fires while
`aw` runs, the work is abandoned at its next await and `Cancelled` is raised, even if
the work finished at the same instant (a cancel always wins a tie). `sleep()` is the
cancel-aware sleep behind the gate, backoff and approval waits.
"""

import asyncio
import inspect

from runs.agent.cancel import Cancelled

# How long an abandoned task may take to run its cleanup (finally blocks) before we
# stop waiting for it; tools are required to be quick to abandon.
ABANDON_GRACE_S = 0.2


class Racer:
    """Races awaitables against one token of a signal, captured at construction.

    Reuses one waiter across many races (a stream polls hundreds of events), so a race
    costs one task, not two. Call `close()` when done (or use `async with`).
    """

    def __init__(self, signal):
        self.token = signal.token()
        self._waiter = None

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        self.close()

    def close(self):
        if self._waiter is not None:
            self._waiter.cancel()
            self._waiter = None

    async def run(self, aw, *, timeout=None):
        """Await `aw` unless cancelled first. Raises Cancelled on cancel, TimeoutError
        when `timeout` (seconds) passes first; the work is abandoned in both cases."""
        if self.token.is_fired():
            _close_unstarted(aw)
            raise Cancelled()
        if self._waiter is None:
            self._waiter = asyncio.ensure_future(self.token.wait())
        task = asyncio.ensure_future(aw)
        try:
            done, _ = await asyncio.wait(
                {task, self._waiter}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
        except BaseException:  # our own task is being torn down: take the work with us
            await abandon(task)
            raise
        if self.token.is_fired():  # biased: the cancel wins even a simultaneous finish
            await abandon(task)
            raise Cancelled()
        if task not in done:
            await abandon(task)
            raise TimeoutError()
        return task.result()


async def race(aw, signal, *, timeout=None):
    """One-off race of `aw` against `signal` (see Racer.run)."""
    async with Racer(signal) as racer:
        return await racer.run(aw, timeout=timeout)


async def sleep(signal, seconds):
    """Sleep `seconds` unless cancelled first or meanwhile (then raise Cancelled)."""
    token = signal.token()
    if token.is_fired():
        raise Cancelled()
    if seconds <= 0:
        return
    try:
        await asyncio.wait_for(token.wait(), seconds)
    except TimeoutError:
        return
    raise Cancelled()


async def abandon(task):
    """Cancel `task` and give its cleanup a brief moment; never raises."""
    if task.done():
        _consume(task)
        return
    task.cancel()
    task.add_done_callback(_consume)
    await asyncio.wait({task}, timeout=ABANDON_GRACE_S)


def _consume(task):
    # Retrieve the outcome so an abandoned task never logs "exception never retrieved".
    if not task.cancelled():
        task.exception()


def _close_unstarted(aw):
    if inspect.iscoroutine(aw):
        aw.close()
