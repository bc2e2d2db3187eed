"""Streamed progress: a batch of deltas and tool events, relayed to live viewers.

Deltas are not written to the database (they are ephemeral; committed steps are the
record). The batch counts as the holder's heartbeat, so an agent busy streaming is not
reaped for not calling /heartbeat too, and the beat's answer tells the agent whether a
cancel is pending: a chatty agent learns of a cancel at its next batch even without
the control channel.
"""

from ninja import Router, Status

from runs import transitions
from runs.api.auth import run_for
from runs.api.db_call import db_call
from runs.api.errors import ApiError, too_large
from runs.api.relay import coalesce, relay
from runs.api.schemas import ERRORS, ConflictOut, EventsIn, EventsOut
from runs.api.serialize import conflict

router = Router(tags=["worker"])
MAX_EVENTS = 500


def _beat_held_run(key, run_id):
    """Heartbeat the live run this key holds; (run, whether a cancel is pending). Else
    ApiError 404/403, or 409 saying why not (`run_ended`, `not_claimed`, `not_held`).
    A pending cancel is no reason to refuse: viewers still see the text up to the stop."""
    run = run_for(key, run_id, only=("id", "status", "worker", "cancel_requested_at"))
    beat = transitions.heartbeat(run.pk, worker=key.worker) if run.worker == key.worker else None
    if beat is None or not beat.held:
        run.refresh_from_db(fields=["status", "worker"])  # the beat's guard is the truth
        body = conflict(run, key.worker)
        error = body.pop("error")
        raise ApiError(409, error["message"], code=error["code"], extra=body)
    return run, beat.cancel_requested


@router.post("/runs/{run_id}/events", response={200: EventsOut, 409: ConflictOut, **ERRORS}, summary="Stream events")
async def post_events(request, run_id: str, payload: EventsIn):
    """Relay a batch of text deltas and tool events to the run's live viewers,
    coalesced. At most 500 events and 1 MiB per request (413 beyond). 409 when this
    key does not hold the live run."""
    if len(payload.events) > MAX_EVENTS:
        raise too_large(f"at most {MAX_EVENTS} events per request; send several batches")
    run, cancel_requested = await db_call(_beat_held_run)(request.auth, run_id)
    messages = coalesce(run.pk, payload.events)
    relayed = await relay(run.pk, messages)
    return Status(200, {"accepted": len(payload.events), "relayed": relayed, "cancel_requested": cancel_requested})
