"""After-commit broadcasts of run changes over the channel layer.

Writers call `on_commit` so nothing is announced that a rollback could take back.
A broadcast is best effort: the database is the truth, and a viewer or worker that
missed one catches up from it (the worker through its heartbeat's answer).
"""

import logging
from functools import partial

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

from runs import groups

log = logging.getLogger(__name__)

CANCELLING_EVENTS = ("cancel_requested", "retired")


def on_commit(run, event):
    transaction.on_commit(partial(announce, run, event))


def announce(run, event):
    """Tell viewers (and, for a cancel, the run's executor) what changed."""
    message = {
        "type": "run.changed",
        "run_id": str(run.id),
        "status": run.status,
        "seq": event.seq,
        "event": event.kind,
    }
    sends = [(groups.LIST_GROUP, message), (groups.viewers(run.id), message)]
    if event.kind in CANCELLING_EVENTS and not event.data.get("settled_queued"):
        control = {"type": "run.cancel", "run_id": str(run.id), "source": run.cancel_source, "note": run.cancel_note}
        sends.append((groups.control(run.id), control))
    send_all(sends)


def send_all(sends):
    """group_send each (group, message); a failure is logged, never raised."""
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(_send_all)(layer, sends)
    except Exception:  # noqa: BLE001 - a broken layer must never undo a transition
        log.warning("broadcast failed for %s", [group for group, _ in sends], exc_info=True)


async def _send_all(layer, sends):
    for group, message in sends:
        await layer.group_send(group, message)
