"""Bulk operator actions: preview, then execute through the guarded transitions.

What is confirmed is what is done: the preview freezes the set of ids (`freeze`), and
the confirmation acts on exactly that set (`execute_ids`), so a run created between
the two is not swept in. Each run goes through its own guarded transition: one that
ended meanwhile is reported as such ("had already ended"), never overwritten.
"""

from collections import Counter
from dataclasses import dataclass

from runs import rules, transitions
from runs.models import Run

ACTIONS = ("cancel", "retire", "retry")
FREEZE_LIMIT = 5000  # ids one preview can carry (signed, in the confirmation form)


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


def freeze(action, runs, *, limit=FREEZE_LIMIT):
    """The ids the action would touch now (newest first, at most `limit`): the set a
    confirmation acts on, whatever happens to the filters meanwhile."""
    if action not in ACTIONS:
        raise ValueError(f"unknown bulk action {action!r}")
    targets = applicable(action, runs).order_by("-created_at", "-id")
    return list(targets.values_list("pk", flat=True)[:limit])


def execute_ids(action, run_ids, *, by=None, source=Run.CancelSource.DASHBOARD, note="", client=""):
    """Apply `action` to exactly `run_ids` (each through its guarded transition); a
    Counter of outcomes in which every id counts once."""
    if action not in ACTIONS:
        raise ValueError(f"unknown bulk action {action!r}")
    return Counter(_act(action, run_id, by=by, source=source, note=note, client=client) for run_id in run_ids)


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


def execute(action, runs, *, by=None, source=Run.CancelSource.DASHBOARD, note="", client="", batch=200):
    """Apply `action` to every run of the queryset; returns a Counter of what each
    became, in the outcomes' words (`Outcome.short`): requested / already requested /
    settled / already terminal (cancel), retired / already terminal (retire),
    retried / not retryable / already retried / not ended (retry)."""
    if action not in ACTIONS:
        raise ValueError(f"unknown bulk action {action!r}")
    summary = Counter()
    for ids in ids_in_batches(runs, batch):
        for run_id in ids:
            summary[_act(action, run_id, by=by, source=source, note=note, client=client)] += 1
    return summary


def _act(action, run_id, *, by, source, note, client):
    if action == "cancel":
        return transitions.request_cancel(run_id, by=by, source=source, note=note, client=client).short
    if action == "retire":
        return transitions.retire(run_id, by=by, source=source, note=note, client=client).short
    return transitions.retry(run_id, by=by, source=source, client=client).outcome.short
