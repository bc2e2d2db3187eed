"""The in-flight step of an API run, kept server-side so a late viewer catches up.

An engine run's worker holds its step's text and answers a viewer's `run.resync`
itself. An API agent streams through `POST /events`, possibly to any of several
servers, so the text is kept in the database (`ApiInflight`, one row per run): every
server can answer, on SQLite and PostgreSQL alike. Bounded: one row per run, at most
MAX_TEXT code points and MAX_TOOLS tools; removed when the step is committed or
discarded or the run settles through the API, and never served for a step that is no
longer in flight (a run ended another way: reaped, retired).
"""

from django.db import IntegrityError, transaction

from runs.models import ApiInflight, Run

MAX_TEXT = 1_000_000  # code points of one step kept for late joiners (live viewers get all)
MAX_TOOLS = 500


def record(run_id, events):
    """Apply a batch of events (all of the step in flight) to the kept text. Best
    effort: a batch racing another's first write is not kept (viewers still get it live)."""
    if not events:
        return
    step = events[0].step
    try:
        with transaction.atomic():
            # Locked against a concurrent batch of the same run (another server).
            row = ApiInflight.objects.select_for_update().filter(run_id=run_id).first()
            if row is None or row.step != step:
                row = row or ApiInflight(run_id=run_id)
                row.step, row.text, row.tools = step, "", {}
            for event in events:
                _apply(row, event)
            row.save()
    except IntegrityError:
        pass


def _apply(row, event):
    if event.type == "delta":
        end = event.offset + len(event.text)
        # Contiguous or overlapping text extends what is kept; a gap cannot be placed.
        if event.offset <= len(row.text) < end:
            row.text = (row.text[: event.offset] + event.text)[:MAX_TEXT]
        return
    if event.id in row.tools or len(row.tools) < MAX_TOOLS:
        row.tools[event.id] = {"id": event.id, "name": event.name, "state": event.state, "args": event.args,
                               "result": event.result, "error": event.error}


def snapshot(run_id):
    """The whole in-flight step as a resync answer (`run.progress`, offset 0,
    `resync: true`), or None when nothing is in flight."""
    row = ApiInflight.objects.filter(run_id=run_id).first()
    if row is None:
        return None
    run = Run.objects.filter(pk=run_id).values("status", "steps").first()
    if run is None or run["status"] not in Run.LIVE or row.step < run["steps"]:
        clear(run_id)  # stale: the step was committed, or the run ended some other way
        return None
    message = {"type": "run.progress", "run_id": str(run_id), "step": row.step, "offset": 0, "text": row.text,
               "resync": True}
    if row.tools:
        message["tools"] = list(row.tools.values())
    return message


def clear(run_id):
    ApiInflight.objects.filter(run_id=run_id).delete()
