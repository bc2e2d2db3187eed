"""Streamed progress: a batch of deltas and tool events, relayed to live viewers.

Deltas are not written to the database (they are ephemeral; committed steps are the
record). The batch counts as the holder's heartbeat, so an agent busy streaming is not
reaped for not calling /heartbeat too, and the beat's answer tells the agent whether a
cancel is pending: a chatty agent learns of a cancel at its next batch even without
the control channel.
"""

from ninja import Query, Router, Status

from runs import transitions
from runs.api import inflight, reading
from runs.api.auth import run_for
from runs.api.db_call import db_call
from runs.api.errors import ApiError, too_large
from runs.api.relay import coalesce, relay
from runs.api.schemas import ERRORS, ConflictOut, EventsIn, EventsOut, EventsPageOut, EventsQuery
from runs.api.serialize import conflict

router = Router(tags=["worker"])
MAX_EVENTS = 500


def _beat_held_run(key, run_id, events):
    """Heartbeat the live run this key holds and keep the batch's text for late viewers;
    (run, the beat: whether a cancel or a guardrail's stop is pending). Else ApiError 404/403, 409 saying why not
    (`run_ended`, `not_claimed`, `not_held`, `step_committed`) or 422 `wrong_step`.
    A pending cancel is no reason to refuse: viewers still see the text up to the stop."""
    run = run_for(key, run_id, only=("id", "status", "worker", "cancel_requested_at", "steps"))
    beat = transitions.heartbeat(run.pk, worker=key.worker) if run.worker == key.worker else None
    if beat is None or not beat.held:
        run.refresh_from_db(fields=["status", "worker"])  # the beat's guard is the truth
        body = conflict(run, key.worker)
        error = body.pop("error")
        raise ApiError(409, error["message"], code=error["code"], extra=body)
    _check_steps(run, events)
    inflight.record(run.pk, events)
    return run, beat


def _check_steps(run, events):
    """Every event is for the step in flight: the run's committed step count."""
    for number, event in enumerate(events):
        if event.step < run.steps:
            raise ApiError(409, f"step {event.step} is committed already; the step in flight is {run.steps}",
                           code="step_committed", fields={f"events.{number}.step": f"expected {run.steps}"})
        if event.step > run.steps:
            raise ApiError(422, f"step {event.step} is not in flight: commit step {run.steps} first",
                           code="wrong_step", fields={f"events.{number}.step": f"expected {run.steps}"})


@router.get("/runs/{run_id}/events", response={200: EventsPageOut, **ERRORS}, summary="Read the timeline")
def list_events(request, run_id: str, query: Query[EventsQuery]):
    """The run's timeline entries with `seq > after`, oldest first, at most `limit`."""
    return Status(200, reading.list_events(run_for(request.auth, run_id, only=("id",)), query))


@router.post("/runs/{run_id}/events", response={200: EventsOut, 409: ConflictOut, **ERRORS}, summary="Stream events")
async def post_events(request, run_id: str, payload: EventsIn):
    """Relay a batch of text deltas and tool events to the run's live viewers,
    coalesced. At most 500 events and 1 MiB per request (413 beyond). 409 when this
    key does not hold the live run or an event is for a committed step
    (`step_committed`); 422 `wrong_step` for a step beyond the one in flight."""
    if len(payload.events) > MAX_EVENTS:
        raise too_large(f"at most {MAX_EVENTS} events per request; send several batches")
    run, beat = await db_call(_beat_held_run)(request.auth, run_id, payload.events)
    messages = coalesce(run.pk, payload.events)
    relayed = await relay(run.pk, messages)
    return Status(200, {"accepted": len(payload.events), "relayed": relayed, "cancel_requested": beat.cancel_requested,
                        "stop_reason": beat.stop or None})
