"""Operator actions on runs: abort, retire, retry, approve/deny, send input, bulk.

Each is a POST that needs `runs.cancel_run` (checked here, not only by hiding the
button) and goes through `runs.transitions`. An htmx request gets the run's actions
partial with an honest message and a status code that says what happened; a plain
form post is redirected to the run with the same message.
"""

from functools import wraps

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from dashboard import runview
from runs import bulk as runs_bulk
from runs import transitions
from runs.models import Run
from runs.transitions import CancelOutcome, parse_id

NOTE_LIMIT = 500
INPUT_LIMIT = 10_000
BULK_LIMIT = 500

CANCEL_ANSWERS = {
    # outcome: (status code, level, message)
    CancelOutcome.REQUESTED: (
        202, "info",
        "Cancel requested. Waiting for the worker to stop at its next checkpoint; the status changes when it has.",
    ),
    CancelOutcome.ALREADY_REQUESTED: (
        202, "info", "A cancel was already requested; still waiting for the worker to stop.",
    ),
    CancelOutcome.SETTLED: (200, "success", "It had not started yet: cancelled at once."),
    CancelOutcome.ALREADY_TERMINAL: (409, "warning", "Nothing to cancel: the run had already ended."),
    CancelOutcome.NOT_FOUND: (404, "error", "No such run."),
}


def operator_action(view):
    """Logged in, POST only, and `runs.cancel_run`; 403 (with a message) otherwise."""

    @require_POST
    @login_required
    @wraps(view)
    def wrapper(request, *args, **kwargs):
        if not request.user.has_perm("runs.cancel_run"):
            return answer(request, None, 403, "error", "You are not allowed to change runs.")
        return view(request, *args, **kwargs)

    return wrapper


def answer(request, run_id, status, level, message, *, goto=None):
    """The actions partial (htmx) or a redirect with a flash message."""
    if request.htmx or status in (403, 404):
        run = runview.get_run(run_id) if run_id else None
        if run is None:
            context = {"message": message, "level": level}
            return render(request, "runs/detail.html#outcome", context, status=status)
        context = {**runview.header_context(run, runview.Access.of(request.user)), "message": message, "level": level}
        return render(request, "runs/action_answer.html", context, status=status)
    getattr(messages, level)(request, message)
    return redirect(goto or reverse("dashboard:run", args=[run_id]), permanent=False)


@operator_action
def cancel(request, run_id):
    note = request.POST.get("note", "").strip()[:NOTE_LIMIT]
    outcome = transitions.request_cancel(run_id, by=request.user, source=Run.CancelSource.USER, note=note)
    status, level, message = CANCEL_ANSWERS[outcome]
    return answer(request, run_id, status, level, message)


@operator_action
def retire(request, run_id):
    note = request.POST.get("note", "").strip()[:NOTE_LIMIT]
    if runview.get_run(run_id) is None:
        return answer(request, None, 404, "error", "No such run.")
    if transitions.force_cancel(run_id, by=request.user, note=note):
        return answer(request, run_id, 200, "success",
                      "Retired: marked cancelled now, without waiting for its worker. If that worker "
                      "is still alive, its late settle will be ignored.")
    return answer(request, run_id, 409, "warning", "Nothing to retire: the run had already ended.")


@operator_action
def retry(request, run_id):
    if runview.get_run(run_id) is None:
        return answer(request, None, 404, "error", "No such run.")
    new = transitions.retry(run_id, by=request.user)
    if new is None:
        return answer(request, run_id, 409, "warning", "Not retried: the run is not retryable or was retried already.")
    target = reverse("dashboard:run", args=[new.pk])
    if request.htmx:
        response = HttpResponse(status=201)
        response["HX-Redirect"] = target  # a full page load: the new run gets its own socket
        return response
    messages.success(request, "Retry queued as a new run.")
    return redirect(target)


@operator_action
def approve(request, run_id):
    if runview.get_run(run_id) is None:
        return answer(request, None, 404, "error", "No such run.")
    approved = request.POST.get("decision") == "approve"
    if transitions.resume(run_id, by=request.user, answer={"approved": approved}):
        if approved:
            return answer(request, run_id, 200, "success", "Approved. The run goes on with that answer.")
        # A denial ends the run (failed / approval denied) once its worker reads it.
        return answer(request, run_id, 200, "warning", "Denied. The run ends as failed (approval denied) "
                      "when its worker reads the answer.")
    return answer(request, run_id, 409, "warning", "Not applied: the run is no longer waiting for approval "
                  "(someone else may have answered first).")


@operator_action
def send_input(request, run_id):
    if runview.get_run(run_id) is None:
        return answer(request, None, 404, "error", "No such run.")
    text = request.POST.get("text", "").strip()[:INPUT_LIMIT]
    if not text:
        return answer(request, run_id, 400, "warning", "Type something to send.")
    waiting = Run.objects.filter(pk=run_id, status=Run.Status.WAITING_FOR_INPUT).exists()
    if waiting and transitions.resume(run_id, by=request.user, answer={"text": text}):
        return answer(request, run_id, 200, "success", "Sent. The run goes on with your input.")
    return answer(request, run_id, 409, "warning", "Not sent: the run is no longer waiting for input.")


@operator_action
def bulk(request):
    """Abort, retire or retry the selected runs, each through its own guarded
    transition (`runs.bulk`); the message counts what each run became."""
    action = request.POST.get("action", "")
    ids = {parse_id(run_id) for run_id in request.POST.getlist("run")[:BULK_LIMIT]} - {None}
    back = request.POST.get("next", "")
    back = back if back.startswith("/") and not back.startswith("//") else reverse("dashboard:list")
    if action not in runs_bulk.ACTIONS or not ids:
        messages.warning(request, "Pick runs and an action.")
        return redirect(back)
    note = request.POST.get("note", "").strip()[:NOTE_LIMIT] or f"bulk {action}"
    summary = runs_bulk.execute(action, Run.objects.filter(pk__in=ids), by=request.user, note=note)
    verb = {"cancel": "Abort", "retire": "Retire", "retry": "Retry"}[action]
    parts = ", ".join(f"{count} {outcome}" for outcome, count in sorted(summary.items()))
    messages.info(request, f"{verb} of {len(ids)} run{'s' if len(ids) != 1 else ''}: {parts or 'none found'}.")
    return redirect(back)
