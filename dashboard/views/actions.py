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

from dashboard import budgetview, clientip, runview
from runs import budget_edits, rules, transitions
from runs import bulk as runs_bulk
from runs.models import Run
from runs.transitions import CancelOutcome, Kind, parse_id
from runs.transitions.outcomes import NO_SUCH_RUN

NOTE_LIMIT = rules.NOTE_LIMIT
INPUT_LIMIT = 10_000
BULK_LIMIT = 500

# How an outcome's kind answers over HTTP: (status code, message level). The words are
# the outcome's own label (runs.transitions.outcomes).
ANSWERS = {Kind.DONE: (200, "success"), Kind.UNCHANGED: (200, "info"), Kind.REFUSED: (409, "warning"),
           Kind.NOT_FOUND: (404, "error")}
# Accepted, not done yet: the worker still has to stop.
PENDING = {CancelOutcome.REQUESTED, CancelOutcome.ALREADY_REQUESTED}


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


def answer_outcome(request, run_id, outcome, message=None):
    """`answer` for a transition's outcome: its kind gives the code, its label the words."""
    status, level = (202, "info") if outcome in PENDING else ANSWERS[outcome.kind]
    return answer(request, run_id if outcome.kind != Kind.NOT_FOUND else None, status, level,
                  message or outcome.label)


def answer(request, run_id, status, level, message, *, goto=None, extra=None):
    """The actions partial (htmx) or a redirect with a flash message."""
    if request.htmx or status in (403, 404):
        run = runview.get_run(run_id) if run_id else None
        if run is None:
            context = {"message": message, "level": level}
            return render(request, "runs/detail.html#outcome", context, status=status)
        context = {**runview.header_context(run, runview.Access.of(request.user)), "message": message, "level": level,
                   **(extra or {})}
        return render(request, "runs/action_answer.html", context, status=status)
    getattr(messages, level)(request, message)
    return redirect(goto or reverse("dashboard:run", args=[run_id]), permanent=False)


@operator_action
def cancel(request, run_id):
    note = request.POST.get("note", "").strip()[:NOTE_LIMIT]
    outcome = transitions.request_cancel(run_id, by=request.user, source=Run.CancelSource.DASHBOARD, note=note,
                                         client=clientip.client_ip(request))
    return answer_outcome(request, run_id, outcome)


@operator_action
def retire(request, run_id):
    note = request.POST.get("note", "").strip()[:NOTE_LIMIT]
    outcome = transitions.retire(run_id, by=request.user, note=note, client=clientip.client_ip(request))
    return answer_outcome(request, run_id, outcome)


@operator_action
def retry(request, run_id):
    result = transitions.retry(run_id, by=request.user, client=clientip.client_ip(request))
    if not result:
        return answer_outcome(request, run_id, result.outcome)
    target = reverse("dashboard:run", args=[result.created.pk])
    if request.htmx:
        response = HttpResponse(status=201)
        response["HX-Redirect"] = target  # a full page load: the new run gets its own socket
        return response
    messages.success(request, result.outcome.label)
    return redirect(target)


@operator_action
def approve(request, run_id):
    approved = request.POST.get("decision") == "approve"
    outcome = transitions.resume(run_id, expect=Run.Status.WAITING_FOR_APPROVAL, by=request.user,
                                 answer={"approved": approved}, client=clientip.client_ip(request))
    if outcome and not approved:  # a denial does not let the run go on: it ends it
        return answer_outcome(request, run_id, outcome, "Denied: the run ends failed (approval denied) "
                                                        "when its worker takes the answer.")
    return answer_outcome(request, run_id, outcome, f"Approved. {outcome.label}" if outcome else None)


@operator_action
def send_input(request, run_id):
    text = request.POST.get("text", "").strip()[:INPUT_LIMIT]
    if not text:
        if runview.get_run(run_id) is None:
            return answer(request, None, 404, "error", NO_SUCH_RUN)
        return answer(request, run_id, 400, "warning", "Type something to send.")
    outcome = transitions.resume(run_id, expect=Run.Status.WAITING_FOR_INPUT, by=request.user, answer={"text": text},
                                 client=clientip.client_ip(request))
    return answer_outcome(request, run_id, outcome, f"Sent. {outcome.label}" if outcome else None)


@operator_action
def budgets(request, run_id):
    """Raise or lower the run's limits (only the fields changed on the form); audited
    as budget_changed. A limit lowered to what was spent asks the run to stop."""
    try:
        limits = budgetview.parse_form(request.POST)
        if not limits:
            outcome = budget_edits.BudgetOutcome.UNCHANGED if runview.get_run(run_id) else None
            if outcome is None:
                return answer(request, None, 404, "error", NO_SUCH_RUN)
        else:
            outcome = budget_edits.set_budgets(run_id, by=request.user, source=Run.CancelSource.DASHBOARD,
                                               client=clientip.client_ip(request), **limits)
    except ValueError as error:
        if runview.get_run(run_id) is None:
            return answer(request, None, 404, "error", NO_SUCH_RUN)
        return answer(request, run_id, 400, "warning", str(error))
    status, level = ANSWERS[outcome.kind]
    message = outcome.label
    if outcome == budget_edits.BudgetOutcome.CHANGED:
        message = "Budgets changed: " + ", ".join(_change_words(name, value) for name, value in limits.items()) + "."
    return answer(request, run_id if outcome.kind != Kind.NOT_FOUND else None, status, level, message,
                  extra={"refresh_budgets": True})


def _change_words(name, value):
    label = {"token_budget": "tokens", "cost_budget": "cost", "tool_call_budget": "tool calls"}.get(name, name)
    return f"{label} no limit" if value is None else f"{label} {value}"


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
    summary = runs_bulk.execute(action, Run.objects.filter(pk__in=ids), by=request.user, note=note,
                                client=clientip.client_ip(request))
    verb = {"cancel": "Abort", "retire": "Retire", "retry": "Retry"}[action]
    parts = ", ".join(f"{count} {outcome}" for outcome, count in sorted(summary.items()))
    messages.info(request, f"{verb} of {len(ids)} run{'s' if len(ids) != 1 else ''}: {parts or 'none found'}.")
    return redirect(back)
