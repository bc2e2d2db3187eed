"""What the worker holding a run does with it: heartbeat, commit steps, suspend, settle.

Each is the transition of the same name, guarded on `worker = api:<key name>`: the
ownership read in `run_for` only picks the error code; the transition's own guard
is what keeps another key's run unchanged.
"""

from django.http import HttpResponse
from ninja import Router, Status

from runs import transitions
from runs.api.auth import run_for
from runs.api.errors import ApiError
from runs.api.idempotency import IdempotencyKey, idempotent
from runs.api.schemas import (
    ERRORS,
    ConflictOut,
    DiscardIn,
    DiscardOut,
    HeartbeatOut,
    SettleIn,
    SettleOut,
    StepIn,
    StepOut,
    SuspendIn,
    SuspendOut,
)
from runs.api.serialize import conflict
from runs.api.views_runs import mark_replay
from runs.models import Run

router = Router(tags=["worker"])
ACCESS_FIELDS = ("id", "worker")


@router.post("/runs/{run_id}/heartbeat", response={200: HeartbeatOut, **ERRORS}, summary="Heartbeat")
def heartbeat(request, run_id: str):
    """Say this worker is alive on the run. `held: false` means stop working on it;
    `cancel_requested: true` means stop at the next checkpoint and settle cancelled."""
    key = request.auth
    run = run_for(key, run_id, only=ACCESS_FIELDS)
    beat = transitions.heartbeat(run.pk, worker=key.worker)
    return Status(200, {"held": beat.held, "cancel_requested": beat.cancel_requested, "status": beat.status})


@router.post("/runs/{run_id}/steps", response={201: StepOut, 409: ConflictOut, **ERRORS}, summary="Commit a step")
def commit_step(request, run_id: str, payload: StepIn, response: HttpResponse, idempotency_key: IdempotencyKey = None):
    """Commit step `index` whole (its text and every tool call with its result) and add
    it to the run's totals. 409 when this key does not hold the running run, a cancel
    is pending (discard the step and settle cancelled), or `index` is not the next one.
    Honours `Idempotency-Key`."""
    key = request.auth
    run = run_for(key, run_id, only=ACCESS_FIELDS)

    def compute():
        try:
            step = transitions.commit_step(
                run.pk,
                worker=key.worker,
                index=payload.index,
                kind=payload.kind,
                text=payload.text,
                tool_calls=[call.model_dump(exclude_unset=True) for call in payload.tool_calls],
                tokens_in=payload.tokens_in,
                tokens_out=payload.tokens_out,
                cost=payload.cost,
            )
        except ValueError as error:
            raise ApiError(422, str(error)) from None
        if step is None:
            return 409, conflict(run, key.worker, index=payload.index)
        return 201, {"committed": True, "index": step.index}

    status, body = idempotent(request, key.worker, compute)
    mark_replay(request, response)
    return Status(status, body)


@router.post("/runs/{run_id}/discard", response={201: DiscardOut, 409: ConflictOut, **ERRORS},
             summary="Record a discarded step")
def discard(request, run_id: str, payload: DiscardIn):
    """Record the step you threw away (after a cancel, or a failure), before you settle:
    its interrupted text, the tool calls abandoned, and the tokens and cost it spent,
    which count in the run's totals (the provider charged them) and show apart on the
    timeline's `step_discarded` entry. 409 when this key does not hold the live run."""
    key = request.auth
    run = run_for(key, run_id, only=ACCESS_FIELDS)
    event = transitions.record_discard(
        run.pk, worker=key.worker, index=payload.index, text=payload.text, tool_calls=payload.tool_calls,
        tokens_in=payload.tokens_in, tokens_out=payload.tokens_out, cost=payload.cost,
        reason=payload.reason, estimated=payload.estimated,
    )
    if event is None:
        return Status(409, conflict(run, key.worker))
    return Status(201, {"discarded": True, "index": payload.index})


@router.post("/runs/{run_id}/settle", response={200: SettleOut, 409: ConflictOut, **ERRORS}, summary="Settle")
def settle(request, run_id: str, payload: SettleIn, response: HttpResponse, idempotency_key: IdempotencyKey = None):
    """End the run: 200 `{"settled": true}` with the status that was recorded (a failure
    while a cancel is pending is recorded as cancelled), or 409 with the outcome that
    stands (a late or duplicate settle changes nothing). An impossible status/reason
    pair is a 422. Honours `Idempotency-Key`."""
    key = request.auth
    run = run_for(key, run_id, only=ACCESS_FIELDS)

    def compute():
        current = Run.objects.only("id", "status").get(pk=run.pk)
        if current.status == Run.Status.QUEUED:
            return 409, conflict(run, key.worker, settled=False)
        totals = payload.totals.model_dump(exclude_none=True) if payload.totals else None
        try:
            outcome = transitions.settle(
                run.pk,
                status=payload.status,
                reason=payload.reason,
                worker=key.worker,
                truncated=payload.truncated,
                totals=totals,
                error_class=payload.error_class,
                error_message=payload.error_message,
            )
        except ValueError as error:
            raise ApiError(422, str(error), code="invalid_outcome") from None
        if not outcome:
            return 409, conflict(run, key.worker, settled=False)
        if outcome == transitions.SettleOutcome.CANCEL_WON:  # the cancel came first: recorded cancelled
            return 200, {"settled": True, "status": Run.Status.CANCELLED, "reason": Run.TerminationReason.CANCELLED}
        return 200, {"settled": True, "status": payload.status, "reason": payload.reason}

    status, body = idempotent(request, key.worker, compute)
    mark_replay(request, response)
    return Status(status, body)


@router.post("/runs/{run_id}/suspend", response={200: SuspendOut, 409: ConflictOut, **ERRORS}, summary="Suspend")
def suspend(request, run_id: str, payload: SuspendIn):
    """Park the running run waiting for input or approval; `request` says what for.
    409 when this key does not hold it running or a cancel is pending."""
    key = request.auth
    run = run_for(key, run_id, only=ACCESS_FIELDS)
    try:
        won = transitions.suspend(run.pk, worker=key.worker, status=payload.status, request=payload.request)
    except ValueError as error:
        raise ApiError(422, str(error)) from None
    if not won:
        return Status(409, conflict(run, key.worker))
    return Status(200, {"suspended": True, "status": payload.status, "reason": ""})
