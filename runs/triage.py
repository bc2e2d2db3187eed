"""What needs an operator now: the sections of the triage page, each on an index.

Each section is a queryset (oldest problem first) plus its count; pages take the first
few rows and offer bulk actions on the rest.
"""

from dataclasses import dataclass

from django.db.models import Exists, OuterRef, Subquery

from runs import loops, queries, rules
from runs.models import Run, RunEvent


@dataclass(frozen=True)
class Section:
    key: str
    title: str
    help: str
    runs: object  # a queryset, ordered
    action: str  # the bulk action that fits: "retire", "cancel" or "retry"
    detail: object = None  # detail(rows): adds what a section's rows show besides the run (its evidence)


def sections():
    limits = rules.thresholds()
    return [
        Section(
            "stuck", "Stuck",
            f"Live, but no heartbeat for over {limits.stuck.total_seconds():g}s: the worker may be gone.",
            rules.with_flags(queries.stuck(limits.stuck)), "retire",
        ),
        Section(
            "not_honoured", "Cancel not honoured",
            f"Cancel requested over {limits.grace.total_seconds():g}s ago and still live.",
            rules.with_flags(Run.objects.filter(rules.not_honoured(limits.grace))).order_by("cancel_requested_at"),
            "retire",
        ),
        Section(
            "flagged", "Flagged: looping or going nowhere",
            "Live runs that called the same tool with the same arguments over and over, kept failing their tool "
            "calls, or heartbeat without any new step (limits per agent). Oldest flag first.",
            flagged_live(), "cancel", detail=with_flag_words,
        ),
        Section(
            "approval", "Waiting for approval",
            "Oldest first: no worker holds them; unanswered, each ends at its deadline.",
            Run.objects.filter(status=Run.Status.WAITING_FOR_APPROVAL).order_by("created_at"), "cancel",
        ),
        Section(
            "retryable", "Failed and retryable",
            "Provider failures and lost workers that have not been retried yet.",
            Run.objects.filter(rules.RETRYABLE).order_by("-created_at"), "retry",
        ),
        Section(
            "longest", "Longest running",
            "Running the longest: still useful, or going nowhere?",
            Run.objects.filter(status=Run.Status.RUNNING).order_by("started_at"), "cancel",
        ),
    ]


def section(key):
    """One section by key; KeyError for an unknown one."""
    return {s.key: s for s in sections()}[key]


def flagged_live():
    """Live (or queued) runs with a FLAGGED event, by their first flag, oldest first."""
    flags = RunEvent.objects.filter(run=OuterRef("pk"), kind=RunEvent.Kind.FLAGGED)
    return (Run.objects.filter(Exists(flags), status__in=Run.NON_TERMINAL)
            .annotate(flagged_at=Subquery(flags.order_by("seq").values("at")[:1])).order_by("flagged_at"))


def with_flag_words(runs):
    """Give each of `runs` (a list) `flags`: its FLAGGED events as
    {"flag", "label", "words", "policy", "at"}, oldest first, in one query. Returns the list."""
    by_run = {}
    found = (RunEvent.objects.filter(run_id__in=[run.pk for run in runs], kind=RunEvent.Kind.FLAGGED)
             .order_by("seq").values_list("run_id", "data", "at"))
    for run_id, data, at in found:
        data = data or {}
        by_run.setdefault(run_id, []).append({
            "flag": data.get("flag"), "label": loops.LABELS.get(data.get("flag"), "flagged"), "words": loops.describe(data.get("flag"), data.get("evidence")),
            "policy": data.get("policy"), "at": at,
        })
    for run in runs:
        run.flags = by_run.get(run.pk, [])
    return runs
