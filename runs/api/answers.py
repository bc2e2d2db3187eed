"""Operator answers as an API agent receives them, and the endpoints to read and ack them.

Answers go to the key that holds the run (not merely one that may read it): an
operator key reading an engine run must not take the engine's inputs.
"""

from ninja import Router, Status

from runs.api.auth import run_for
from runs.api.errors import ApiError
from runs.api.schemas import ERRORS, AckOut, AnswersOut, TicketOut
from runs.models import RunInput
from runs.transitions.inputs import ack_answer, pending_answers

router = Router(tags=["worker"])


def answer_out(item):
    payload = item.payload or {}
    approval = item.kind == RunInput.Kind.APPROVAL
    return {
        "id": item.pk,
        "kind": item.kind,
        "approved": bool(payload.get("approved")) if approval else None,
        "note": str(payload.get("note") or ""),
        "text": "" if approval else str(payload.get("text") or ""),
        "request": item.request or {},
        "by": item.created_by,
        "created_at": item.created_at,
    }


def answers_for(key, run):
    """The unacknowledged answers of `run` for `key`: [] unless the key holds it."""
    if run.worker != key.worker:
        return []
    return [answer_out(item) for item in pending_answers(run.pk)]


@router.get("/runs/{run_id}/inputs", response={200: AnswersOut, **ERRORS}, summary="Operator answers not yet acknowledged")
def list_answers(request, run_id: str):
    """The operator's answers (approvals, denials, input) this key has not acknowledged
    yet, oldest first. Empty unless this key holds the run."""
    key = request.auth
    run = run_for(key, run_id, only=("id", "worker"))
    return Status(200, {"inputs": answers_for(key, run)})


@router.post("/runs/{run_id}/inputs/{input_id}/ack", response={200: AckOut, **ERRORS}, summary="Acknowledge an answer")
def ack(request, run_id: str, input_id: int):
    """Say this answer was taken: it is never delivered again. Acking twice is
    harmless (`first: false`). 404 `input_not_found` for another run's or no answer."""
    key = request.auth
    run = run_for(key, run_id, only=("id", "worker"))
    found, first = ack_answer(run.pk, input_id) if run.worker == key.worker else (False, False)
    if not found:
        raise ApiError(404, f"no answer {input_id} for this key on this run", code="input_not_found")
    return Status(200, {"id": input_id, "acked": True, "first": first})


@router.post("/runs/{run_id}/ticket", response={201: TicketOut, **ERRORS}, summary="A control-socket ticket")
def ticket(request, run_id: str):
    """A one-use ticket (60 s, this run only) to open the control socket without an
    Authorization header: `?ticket=` or the subprotocols `["runwarden", "ticket.<ticket>"]`."""
    from runs.api import tickets

    key = request.auth
    run = run_for(key, run_id, only=("id",))
    token, expires_at = tickets.issue(key, run)
    return Status(201, {"ticket": token, "expires_at": expires_at, "url": f"/ws/agent/runs/{run.pk}/?ticket={token}"})
