"""Operator answers handed to an API agent: delivered until acknowledged, then done.

The engine takes its inputs with `consume_inputs`. An external agent cannot be trusted
to have seen an answer because it was sent, so an answer stays `queued` (delivered
again on every socket, long-poll and GET) until the agent acknowledges it, which makes
it `consumed` exactly once. Only inputs change here, never a run's status.
"""

from django.db import transaction
from django.db.models.functions import Now

from runs.models import RunEvent, RunInput


def pending_answers(run_id):
    """The run's unacknowledged answers, oldest first. An answer first read here gets
    the `request` it answers: the run's latest suspend (an API agent cannot suspend
    again before acknowledging, so no later suspend can be mistaken for it)."""
    items = list(RunInput.objects.filter(run_id=run_id, status=RunInput.Status.QUEUED).order_by("created_at", "id"))
    missing = [item for item in items if item.request is None]
    if missing:
        last = RunEvent.objects.filter(run_id=run_id, kind=RunEvent.Kind.SUSPENDED).order_by("-seq").first()
        request = ((last.data or {}).get("request") if last else None) or {}
        RunInput.objects.filter(pk__in=[item.pk for item in missing], request__isnull=True).update(request=request)
        for item in missing:
            item.request = request
    return items


def ack_answer(run_id, input_id):
    """Acknowledge answer `input_id` of the run: (found, first). `first` is False for
    an answer acknowledged before (a retried ack changes nothing)."""
    with transaction.atomic():
        rows = RunInput.objects.filter(run_id=run_id, pk=input_id)
        if not rows.exists():
            return False, False
        pending_answers(run_id)  # an answer acked unseen still records what it answered
        first = bool(rows.filter(status=RunInput.Status.QUEUED).update(status=RunInput.Status.CONSUMED,
                                                                      resolved_at=Now()))
    return True, first


def denied_calls(run_id):
    """What the run's denials refused: [{"tool", "args", "call_id"}] (the requests)."""
    rows = RunInput.objects.filter(run_id=run_id, kind=RunInput.Kind.APPROVAL, payload__approved=False)
    if rows.filter(request__isnull=True).exists():
        pending_answers(run_id)
    return [item.request or {} for item in rows]
