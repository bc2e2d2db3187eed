"""Raise or lower a live run's limits mid-run, audited: `set_budgets`.

It changes limits, not status, so it lives outside `runs.transitions`; like them it
is one guarded UPDATE (on a non-terminal run) with its event, BUDGET_CHANGED, written
in the same transaction and broadcast after commit. A limit lowered to or below what
the run has spent asks it to stop (`runs.budgets.enforce`, after commit).
"""

from datetime import datetime
from decimal import Decimal, InvalidOperation

from django.db import transaction
from django.utils import timezone

from runs import events
from runs.models import Run, RunEvent
from runs.transitions import parse_id
from runs.transitions.outcomes import Kind, Outcome

UNSET = object()
FIELDS = ("token_budget", "cost_budget", "tool_call_budget", "deadline")
# Column bounds: a PositiveBigIntegerField, a DecimalField(14, 6), a PositiveIntegerField.
MAX_TOKENS, MAX_COST, MAX_TOOL_CALLS = 2**63 - 1, Decimal(99999999), 2**31 - 1


class BudgetOutcome(Outcome):
    """set_budgets: an operator's change to a run's limits."""

    CHANGED = "changed", Kind.DONE, "Budgets changed."
    UNCHANGED = "unchanged", Kind.UNCHANGED, "Nothing to change: the budgets were so already."
    ALREADY_TERMINAL = "already_terminal", Kind.REFUSED, "Not changed: the run has ended."
    NOT_FOUND = "not_found", Kind.NOT_FOUND, "No such run."


def clean(token_budget=UNSET, cost_budget=UNSET, tool_call_budget=UNSET, deadline=UNSET):
    """The given limits checked and normalised ({field: value}, None clears it); raises
    ValueError with one sentence naming the field for a bad one."""
    given = {"token_budget": token_budget, "cost_budget": cost_budget, "tool_call_budget": tool_call_budget,
             "deadline": deadline}
    values = {}
    for name, value in given.items():
        if value is UNSET:
            continue
        if value is None:
            values[name] = None
        elif name == "cost_budget":
            values[name] = _cost(value)
        elif name == "deadline":
            values[name] = _deadline(value)
        else:
            top = MAX_TOKENS if name == "token_budget" else MAX_TOOL_CALLS
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= top:
                raise ValueError(f"{name} must be a whole number from 1 to {top}, or null to clear it")
            values[name] = value
    return values


def _cost(value):
    try:
        cost = Decimal(str(value))
    except InvalidOperation:
        raise ValueError("cost_budget must be a number of dollars, or null to clear it") from None
    if isinstance(value, bool) or not cost.is_finite() or not 0 < cost <= MAX_COST:
        raise ValueError(f"cost_budget must be more than 0 and at most {MAX_COST}, or null to clear it")
    if cost.as_tuple().exponent < -6:
        raise ValueError("cost_budget has at most 6 decimal places")
    return cost


def _deadline(value):
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            raise ValueError("deadline must be an ISO 8601 time with a UTC offset, or null to clear it") from None
    if not isinstance(value, datetime) or timezone.is_naive(value):
        raise ValueError("deadline must be an ISO 8601 time with a UTC offset, or null to clear it")
    if value <= timezone.now():
        raise ValueError("deadline must be in the future (to stop the run now, abort it)")
    return value


def set_budgets(run_id, *, by, source, client="", **limits):
    """Change the run's `token_budget`, `cost_budget`, `tool_call_budget` and/or
    `deadline` (keyword, each optional; None clears a limit). Raises ValueError for a
    bad value (nothing written). Returns CHANGED (event written, broadcast; a limit
    now reached asks the run to stop), UNCHANGED (every value was so already: nothing
    written), ALREADY_TERMINAL or NOT_FOUND."""
    unknown = set(limits) - set(FIELDS)
    if unknown:
        raise TypeError(f"set_budgets() got unknown limits: {', '.join(sorted(unknown))}")
    values = clean(**limits)
    run_id = parse_id(run_id)
    if run_id is None:
        return BudgetOutcome.NOT_FOUND
    actor = by.get_username() if hasattr(by, "get_username") else str(by or "")[:150]
    with transaction.atomic():
        # Read-modify-write of limits, not status: the lock keeps the [old, new] pairs
        # true against another edit; commit_step, request_cancel and settle take the
        # same row, and the UPDATE below re-checks that the run has not ended.
        current = Run.objects.select_for_update().filter(pk=run_id).values("status", *FIELDS).first()
        if current is None:
            return BudgetOutcome.NOT_FOUND
        if current["status"] in Run.TERMINAL:
            return BudgetOutcome.ALREADY_TERMINAL
        changes = {name: [current[name], value] for name, value in values.items() if _differs(current[name], value)}
        if not changes:
            return BudgetOutcome.UNCHANGED
        moved = Run.objects.filter(pk=run_id, status__in=Run.NON_TERMINAL).update(
            **{name: new for name, (_, new) in changes.items()}
        )
        if not moved:  # ended between the read and the UPDATE (SQLite takes no row lock)
            return BudgetOutcome.ALREADY_TERMINAL
        data = {"changes": {name: [_jsonable(old), _jsonable(new)] for name, (old, new) in changes.items()}}
        if client:
            data["client"] = str(client)[:64]
        events.append(run_id, RunEvent.Kind.BUDGET_CHANGED, actor=actor, source=str(source), **data)
    _enforce(run_id)
    return BudgetOutcome.CHANGED


def _differs(old, new):
    if old is None or new is None:
        return old is not new
    return Decimal(old) != Decimal(new) if isinstance(new, Decimal) else old != new


def _jsonable(value):
    if isinstance(value, Decimal):
        return format(value.normalize(), "f")
    if isinstance(value, datetime):
        return value.isoformat()
    return value


def _enforce(run_id):
    """A limit the run has already reached asks it to stop, as a committed step would."""
    from runs import budgets  # the lead's per-run enforcement (request_stop when crossed)

    run = Run.objects.filter(pk=run_id).first()
    if run is not None and not run.is_terminal:
        budgets.enforce(run)


__all__ = ["BudgetOutcome", "UNSET", "FIELDS", "clean", "set_budgets"]
