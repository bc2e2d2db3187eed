"""What every transition answers: one enum per verb, each value with the sentence an
operator reads (pages, CLI, API and admin all show `label`) and its `kind`, which each
caller maps to its own codes (HTTP status, exit code) in one line.

The names are stable: other code branches on them. A transition that refuses reads
the row once to say why (which value), so no caller has to re-read it.

An outcome is truthy when the verb did what it was asked (`kind` DONE): code that
tested the old bool answers (`if settle(...)`) keeps meaning the same thing.
"""

import enum
from dataclasses import dataclass


class Kind(enum.StrEnum):
    DONE = "done"  # the row moved (or the thing was created)
    UNCHANGED = "unchanged"  # it was so already (asked twice): nothing to do, nothing wrong
    REFUSED = "refused"  # the run is not in a state this verb starts from
    NOT_FOUND = "not_found"  # no such run, or a malformed id


class Outcome(enum.StrEnum):
    """Base of the per-verb enums: `MEMBER = value, kind, label`."""

    def __new__(cls, value, kind, label):
        member = str.__new__(cls, value)
        member._value_ = value
        member.kind = kind
        member.label = label
        return member

    def __bool__(self):
        return self.kind is Kind.DONE

    @property
    def short(self):
        """The value in words, for counts: "2 requested, 1 already terminal"."""
        if self.value == "already_terminal":  # a run that ended before its turn, in an operator's words
            return "had already ended"
        return self.value.replace("_", " ")


D, U, X, N = Kind.DONE, Kind.UNCHANGED, Kind.REFUSED, Kind.NOT_FOUND
NO_SUCH_RUN = "No such run."


class CancelOutcome(Outcome):
    """request_cancel (the operator's "abort")."""

    REQUESTED = "requested", D, "Abort requested: the worker stops at its next checkpoint; the status changes when it has."
    ALREADY_REQUESTED = "already_requested", U, "An abort was already requested; still waiting for the worker to stop."
    SETTLED = "settled", D, "Nobody was working on it yet: cancelled at once."
    ALREADY_TERMINAL = "already_terminal", X, "Nothing to abort: the run had already ended."
    NOT_FOUND = "not_found", N, NO_SUCH_RUN


class RetireOutcome(Outcome):
    """retire: cancelled now, without the worker."""

    RETIRED = "retired", D, ("Retired: marked cancelled now, without waiting for its worker. "
                             "If that worker is still alive, its late settle will be ignored.")
    NOT_DUE = "not_due", X, "Not retired: the condition it was retired on no longer holds (it showed life)."
    ALREADY_TERMINAL = "already_terminal", X, "Nothing to retire: the run had already ended."
    NOT_FOUND = "not_found", N, NO_SUCH_RUN


class ResumeOutcome(Outcome):
    """resume: an operator's answer to a waiting run."""

    RESUMED = "resumed", D, "Its worker goes on with the answer."
    REQUEUED = "requeued", D, "It goes on with the answer as soon as a worker takes it up."
    WAITS_FOR_INPUT = "waits_for_input", X, "Not applied: the run waits for input, not for an approval."
    WAITS_FOR_APPROVAL = "waits_for_approval", X, "Not applied: the run waits for an approval, not for input."
    NOT_WAITING = "not_waiting", X, "Not applied: the run is no longer waiting (someone else may have answered first)."
    ALREADY_TERMINAL = "already_terminal", X, "Not applied: the run has ended."
    NOT_FOUND = "not_found", N, NO_SUCH_RUN


class SettleOutcome(Outcome):
    """settle: the worker ends its run."""

    SETTLED = "settled", D, "Settled as asked."
    CANCEL_WON = "cancel_won", D, "Settled cancelled: a cancel was pending, so the failure is recorded as cancelled."
    STOPPED = "stopped", D, "Settled as the guardrail's stop asked: it was pending, so its ending is recorded."
    ALREADY_TERMINAL = "already_terminal", X, "Late settle ignored: the run had already ended; the first outcome stands."
    NOT_HELD = "not_held", X, "Not settled: this worker does not hold the live run."
    NOT_FOUND = "not_found", N, NO_SUCH_RUN


class StopOutcome(Outcome):
    """request_stop: a budget or a loop policy asks a run to stop."""

    REQUESTED = "requested", D, "Stop requested: the run ends at its next checkpoint."
    SETTLED = "settled", D, "Stopped: nobody was running it, so it ended at once."
    ALREADY_STOPPING = "already_stopping", U, "An abort or a stop is already pending."
    ALREADY_TERMINAL = "already_terminal", X, "Not stopped: the run has already ended."
    NOT_FOUND = "not_found", N, NO_SUCH_RUN


class ClaimOutcome(Outcome):
    """claim: a worker takes a queued run."""

    CLAIMED = "claimed", D, "Claimed."
    NOT_QUEUED = "not_queued", X, "Not claimed: the run is not queued any more."
    AGENT_CAPPED = "agent_capped", X, "Not claimed: its agent reached a 24 h budget cap; the run stays queued."
    ALREADY_TERMINAL = "already_terminal", X, "Not claimed: the run has ended."
    NOT_FOUND = "not_found", N, NO_SUCH_RUN


class SuspendOutcome(Outcome):
    """suspend: the worker parks its running run to wait."""

    SUSPENDED = "suspended", D, "Waiting."
    CANCEL_PENDING = "cancel_pending", X, "Not suspended: a cancel is pending; stop instead."
    NOT_HELD = "not_held", X, "Not suspended: this worker does not hold the running run."
    ALREADY_TERMINAL = "already_terminal", X, "Not suspended: the run has ended."
    NOT_FOUND = "not_found", N, NO_SUCH_RUN


class EscalateOutcome(Outcome):
    """escalate_cancel: a pending cancel the worker ignores becomes a hard stop."""

    ESCALATED = "escalated", D, "Cancel not honoured: the worker is told to stop hard."
    ALREADY_ESCALATED = "already_escalated", U, "The worker was already told to stop hard."
    NO_CANCEL_PENDING = "no_cancel_pending", X, "Nothing to escalate: no cancel is pending."
    ALREADY_TERMINAL = "already_terminal", X, "Nothing to escalate: the run had already ended."
    NOT_FOUND = "not_found", N, NO_SUCH_RUN


class RetryOutcome(Outcome):
    """retry: a new queued run copying an ended, retryable one."""

    RETRIED = "retried", D, "Retry queued as a new run."
    ALREADY_RETRIED = "already_retried", X, "Not retried: it was retried already."
    NOT_RETRYABLE = "not_retryable", X, "Not retried: the way it ended is not retryable."
    NOT_ENDED = "not_ended", X, "Not retried: the run has not ended."
    NOT_FOUND = "not_found", N, NO_SUCH_RUN


class InputOutcome(Outcome):
    """queue_input: an operator input for a run that has not ended."""

    QUEUED = "queued", D, "Input queued for the run."
    ALREADY_TERMINAL = "already_terminal", X, "Not queued: the run has ended."
    NOT_FOUND = "not_found", N, NO_SUCH_RUN


@dataclass(frozen=True)
class Result:
    """An outcome and what the verb created (retry: the new run; queue_input: the
    RunInput), None unless it is DONE. Truthy as its outcome."""

    outcome: Outcome
    created: object = None

    def __bool__(self):
        return bool(self.outcome)


ALL = (CancelOutcome, RetireOutcome, ResumeOutcome, SettleOutcome, ClaimOutcome, SuspendOutcome, EscalateOutcome,
       RetryOutcome, InputOutcome)
