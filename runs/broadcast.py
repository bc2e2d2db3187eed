"""After-commit broadcasts of run changes over the channel layer.

Writers call `on_commit` so nothing is announced that a rollback could take back.
A broadcast is best effort: the database is the truth, and a viewer or worker that
missed one catches up from it (the worker through its heartbeat's answer).

Delivery: the in-memory layer lives on the server's event loop, so its sends go back
to that loop (`async_to_sync`). A Redis layer is reached from one long-lived publisher
loop instead: one connection for the life of the process rather than a new event loop
and connection per send (which was most of a cancel's latency).
"""

import asyncio
import logging
import os
import threading
import time
from functools import partial

from asgiref.sync import SyncToAsync, async_to_sync
from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.db import transaction

from runs import groups, messages

log = logging.getLogger(__name__)

FAILURE_LOG_EVERY_S = 30.0


def on_commit(run, event, *, to_worker=None):
    """After commit, announce `event` to the run's viewers and the list; `to_worker`, a
    message the transition built for the run's executor (`messages.cancel`), goes first."""
    transaction.on_commit(partial(announce, run, event, to_worker=to_worker))


def announce(run, event, *, to_worker=None):
    """Tell the run's executor (for a cancel: first, it is the one that must act) and
    its viewers what changed."""
    message = messages.changed(run, event)
    sends = [(groups.control(run.id), to_worker)] if to_worker is not None else []
    sends += [(groups.viewers(run.id), message), (groups.LIST_GROUP, message)]
    send_all(sends)


def route_to_loop(loop):
    """Make this thread's broadcasts to the in-memory layer run on `loop`.

    The in-memory layer's queues belong to the event loop that serves its consumers
    (the server's, when the engine runs inside it), and `send_all` reaches it through
    `async_to_sync`, which runs the send on asgiref's "main" loop for the thread. A
    thread of our own (the engine's database pool) has none, so `async_to_sync` would
    start a loop of its own and the send would land on queues nobody reads. asgiref
    keeps that loop in a private thread-local, set by `sync_to_async` for the threads
    it runs; we set it the same way, here only, so an asgiref upgrade that moves it
    breaks one function (tests/runs/test_broadcast.py covers the route)."""
    SyncToAsync.threadlocal.main_event_loop = loop
    SyncToAsync.threadlocal.main_event_loop_pid = os.getpid()


def send_all(sends):
    """group_send each (group, message), in order; a failure is logged, never raised."""
    layer = get_channel_layer()
    if layer is None:
        return
    if isinstance(layer, InMemoryChannelLayer):
        try:
            async_to_sync(_send_all)(layer, sends)
        except Exception as error:  # noqa: BLE001 - a broken layer must never undo a transition
            _failed(error)
        return
    publisher.submit(layer, sends)


async def _send_all(layer, sends):
    for group, message in sends:
        await layer.group_send(group, message)


_failures = {"count": 0, "logged_at": 0.0}


def _failed(error):
    """One WARNING line per FAILURE_LOG_EVERY_S while the layer is down, not one per send."""
    _failures["count"] += 1
    now = time.monotonic()
    if now - _failures["logged_at"] >= FAILURE_LOG_EVERY_S:
        log.warning(
            "broadcast failed (%d since last report): %s: %s; viewers and workers fall back to the database",
            _failures["count"], type(error).__name__, error,
        )
        _failures.update(count=0, logged_at=now)


class Publisher:
    """A daemon thread running one event loop, so every broadcast from sync code reuses
    one Redis connection instead of opening a loop and a connection per send."""

    WAIT_S = 1.0  # a hung layer may delay a transition's return by this much, no more

    def __init__(self):
        self._lock = threading.Lock()
        self._loop = None
        self._pid = None

    def submit(self, layer, sends):
        """Send and wait (bounded) for the sends to be done, so a transition that has
        returned has also been announced, in order."""
        future = asyncio.run_coroutine_threadsafe(_send_all(layer, sends), self._running_loop())
        try:
            future.result(timeout=self.WAIT_S)
        except Exception as error:  # noqa: BLE001 - a broken layer must never undo a transition
            _failed(error)

    def _running_loop(self):
        with self._lock:
            # First use, or a forked child that inherited a loop without its thread.
            if self._loop is None or self._pid != os.getpid():
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="runwarden-broadcast", daemon=True).start()
                self._loop, self._pid = loop, os.getpid()
            return self._loop


publisher = Publisher()
