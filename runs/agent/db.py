"""Database calls from the engine's event loop, on a small pool of owned threads.

Why not channels' `database_sync_to_async`: it closes the connection after every call
when CONN_MAX_AGE is 0 (a new PostgreSQL connection per heartbeat and per settle), and
its thread-sensitive mode funnels every call of every run through one thread, so a
settle could queue behind a wave of heartbeats. Here each pool thread keeps its own
connection and closes it when the pool shuts down (so a test database can be dropped),
or at once after a database error (so a dead connection is not reused).

The pool is the worker's whole connection budget: `size` threads (RUNWARDEN_DB_POOL_SIZE)
plus the urgent lane's, each holding at most one connection, whatever the worker's
concurrency. 250 runs' calls queue on 4 threads; a cancel's settle and the heartbeat
take the urgent lane, so they never queue behind a wave of commits.

With the in-memory channel layer (embedded in the server), the transitions' after-commit
broadcasts (`async_to_sync(group_send)`) must run on the loop that owns its queues:
`broadcast_loop="caller"` tells asgiref, per call as `sync_to_async` does, to use the
loop awaiting the call. With Redis, `runs.broadcast` sends from its own publisher loop,
off the worker's loop, and `broadcast_loop` stays None.
"""

import asyncio
import logging
import os
import queue
import threading
from functools import partial

from asgiref.sync import SyncToAsync
from django.db import DatabaseError, connections

log = logging.getLogger(__name__)

_STOP = object()


class DbPool:
    """`await pool.call(fn, *args, **kwargs)` runs `fn` in a pool thread.

    A caller that is cancelled stops waiting; the call itself finishes in its thread
    (a transaction is never abandoned halfway). `await pool.urgent(fn, …)` goes to a
    lane of its own, so settling a cancelled run never queues behind a wave of
    heartbeats and commits.
    """

    def __init__(self, size=4, name="rw-db", urgent_size=2, broadcast_loop=None):
        self._broadcast_loop = broadcast_loop
        self._queue = queue.SimpleQueue()
        self._urgent = queue.SimpleQueue()
        lanes = [(self._queue, f"{name}-{i}") for i in range(max(1, size))]
        lanes += [(self._urgent, f"{name}-urgent-{i}") for i in range(max(1, urgent_size))]
        self._threads = [
            (lane, threading.Thread(target=self._serve, args=(lane,), name=label, daemon=True))
            for lane, label in lanes
        ]
        self._closed = False
        for _, thread in self._threads:
            thread.start()

    async def call(self, fn, /, *args, **kwargs):
        return await self._submit(self._queue, fn, args, kwargs)

    async def urgent(self, fn, /, *args, **kwargs):
        return await self._submit(self._urgent, fn, args, kwargs)

    async def _submit(self, lane, fn, args, kwargs):
        if self._closed:
            raise RuntimeError("database pool is closed")
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        lane.put((loop, future, partial(fn, *args, **kwargs)))
        return await future

    def close(self, timeout=5.0):
        """Stop the threads; each closes its connections first. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for lane, _ in self._threads:
            lane.put(_STOP)
        for _, thread in self._threads:
            thread.join(timeout)

    async def aclose(self):
        await asyncio.to_thread(self.close)

    def _serve(self, lane):
        while True:
            item = lane.get()
            if item is _STOP:
                connections.close_all()
                return
            loop, future, call = item
            target = loop if self._broadcast_loop == "caller" else self._broadcast_loop
            if target is not None:
                SyncToAsync.threadlocal.main_event_loop = target
                SyncToAsync.threadlocal.main_event_loop_pid = os.getpid()
            try:
                result = call()
            except BaseException as error:  # noqa: BLE001 - handed to the awaiting coroutine
                if isinstance(error, DatabaseError):
                    connections.close_all()  # maybe broken: reconnect on the next call
                _deliver(loop, future, error=error)
            else:
                _deliver(loop, future, result=result)


def _deliver(loop, future, result=None, error=None):
    def settle():
        if future.done():  # the caller was cancelled meanwhile
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    try:
        loop.call_soon_threadsafe(settle)
    except RuntimeError:  # the loop is closed: nobody is waiting any more
        log.debug("database result dropped: event loop closed")
