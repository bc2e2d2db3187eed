"""What the worker holding a run does with it: heartbeat, commit steps, suspend, settle.

Each is the transition of the same name, guarded on `worker = api:<key name>`: the
ownership read in `run_for` only picks the error code; the transition's own guard
is what keeps another key's run unchanged.
"""

from decimal import Decimal

from django.db import transaction
from django.http import HttpResponse
from ninja import Query, Router, Status

from runs import transitions
from runs.api import inflight, reading
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
    StepsOut,
    StepsQuery,
    SuspendIn,
    SuspendOut,
)
from runs.api.serialize import conflict
from runs.api.views_runs import mark_replay
from runs.models import Run, RunEvent, RunInput
from runs.transitions.inputs import denied_calls

router = Router(tags=["worker"])
ACCESS_FIELDS = ("id", "worker")


def refuse_unacknowledged(run, key):
    """409 `answer_pending` while the holder has an operator answer it has not
    acknowledged: it must see the answer before it goes on (a denial above all)."""
    if run.worker == key.worker and RunInput.objects.filter(run_id=run.pk, status=RunInput.Status.QUEUED).exists():
        raise ApiError(409, "an operator answer is not acknowledged yet: read GET /runs/{id}/inputs, act on it, "
                            "ack it, then go on", code="answer_pending")


def refuse_denied(run, calls):
    """422 `tool_denied` for a tool call an operator denied (by `call_id`, or without
    one by tool name and args): a denied tool must not run."""
    for denied in denied_calls(run.pk):
        for call in calls:
            if denied.get("call_id"):
                hit = call.id == denied["call_id"]
            else:
                hit = bool(denied.get("tool")) and call.name == denied["tool"] and call.args == denied.get("args")
            if hit:
                raise ApiError(422, f"tool call {call.id!r} ({call.name}) was denied by an operator: it must not run",
                               code="tool_denied", fields={"tool_calls": call.id})


@router.get("/runs/{run_id}/steps", response={200: StepsOut, **ERRORS}, summary="Read committed steps")
def list_steps(request, run_id: str, query: Query[StepsQuery]):
    """Committed steps in index order from `start`, at most `limit`."""
    return Status(200, reading.list_steps(run_for(request.auth, run_id, only=ACCESS_FIELDS), query))


@router.post("/runs/{run_id}/heartbeat", response={200: HeartbeatOut, **ERRORS}, summary="Heartbeat")
def heartbeat(request, run_id: str):
    """Say this worker is alive on the run. `held: false` means stop working on it;
    `cancel_requested: true` means stop at the next checkpoint and settle cancelled, or,
    with `stop_reason` (a guardrail's stop), settle with that reason."""
    key = request.auth
    run = run_for(key, run_id, only=ACCESS_FIELDS)
    beat = transitions.heartbeat(run.pk, worker=key.worker)
    return Status(200, {"held": beat.held, "cancel_requested": beat.cancel_requested, "stop_reason": beat.stop or None,
                        "status": beat.status})


@router.post("/runs/{run_id}/steps", response={201: StepOut, 409: ConflictOut, **ERRORS}, summary="Commit a step")
def commit_step(request, run_id: str, payload: StepIn, response: HttpResponse, idempotency_key: IdempotencyKey = None):
    """Commit step `index` whole (its text and every tool call with its result) and add
    it to the run's totals. 409 when this key does not hold the running run, a cancel
    is pending (discard the step and settle cancelled), or `index` is not the next one.
    Honours `Idempotency-Key`. 422 for a tool-call id given twice or a call an
    operator denied; 409 `answer_pending` until the holder acks every answer."""
    key = request.auth
    run = run_for(key, run_id, only=ACCESS_FIELDS)
    duplicate = payload.duplicate_call_id()
    if duplicate is not None:
        raise ApiError(422, f"tool call id {duplicate!r} appears twice in this step", code="duplicate_tool_call_id",
                       fields={"tool_calls": duplicate[:200]})

    def compute():
        refuse_unacknowledged(run, key)
        refuse_denied(run, payload.tool_calls)
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
        inflight.clear(run.pk)
        return 201, {"committed": True, "index": step.index}

    status, body = idempotent(request, key.worker, compute)
    mark_replay(request, response)
    return Status(status, body)


@router.post("/runs/{run_id}/discard", response={201: DiscardOut, 409: ConflictOut, **ERRORS},
             summary="Record a discarded step")
def discard(request, run_id: str, payload: DiscardIn, response: HttpResponse, idempotency_key: IdempotencyKey = None):
    """Record the step you threw away (after a cancel, or a failure), before you settle:
    its interrupted text, the tool calls abandoned, and the tokens and cost it spent,
    which count in the run's totals (the provider charged them) and show apart on the
    timeline's `step_discarded` entry. `index` is the step in flight (the committed
    count). 409 when this key does not hold the live run, `wrong_index`, or
    `already_discarded` (once per index). Honours `Idempotency-Key`."""
    key = request.auth
    run = run_for(key, run_id, only=ACCESS_FIELDS)

    def compute():
        with transaction.atomic():
            # Locked so two copies of one discard cannot both charge it; settle and
            # queue_input take the same row.
            current = Run.objects.select_for_update().only("id", "status", "worker", "steps").get(pk=run.pk)
            if current.status not in Run.LIVE or current.worker != key.worker:
                return 409, conflict(run, key.worker)
            if current.steps != payload.index:
                raise ApiError(409, f"the step in flight is {current.steps}", code="wrong_index",
                               fields={"index": f"expected {current.steps}"})
            if RunEvent.objects.filter(run_id=run.pk, kind=RunEvent.Kind.STEP_DISCARDED,
                                       data__index=payload.index).exists():
                raise ApiError(409, f"step {payload.index} was discarded already", code="already_discarded")
            event = transitions.record_discard(
                run.pk, worker=key.worker, index=payload.index, text=payload.text, tool_calls=payload.tool_calls,
                tokens_in=payload.tokens_in, tokens_out=payload.tokens_out, cost=payload.cost,
                reason=payload.reason, estimated=payload.estimated,
            )
        if event is None:
            return 409, conflict(run, key.worker)
        inflight.clear(run.pk)
        return 201, {"discarded": True, "index": payload.index}

    status, body = idempotent(request, key.worker, compute)
    mark_replay(request, response)
    return Status(status, body)


def check_totals(run, totals):
    """422 `totals_mismatch` when settle totals contradict the record: steps and tool
    calls must be the committed ones; spend may not be below what was recorded."""
    row = Run.objects.only("steps", "tool_calls", "tokens_in", "tokens_out", "cost").get(pk=run.pk)
    fields = {}
    for name in ("steps", "tool_calls"):
        if name in totals and totals[name] != getattr(row, name):
            fields[name] = f"{getattr(row, name)} committed"
    for name in ("tokens_in", "tokens_out", "cost"):
        if name in totals and Decimal(str(totals[name])) < Decimal(str(getattr(row, name))):
            fields[name] = f"at least {getattr(row, name)} recorded"
    if fields:
        raise ApiError(422, "settle totals contradict the committed and discarded steps; omit totals to keep the "
                            "server's", code="totals_mismatch", fields=fields)


@router.post("/runs/{run_id}/settle", response={200: SettleOut, 409: ConflictOut, **ERRORS}, summary="Settle")
def settle(request, run_id: str, payload: SettleIn, response: HttpResponse, idempotency_key: IdempotencyKey = None):
    """End the run: 200 `{"settled": true}` with the status that was recorded (a failure
    while a cancel is pending is recorded as cancelled), or 409 with the outcome that
    stands (a late or duplicate settle changes nothing). An impossible status/reason
    pair is a 422. Honours `Idempotency-Key`."""
    key = request.auth
    run = run_for(key, run_id, only=ACCESS_FIELDS)

    def compute():
        current = Run.objects.only("id", "status", "worker").get(pk=run.pk)
        if current.status == Run.Status.QUEUED:
            return 409, conflict(run, key.worker, settled=False)
        totals = payload.totals.model_dump(exclude_none=True) if payload.totals else None
        if totals and current.status in Run.LIVE and current.worker == key.worker:
            check_totals(run, totals)
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
        inflight.clear(run.pk)
        if outcome == transitions.SettleOutcome.CANCEL_WON:  # the cancel came first: recorded cancelled
            return 200, {"settled": True, "status": Run.Status.CANCELLED, "reason": Run.TerminationReason.CANCELLED}
        if outcome == transitions.SettleOutcome.STOPPED:  # a guardrail's stop came first: recorded as it says
            ended = Run.objects.values("status", "termination_reason").get(pk=run.pk)
            return 200, {"settled": True, "status": ended["status"], "reason": ended["termination_reason"]}
        return 200, {"settled": True, "status": payload.status, "reason": payload.reason}

    status, body = idempotent(request, key.worker, compute)
    mark_replay(request, response)
    return Status(status, body)


@router.post("/runs/{run_id}/suspend", response={200: SuspendOut, 409: ConflictOut, **ERRORS}, summary="Suspend")
def suspend(request, run_id: str, payload: SuspendIn):
    """Park the running run waiting for input or approval; `request` says what for.
    409 when this key does not hold it running, a cancel is pending, or an operator
    answer is not acknowledged yet (`answer_pending`)."""
    key = request.auth
    run = run_for(key, run_id, only=ACCESS_FIELDS)
    refuse_unacknowledged(run, key)
    try:
        won = transitions.suspend(run.pk, worker=key.worker, status=payload.status, request=payload.request)
    except ValueError as error:
        raise ApiError(422, str(error)) from None
    if not won:
        return Status(409, conflict(run, key.worker))
    return Status(200, {"suspended": True, "status": payload.status, "reason": ""})
