"""The read API's queries: runs (keyset pages), a run's steps, its timeline.

An agent key reads only runs its identity created or holds/held, the same rule as
`auth.run_for`; an operator key reads every run. Pages are keyset pages on the list's
order (`-created_at, -id`, the `run_newest` index), so a run created meanwhile never
shifts a page: no repeats, no skips.
"""

import base64
import json
from datetime import datetime

from django.db.models import Q

from runs.api.errors import ApiError
from runs.api.serialize import run_out
from runs.models import ApiRunCreator, Run, RunEvent, Step


def visible_runs(key):
    runs = Run.objects.all()
    if key.is_operator:
        return runs
    created = ApiRunCreator.objects.filter(worker=key.worker).values("run_id")
    return runs.filter(Q(worker=key.worker) | Q(pk__in=created))


def list_runs(key, query):
    rows = visible_runs(key).order_by("-created_at", "-id")
    if query.status:
        rows = rows.filter(status__in=query.status)
    if query.agent:
        rows = rows.filter(agent=query.agent)
    if query.since:
        rows = rows.filter(created_at__gte=query.since)
    if query.cursor:
        created_at, run_id = _decode(query.cursor)
        rows = rows.filter(Q(created_at__lt=created_at) | Q(created_at=created_at, id__lt=run_id))
    page = list(rows[: query.limit + 1])
    more = len(page) > query.limit
    page = page[: query.limit]
    return {"runs": [run_out(run) for run in page], "next_cursor": _encode(page[-1]) if more else None}


def _encode(run):
    raw = json.dumps([run.created_at.isoformat(), str(run.pk)]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode(cursor):
    from runs.transitions import parse_id

    try:
        created_at, run_id = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        created_at, run_id = datetime.fromisoformat(created_at), parse_id(run_id)
        if run_id is None or created_at.tzinfo is None:
            raise ValueError
    except (ValueError, TypeError):
        raise ApiError(400, "cursor is not one this API gave out: use next_cursor as it came", code="bad_cursor") from None
    return created_at, run_id


def list_steps(run, query):
    rows = list(Step.objects.filter(run_id=run.pk, index__gte=query.start).order_by("index")[: query.limit])
    steps = [
        {"index": step.index, "kind": step.kind, "text": step.text, "tool_calls": step.tool_calls,
         "tokens_in": step.tokens_in, "tokens_out": step.tokens_out, "cost": float(step.cost),
         "committed_at": step.committed_at}
        for step in rows
    ]
    return {"steps": steps, "next_start": rows[-1].index + 1 if rows else None}


def list_events(run, query):
    rows = list(RunEvent.objects.filter(run_id=run.pk, seq__gt=query.after).order_by("seq")[: query.limit])
    events = [{"seq": e.seq, "kind": e.kind, "at": e.at, "actor": e.actor, "source": e.source, "data": e.data or {}}
              for e in rows]
    return {"events": events, "next_after": rows[-1].seq if rows else None}
