"""The seven properties of the cancel signal."""

import asyncio
import threading

import pytest

from runs.agent.cancel import CancelSignal

pytestmark = pytest.mark.asyncio


async def test_cancel_wakes_a_waiter_instantly():
    signal = CancelSignal()
    waiter = asyncio.ensure_future(signal.wait())
    await asyncio.sleep(0)  # let it park
    assert not waiter.done()
    signal.cancel()
    await asyncio.sleep(0)  # one loop turn: no timer, no polling
    assert waiter.done()


async def test_cancel_from_another_thread_wakes_the_waiter_on_its_loop():
    signal = CancelSignal()
    waiter = asyncio.ensure_future(signal.wait())
    await asyncio.sleep(0)
    thread = threading.Thread(target=signal.cancel)
    thread.start()
    await asyncio.wait_for(waiter, 2)
    thread.join()


async def test_wait_on_an_already_fired_signal_returns_at_once():
    signal = CancelSignal()
    signal.cancel()
    coro = signal.wait()
    # Completes without ever suspending: driving it once finishes it.
    with pytest.raises(StopIteration):
        coro.send(None)
    assert signal.is_cancelled()


async def test_repeat_cancel_is_harmless():
    signal = CancelSignal()
    signal.cancel()
    signal.cancel()
    signal.cancel()
    assert signal.is_cancelled()
    await asyncio.wait_for(signal.wait(), 1)


async def test_ten_waiters_all_wake():
    signal = CancelSignal()
    waiters = [asyncio.ensure_future(signal.wait()) for _ in range(10)]
    await asyncio.sleep(0)
    assert not any(w.done() for w in waiters)
    signal.cancel()
    done, pending = await asyncio.wait(waiters, timeout=1)
    assert len(done) == 10 and not pending


async def test_reset_clears_the_signal():
    signal = CancelSignal()
    signal.cancel()
    signal.reset()
    assert not signal.is_cancelled()


async def test_a_shared_handle_sees_the_reset():
    signal = CancelSignal()
    old_waiter = asyncio.ensure_future(signal.wait())  # a task holding the handle
    await asyncio.sleep(0)
    signal.cancel()
    signal.reset()
    # Another holder of the same handle, on another thread, sees the fresh token...
    seen = []
    thread = threading.Thread(target=lambda: seen.append(signal.is_cancelled()))
    thread.start()
    thread.join()
    assert seen == [False]
    # ...while the task already waiting on the old token resolved against it.
    await asyncio.wait_for(old_waiter, 1)


async def test_after_reset_a_waiter_waits_for_a_new_cancel():
    signal = CancelSignal()
    signal.cancel()
    signal.reset()
    waiter = asyncio.ensure_future(signal.wait())
    await asyncio.sleep(0.01)
    assert not waiter.done()
    signal.cancel()
    await asyncio.wait_for(waiter, 1)


async def test_cancel_racing_many_threads_never_strands_a_waiter():
    # No check-then-wait gap: waiters registering while threads fire all wake.
    for _ in range(50):
        signal = CancelSignal()
        waiters = [asyncio.ensure_future(signal.wait()) for _ in range(5)]
        threads = [threading.Thread(target=signal.cancel) for _ in range(3)]
        for t in threads:
            t.start()
        waiters += [asyncio.ensure_future(signal.wait()) for _ in range(5)]
        done, pending = await asyncio.wait(waiters, timeout=2)
        for t in threads:
            t.join()
        assert not pending
