"""Operator keys only: raise or lower a run's limits mid-run (`runs.budget_edits`).

Operator scope only, not the run's own agent: a budget is a brake the operator holds
on the agent, and an agent that could raise its own would have none."""

from ninja import Router, Status

from runs import budget_edits
from runs.api.auth import require_operator, run_for
from runs.api.errors import ApiError
from runs.api.schemas import ERRORS, BudgetsIn, ConflictOut, RunOut
from runs.api.serialize import conflict, run_out
from runs.clientip import client_ip
from runs.models import Run

router = Router(tags=["operator"])
Outcome = budget_edits.BudgetOutcome


@router.patch("/runs/{run_id}/budgets", response={200: RunOut, 409: ConflictOut, **ERRORS},
              summary="Change a run's budgets")
def set_budgets(request, run_id: str, payload: BudgetsIn):
    """Set `token_budget`, `cost_budget`, `tool_call_budget` and/or `deadline` of a run
    that has not ended (a field left out stays; null clears it) and answer the run.
    Audited on the run's timeline (`budget_changed`, with each [old, new]). A limit
    lowered to what the run already spent asks it to stop (budget_exhausted). 400
    `invalid_budget` for a deadline not in the future, 409 `run_ended` when the run has
    ended, 404 `run_not_found`."""
    key = request.auth
    require_operator(key)
    run = run_for(key, run_id, only=("id",))
    limits = {name: getattr(payload, name) for name in payload.model_fields_set}
    try:
        outcome = budget_edits.set_budgets(run.pk, by=key.worker, source=Run.CancelSource.API,
                                           client=client_ip(request), **limits)
    except ValueError as error:
        raise ApiError(400, str(error), code="invalid_budget",
                       fields={name: str(error) for name in limits if name in str(error)}) from None
    if outcome == Outcome.NOT_FOUND:  # deleted between the read and the change
        raise ApiError(404, "no such run", code="run_not_found")
    if outcome == Outcome.ALREADY_TERMINAL:
        return Status(409, conflict(run, key.worker))
    return Status(200, run_out(Run.objects.get(pk=run.pk)))
