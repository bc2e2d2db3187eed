"""Operator keys only: abort (the cooperative cancel; `/cancel` is its older spelling,
kept as an alias) and retire (end a run without its worker)."""

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
from runs.models import Run
from runs.transitions import CancelOutcome

router = Router(tags=["operator"])


def _standing(run):
    row = Run.objects.only("status", "termination_reason").get(pk=run.pk)
    return {"status": row.status, "reason": row.termination_reason}


@router.post("/runs/{run_id}/abort", response={200: CancelOut, 409: ConflictOut, **ERRORS}, summary="Abort",
             operation_id="abort_run")
@router.post("/runs/{run_id}/cancel", response={200: CancelOut, 409: ConflictOut, **ERRORS},
             summary="Abort (older spelling of /abort)", operation_id="cancel_run")
def cancel(request, run_id: str, payload: Annotated[CancelIn | None, Body()] = None):
    """Ask the run to stop (it ends `cancelled`): a queued run is cancelled at once (`settled`), a live one
    is signalled on its control channel (`requested`; asking again is
    `already_requested`). 409 when it had already ended."""
    key = request.auth
    require_operator(key)
    run = run_for(key, run_id, only=("id",))
    note = payload.note if payload else ""
    outcome = transitions.request_cancel(run.pk, by=key.worker, source=Run.CancelSource.API, note=note)
    if outcome == CancelOutcome.NOT_FOUND:  # deleted between the read and the request
        raise ApiError(404, "no such run", code="run_not_found")
    if outcome == CancelOutcome.ALREADY_TERMINAL:
        return Status(409, conflict(run, key.worker))
    return Status(200, {"outcome": outcome.value, **_standing(run)})


@router.post("/runs/{run_id}/retire", response={200: RetireOut, 409: ConflictOut, **ERRORS}, summary="Retire")
def retire(request, run_id: str, payload: Annotated[CancelIn | None, Body()] = None):
    """Cancel a run now, without its worker (for a worker that is gone). The totals it
    reached are kept. 409 when it had already ended."""
    key = request.auth
    require_operator(key)
    run = run_for(key, run_id, only=("id",))
    note = payload.note if payload else ""
    if not transitions.force_cancel(run.pk, by=key.worker, note=note, source=Run.CancelSource.API):
        return Status(409, conflict(run, key.worker))
    return Status(200, {"retired": True, **_standing(run)})
