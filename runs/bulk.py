"""Bulk operator actions: preview, then execute through the guarded transitions.

The ids are taken from the selection (or the filter) when the operator confirms, then
acted on in batches, each run through its own guarded transition: a run that settles
while the operation is under way is counted as what it became, never overwritten.
"""

from collections import Counter
from dataclasses import dataclass

from runs import rules, transitions
from runs.models import Run
from runs.transitions import CancelOutcome

ACTIONS = ("cancel", "retire", "retry")
OUTCOME_LABELS = {
    CancelOutcome.REQUESTED: "requested",
    CancelOutcome.ALREADY_REQUESTED: "already requested",
    CancelOutcome.SETTLED: "settled",
    CancelOutcome.ALREADY_TERMINAL: "already terminal",
    CancelOutcome.NOT_FOUND: "not found",
}


@dataclass(frozen=True)
class Preview:
    count: int
    sample: list


def applicable(action, runs):
    """Narrow a queryset to the runs an action can change (what the preview counts)."""
    if action == "retry":
        return runs.filter(rules.RETRYABLE)
    return runs.filter(status__in=Run.NON_TERMINAL)


def preview(action, runs, *, sample=5):
    """How many runs the action would touch now, and a few of them."""
    if action not in ACTIONS:
        raise ValueError(f"unknown bulk action {action!r}")
    targets = applicable(action, runs)
    return Preview(count=targets.count(), sample=list(targets.order_by("-created_at")[:sample]))


def ids_in_batches(runs, batch):
    """Keyset over the primary key: stable while rows change, cheap at any size."""
    last = None
    while True:
        page = runs.order_by("pk")
        if last is not None:
            page = page.filter(pk__gt=last)
        ids = list(page.values_list("pk", flat=True)[:batch])
        if not ids:
            return
        yield ids
        last = ids[-1]


def execute(action, runs, *, by=None, source=Run.CancelSource.USER, note="", batch=200):
    """Apply `action` to every run of the queryset; returns a Counter of outcomes:
    requested / already requested / settled / already terminal (cancel, retire),
    retried / not retryable (retry)."""
    if action not in ACTIONS:
        raise ValueError(f"unknown bulk action {action!r}")
    summary = Counter()
    for ids in ids_in_batches(runs, batch):
        for run_id in ids:
            summary[_act(action, run_id, by=by, source=source, note=note)] += 1
    return summary


def _act(action, run_id, *, by, source, note):
    if action == "cancel":
        return OUTCOME_LABELS[transitions.request_cancel(run_id, by=by, source=source, note=note)]
    if action == "retire":
        won = transitions.force_cancel(run_id, by=by, source=source, note=note)
        return "settled" if won else "already terminal"
    return "retried" if transitions.retry(run_id, by=by, source=source) else "not retryable"
