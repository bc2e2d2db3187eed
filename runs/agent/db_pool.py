"""Database calls from the engine's event loop, on a small pool of owned threads.

Why not channels' `database_sync_to_async`: it closes the connection after every call
when CONN_MAX_AGE is 0 (a new PostgreSQL connection per heartbeat and per settle), and
its thread-sensitive mode funnels every call of every run through one thread, so a
settle could queue behind a wave of heartbeats. Here each pool thread keeps its own
connection and closes it when the pool shuts down (so a test database can be dropped),
or at once after a database error (so a dead connection is not reused).

The pool is the worker's whole connection budget: `size` threads (RUNWARDEN_WORKER_DB_CONNECTIONS)
plus the urgent lane's, each holding at most one connection, whatever the worker's
concurrency. 250 runs' calls queue on 4 threads; a cancel's settle and the heartbeat
take the urgent lane, so they never queue behind a wave of commits.

Broken connections are replaced by themselves. A connection the server dropped while it
sat idle (`pg_terminate_backend`, a restarted proxy) fails only on its next use: that
call is run once more on a fresh connection when it cannot have changed anything, i.e.
its first statement failed on a connection opened before the call, and either that
statement was inside a transaction (nothing committed) or the call is `retry_safe`
(guarded or idempotent: a heartbeat, a settle). A call that failed later, or an
autocommit statement of any other call, is not repeated. A call that failed because
the database could not be reached raises `DatabaseUnavailable` (an OperationalError),
so a caller can hold what it has until the database answers (the runner's settle does).

An outage is logged as an operator reads it: one WARNING when the database stops
answering, a count every OUTAGE_REPORT_S while it stays down, one WARNING when it
answers again; no line per failed call.

With the in-memory channel layer (embedded in the server), the transitions' after-commit
broadcasts (`async_to_sync(group_send)`) must run on the loop that owns its queues:
`broadcast_loop="caller"` routes them, per call as `sync_to_async` does, to the loop
awaiting the call (`runs.broadcast.route_to_loop`). With Redis, `runs.broadcast` sends
from its own publisher loop, off the worker's loop, and `broadcast_loop` stays None.
"""

import asyncio
import logging
import queue
import threading
import time
from functools import partial

from django.db import DEFAULT_DB_ALIAS, DatabaseError, InterfaceError, OperationalError, connections

from runs import broadcast, transitions

log = logging.getLogger(__name__)

_STOP = object()
OUTAGE_REPORT_S = 30.0
# Guarded transitions: a second run changes nothing the first did not (a heartbeat
# moves heartbeat_at again; a settle that already won loses and is traced).
RETRY_SAFE = frozenset({transitions.heartbeat, transitions.heartbeat_many, transitions.settle})


class DatabaseUnavailable(OperationalError):
    """The call failed because the database could not be reached or the connection
    dropped under it (not because the database refused the statement): worth
    retrying once the database answers. Raised from the driver's error.
    `changed_nothing`: provably nothing was committed (no statement was sent, or one
    failed inside the call's transaction); False when the connection broke on an
    autocommit statement or on COMMIT, where the change may have landed."""

    def __init__(self, message, *, changed_nothing=False):
        super().__init__(message)
        self.changed_nothing = changed_nothing


def retry_safe(fn):
    """Mark `fn` safe to run again after its first statement failed on a dropped
    connection (it is guarded or idempotent). Returns `fn`."""
    fn.db_retry_safe = True
    return fn


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
        self.outage = Outage(name)
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
                broadcast.route_to_loop(target)
            try:
                result = self._run(call)
            except BaseException as error:  # noqa: BLE001 - handed to the awaiting coroutine
                if isinstance(error, DatabaseError):
                    connections.close_all()  # maybe broken: reconnect on the next call
                _deliver(loop, future, error=error)
            else:
                self.outage.answered()
                _deliver(loop, future, result=result)

    def _run(self, call):
        connection = connections[DEFAULT_DB_ALIAS]
        reused = connection.connection is not None
        probe = _FirstStatement()
        try:
            with connection.execute_wrapper(probe):
                return call()
        except (OperationalError, InterfaceError) as error:
            if not probe.connection_lost(connection):
                raise  # the database answered: a locked SQLite file, a timeout, not an outage
            fn = getattr(call, "func", call)
            unreached = probe.completed == 0 and (
                not probe.attempted or probe.in_transaction or fn in RETRY_SAFE or getattr(fn, "db_retry_safe", False)
            )
            if not (reused and unreached):
                self.outage.failed(error)
                raise DatabaseUnavailable(_first_line(error), changed_nothing=probe.changed_nothing) from error
            # DEBUG: after an outage every pool thread finds its connection dead once; self-repair is not news.
            log.debug("database connection was dropped (%s); running the call again on a fresh one", _first_line(error))
        connections.close_all()
        return self._run(call)  # on a fresh connection: not `reused`, so never a third time


class _FirstStatement:
    """An execute wrapper that tells whether a call's first statement ever reached the
    database, whether it ran inside a transaction, and on which raw connection."""

    def __init__(self):
        self.attempted = self.completed = 0
        self.in_transaction = False  # the first statement ran inside a transaction
        self.failed_in_transaction = False  # a statement failed inside a transaction: rolled back
        self.raw = None

    def __call__(self, execute, sql, params, many, context):
        wrapper = context["connection"]
        if not self.attempted:
            self.in_transaction = wrapper.in_atomic_block
        self.attempted += 1
        self.raw = wrapper.connection
        try:
            result = execute(sql, params, many, context)
        except Exception:
            self.failed_in_transaction = wrapper.in_atomic_block
            raise
        self.completed += 1
        return result

    @property
    def changed_nothing(self):
        return not self.attempted or self.failed_in_transaction

    def connection_lost(self, connection):
        """After an error: was it the connection (refused, dropped, closed)? Read from
        the raw connection the statement used, since Django may already have replaced it."""
        raw = self.raw if self.attempted else connection.connection
        if raw is None:  # it could not connect at all
            return True
        return bool(getattr(raw, "broken", False) or getattr(raw, "closed", False))


def _first_line(error):
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


class Outage:
    """Rate-limited outage logging shared by a pool's threads: one WARNING on the way
    down, a count every OUTAGE_REPORT_S while down, one WARNING on recovery."""

    def __init__(self, name):
        self.name = name
        self._lock = threading.Lock()
        self.since = None  # monotonic start of the current outage, or None
        self.failures = 0  # failed calls in the current outage
        self._reported = 0.0

    @property
    def active(self):
        return self.since is not None

    def failed(self, error):
        now = time.monotonic()
        with self._lock:
            first = self.since is None
            if first:
                self.since, self.failures, self._reported = now, 0, now
            self.failures += 1
            report = not first and now - self._reported >= OUTAGE_REPORT_S
            if report:
                self._reported = now
            failures, since = self.failures, self.since
        if first:
            log.warning("%s: database unreachable (%s); retrying, runs hold their outcome", self.name, _first_line(error))
        elif report:
            log.warning("%s: database still unreachable after %.0f s; %d call(s) failed so far",
                        self.name, now - since, failures)

    def answered(self):
        if self.since is None:  # the common case: no lock taken
            return
        with self._lock:
            if self.since is None:
                return
            took, failures, self.since = time.monotonic() - self.since, self.failures, None
        log.warning("%s: database answering again after %.1f s; %d call(s) failed meanwhile", self.name, took, failures)


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
