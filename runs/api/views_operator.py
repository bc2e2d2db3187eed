"""Operator keys only: abort (the cooperative cancel; `/cancel` is its old spelling,
kept as an alias) and retire (end a run now, without its worker)."""

from typing import Annotated

from ninja import Body, Router, Status

from runs import transitions
from runs.api.auth import require_operator, run_for
from runs.api.errors import ApiError
from runs.api.schemas import (
    ERRORS,
    CancelIn,
    CancelOut,
    ConflictOut,
    RetireOut,
)
from runs.api.serialize import conflict
from runs.clientip import client_ip
from runs.models import Run
from runs.transitions import CancelOutcome, Kind

router = Router(tags=["operator"])
ABORT = {"response": {200: CancelOut, 409: ConflictOut, **ERRORS}, "summary": "Abort"}


def _refused(outcome, run, key):
    if outcome.kind == Kind.NOT_FOUND:  # deleted between the read and the request
        raise ApiError(404, "no such run", code="run_not_found")
    return Status(409, conflict(run, key.worker))  # what stands, and why the change lost


@router.post("/runs/{run_id}/abort", operation_id="abort", **ABORT)
@router.post("/runs/{run_id}/cancel", operation_id="cancel", deprecated=True, **ABORT)
def abort(request, run_id: str, payload: Annotated[CancelIn | None, Body()] = None):
    """Ask the run to stop: a queued run is cancelled at once (`settled`), a live one
    is signalled on its control channel (`requested`; asking again is
    `already_requested`). 409 when it had already ended. `/cancel` is the old path."""
    key = request.auth
    require_operator(key)
    run = run_for(key, run_id, only=("id", "status", "termination_reason"))
    note = payload.note if payload else ""
    outcome = transitions.request_cancel(run.pk, by=key.worker, source=Run.CancelSource.API, note=note,
                                         client=client_ip(request))
    if outcome.kind in (Kind.REFUSED, Kind.NOT_FOUND):
        return _refused(outcome, run, key)
    if outcome == CancelOutcome.SETTLED:
        standing = {"status": Run.Status.CANCELLED, "reason": Run.TerminationReason.CANCELLED}
    else:  # flagged: the status stays the live one it had
        standing = {"status": run.status, "reason": run.termination_reason}
    return Status(200, {"outcome": outcome.value, **standing})


@router.post("/runs/{run_id}/retire", response={200: RetireOut, 409: ConflictOut, **ERRORS}, summary="Retire")
def retire(request, run_id: str, payload: Annotated[CancelIn | None, Body()] = None):
    """End the run now, cancelled, without its worker (for a worker that is gone or
    ignores an abort); its late settle is ignored. The totals it reached are kept.
    409 when it had already ended."""
    key = request.auth
    require_operator(key)
    run = run_for(key, run_id, only=("id",))
    note = payload.note if payload else ""
    outcome = transitions.retire(run.pk, by=key.worker, note=note, source=Run.CancelSource.API,
                                 client=client_ip(request))
    if not outcome:
        return _refused(outcome, run, key)
    return Status(200, {"retired": True, "status": Run.Status.CANCELLED, "reason": Run.TerminationReason.CANCELLED})
