"""How a run ends, as the engine sees it, and the exceptions that end it."""

from dataclasses import dataclass

from runs.models import Run

S, R = Run.Status, Run.TerminationReason


class PolicyDenied(Exception):
    """A policy hook refused a tool call."""


class ApprovalDenied(Exception):
    """An operator denied an approval, or none came before its deadline."""


class LostRun(Exception):
    """This worker no longer holds the run (retired, reaped, or claimed elsewhere)."""


@dataclass(frozen=True)
class Outcome:
    status: str
    reason: str
    truncated: bool = False
    error_class: str = ""
    error_message: str = ""
    abandoned: bool = False  # never settle: the run was lost, or the worker "died"


COMPLETED = Outcome(S.COMPLETED, R.COMPLETED)
MAX_ITERATIONS = Outcome(S.COMPLETED, R.MAX_ITERATIONS, truncated=True)
BUDGET_EXHAUSTED = Outcome(S.COMPLETED, R.BUDGET_EXHAUSTED, truncated=True)
CANCELLED = Outcome(S.CANCELLED, R.CANCELLED)
LOST = Outcome(S.CANCELLED, R.CANCELLED, abandoned=True)
# The worker stopped (SIGTERM) before the run finished: retryable, and not a cancel.
# Settled through cancel_wins like any failure, so an operator's pending cancel still wins.
SHUTDOWN = Outcome(
    S.FAILED, R.WORKER_SHUTDOWN, error_class="WorkerShutdown",
    error_message="the worker shut down before the run finished; retry it",
)
# Released while it waits for an operator: not settled, no longer this worker's.
PARKED = Outcome(S.WAITING_FOR_APPROVAL, "", abandoned=True)


def failed(reason, error=None, message=""):
    return Outcome(
        S.FAILED,
        reason,
        error_class=getattr(error, "error_class", None) or (type(error).__name__ if error else ""),
        error_message=message or (str(error) if error else ""),
    )
