"""What needs an operator now: the sections of the triage page, each on an index.

Each section is a queryset (oldest problem first) plus its count; pages take the first
few rows and offer bulk actions on the rest.
"""

from dataclasses import dataclass
from runs import queries, rules
from runs.models import Run


@dataclass(frozen=True)
class Section:
    key: str
    title: str
    help: str
    runs: object  # a queryset, ordered
    action: str  # the bulk action that fits: "retire", "cancel" or "retry"


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
