"""Appending to a run's timeline.

Each event takes the next per-run `seq` from `Run.event_seq`, bumped in the same
UPDATE that changes the run when there is one, so a viewer that reconnects asks for
"everything after seq N" and gets no gap and no duplicate.
"""

from django.db import transaction
from django.db.models import F

from runs import broadcast
from runs.alerts import outbox
from runs.models import Run, RunEvent


def append(run_id, kind, /, *, actor="", source="", **data):
    """Write one event outside a status change (late settles, steps, inputs) and
    broadcast it after commit. The UPDATE also locks the run row until commit."""
    with transaction.atomic():
        Run.objects.filter(pk=run_id).update(event_seq=F("event_seq") + 1)
        # agent, title and reason: what an alert about this event says (`runs.alerts.outbox`).
        run = Run.objects.only(
            "id", "status", "event_seq", "cancel_source", "cancel_note", "agent", "title", "termination_reason"
        ).get(pk=run_id)
        event = RunEvent.objects.create(
            run_id=run_id, seq=run.event_seq, kind=kind, actor=actor, source=source, data=data
        )
        outbox.record(run, event)  # same transaction: a rolled-back change alerts nobody
        broadcast.on_commit(run, event)
    return event

