"""Runs, their committed steps, their timeline, and their queued inputs.

Nothing here changes a status: that is `runs.transitions`, one guarded UPDATE each.
The database itself enforces the status/reason table with check constraints.
"""

import uuid

from django.db import models
from django.db.models import Q


class RunStatus(models.TextChoices):
    QUEUED = "queued", "queued"  # created; no worker holds it yet
    RUNNING = "running", "running"  # a worker holds it and is stepping
    WAITING_FOR_INPUT = "waiting_for_input", "waiting for input"  # paused for an operator message
    WAITING_FOR_APPROVAL = "waiting_for_approval", "waiting for approval"  # a gated tool awaits a yes/no
    COMPLETED = "completed", "completed"  # ended normally (maybe truncated: see reason)
    FAILED = "failed", "failed"  # ended by a policy, a denial, a provider, a lost or stopping worker
    CANCELLED = "cancelled", "cancelled"  # somebody stopped it; not a malfunction


class TerminationReason(models.TextChoices):
    COMPLETED = "completed", "completed"  # the agent finished its work
    MAX_ITERATIONS = "max_iterations", "max iterations"  # iteration cap hit (truncated)
    BUDGET_EXHAUSTED = "budget_exhausted", "budget exhausted"  # token or cost budget spent (truncated)
    POLICY_DENIED = "policy_denied", "policy denied"  # a policy hook refused
    APPROVAL_DENIED = "approval_denied", "approval denied"  # approval refused or never given
    PROVIDER_FAILED = "provider_failed", "provider failed"  # the model provider failed after retries
    WORKER_LOST = "worker_lost", "worker lost"  # the worker stopped heartbeating
    WORKER_SHUTDOWN = "worker_shutdown", "worker shutdown"  # the worker shut down (SIGTERM) first: retry it
    CANCELLED = "cancelled", "cancelled"  # a cancel request or a retire


class CancelSource(models.TextChoices):
    DASHBOARD = "dashboard", "dashboard"  # an operator in the dashboard (stored "user" before migration 0008)
    API = "api", "api"  # an operator key over the agent API
    CLI = "cli", "cli"  # manage.py runs abort / retire
    ADMIN = "admin", "admin"  # the Django admin action
    WATCHDOG = "watchdog", "watchdog"  # deadline or unhonoured cancel
    WORKER = "worker", "worker"  # the run's own worker: its deadline passed
    SHUTDOWN = "shutdown", "shutdown"  # older rows: a stopping worker now ends runs failed/worker_shutdown
    GUARDRAIL = "guardrail", "guardrail"  # a budget or the agent's loop policy asked the run to stop


TERMINAL = frozenset({RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED})
LIVE = (RunStatus.RUNNING, RunStatus.WAITING_FOR_INPUT, RunStatus.WAITING_FOR_APPROVAL)
NON_TERMINAL = (RunStatus.QUEUED, *LIVE)
WAITING = (RunStatus.WAITING_FOR_INPUT, RunStatus.WAITING_FOR_APPROVAL)
REASONS = {
    RunStatus.COMPLETED: (
        TerminationReason.COMPLETED,
        TerminationReason.MAX_ITERATIONS,
        TerminationReason.BUDGET_EXHAUSTED,
    ),
    RunStatus.FAILED: (
        TerminationReason.POLICY_DENIED,
        TerminationReason.APPROVAL_DENIED,
        TerminationReason.PROVIDER_FAILED,
        TerminationReason.WORKER_LOST,
        TerminationReason.WORKER_SHUTDOWN,
    ),
    RunStatus.CANCELLED: (TerminationReason.CANCELLED,),
}
RETRYABLE = (TerminationReason.PROVIDER_FAILED, TerminationReason.WORKER_LOST, TerminationReason.WORKER_SHUTDOWN)
TRUNCATING = (TerminationReason.MAX_ITERATIONS, TerminationReason.BUDGET_EXHAUSTED)
# What a requested stop ends a run with, besides an abort's "" (cancelled): the money ran
# out (completed, truncated), or a guardrail policy refused to let it go on (failed).
STOP_REASONS = (TerminationReason.BUDGET_EXHAUSTED, TerminationReason.POLICY_DENIED)


class Run(models.Model):
    Status = RunStatus
    TerminationReason = TerminationReason
    CancelSource = CancelSource
    TERMINAL = TERMINAL
    LIVE = LIVE
    NON_TERMINAL = NON_TERMINAL
    WAITING = WAITING
    REASONS = REASONS
    RETRYABLE = RETRYABLE
    TRUNCATING = TRUNCATING
    STOP_REASONS = STOP_REASONS

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    agent = models.CharField(max_length=100)
    title = models.CharField(max_length=300, blank=True)
    input = models.JSONField(default=dict, blank=True)

    status = models.CharField(max_length=32, choices=Status.choices, default=Status.QUEUED)
    termination_reason = models.CharField(
        max_length=32, choices=TerminationReason.choices, blank=True, default=""
    )
    truncated = models.BooleanField(default=False)
    error_class = models.CharField(max_length=200, blank=True)
    error_message = models.TextField(blank=True)

    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)

    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    cancel_requested_by = models.CharField(max_length=150, blank=True)
    cancel_source = models.CharField(max_length=16, choices=CancelSource.choices, blank=True)
    cancel_note = models.CharField(max_length=500, blank=True)
    # When the watchdog found the cancel not honoured and told the worker to stop hard;
    # the run is retired RUNWARDEN_CANCEL_ESCALATE_S later if it still has not ended.
    cancel_escalated_at = models.DateTimeField(null=True, blank=True)
    # A stop asked by a guardrail rides on the cancel request (same checkpoints, same
    # delivery, same escalation) and says how the run then ends: "" is an abort
    # (cancelled); budget_exhausted ends it completed/truncated, policy_denied failed.
    stop_reason = models.CharField(
        max_length=32, choices=[(r.value, r.label) for r in STOP_REASONS], blank=True, default="", db_default=""
    )

    worker = models.CharField(max_length=200, blank=True)
    # What a waiting run waits for: the gated tool call and its deadline, or a prompt.
    # A run the engine released while it waits also keeps here (under "resume") what
    # any worker needs to take it up again: the in-flight reply, the inputs it took.
    pending_request = models.JSONField(null=True, blank=True)
    # A released waiting run nobody answers by then is ended by the watchdog.
    wait_deadline = models.DateTimeField(null=True, blank=True)

    max_iterations = models.PositiveIntegerField(null=True, blank=True)
    token_budget = models.PositiveBigIntegerField(null=True, blank=True)
    cost_budget = models.DecimalField(max_digits=14, decimal_places=6, null=True, blank=True)
    deadline = models.DateTimeField(null=True, blank=True)
    tool_call_budget = models.PositiveIntegerField(null=True, blank=True)

    tokens_in = models.BigIntegerField(default=0)
    tokens_out = models.BigIntegerField(default=0)
    cost = models.DecimalField(max_digits=14, decimal_places=6, default=0)
    steps = models.PositiveIntegerField(default=0)
    tool_calls = models.PositiveIntegerField(default=0)

    retry_of = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="retries"
    )
    retried_at = models.DateTimeField(null=True, blank=True)
    # Last RunEvent.seq handed out; bumped inside the UPDATE that records the event.
    event_seq = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["-created_at", "-id"]
        permissions = [("cancel_run", "Can abort, retire, retry and approve runs")]
        indexes = [
            models.Index(fields=["-created_at", "-id"], name="run_newest"),
            models.Index(fields=["status", "heartbeat_at"], name="run_status_heartbeat"),
            models.Index(fields=["agent", "-created_at"], name="run_agent_newest"),
            models.Index(fields=["status", "-created_at"], name="run_status_newest"),
            models.Index(fields=["termination_reason", "-created_at"], name="run_reason_newest"),
            models.Index(fields=["status", "created_at"], name="run_claim_order"),
            models.Index(fields=["status", "started_at"], name="run_status_started"),
            models.Index(
                fields=["wait_deadline"], name="run_wait_deadline", condition=Q(wait_deadline__isnull=False)
            ),
        ]
        constraints = [
            models.CheckConstraint(
                name="run_status_valid",
                condition=Q(status__in=[s.value for s in RunStatus]),
            ),
            models.CheckConstraint(
                name="run_reason_matches_status",
                condition=(
                    Q(status__in=[RunStatus.QUEUED, *LIVE], termination_reason="")
                    | Q(status=RunStatus.COMPLETED, termination_reason__in=REASONS[RunStatus.COMPLETED])
                    | Q(status=RunStatus.FAILED, termination_reason__in=REASONS[RunStatus.FAILED])
                    | Q(status=RunStatus.CANCELLED, termination_reason__in=REASONS[RunStatus.CANCELLED])
                ),
            ),
            models.CheckConstraint(
                name="run_terminal_has_finished_at",
                condition=Q(status__in=[RunStatus.QUEUED, *LIVE]) | Q(finished_at__isnull=False),
            ),
            # Who holds a run: a queued one nobody, a running one its worker; a waiting
            # one either (an API agent keeps holding it, the engine releases it).
            models.CheckConstraint(name="run_queued_is_unheld", condition=~Q(status=RunStatus.QUEUED) | Q(worker="")),
            models.CheckConstraint(
                name="run_running_is_held", condition=~Q(status=RunStatus.RUNNING) | ~Q(worker="")
            ),
            models.CheckConstraint(
                name="run_stop_reason_rides_a_cancel",
                condition=Q(stop_reason="") | Q(cancel_requested_at__isnull=False, stop_reason__in=STOP_REASONS),
            ),
            models.CheckConstraint(
                name="run_truncated_has_truncating_reason",
                condition=Q(truncated=False) | Q(termination_reason__in=TRUNCATING),
            ),
        ]

    def __str__(self):
        return f"{self.title or self.agent} ({self.id})"

    @property
    def is_terminal(self):
        return self.status in self.TERMINAL

    @property
    def is_retryable(self):
        return self.is_terminal and self.termination_reason in self.RETRYABLE

    @property
    def is_released(self):
        """Waiting with no worker holding it: no heartbeat, no slot; any worker resumes it."""
        return self.status in self.WAITING and not self.worker

    @property
    def shown_request(self):
        """What it waits for, as an operator reads it (without the engine's resume state)."""
        return {k: v for k, v in (self.pending_request or {}).items() if k != "resume"} or None

    @property
    def is_cancelling(self):
        """A cancel was asked for and the worker has not settled yet."""
        return self.cancel_requested_at is not None and not self.is_terminal

    @property
    def cancelling_label(self):
        """What a pending request is called until the worker settles: an abort, or a guardrail's stop."""
        if self.stop_reason:
            return f"Stopping: {self.get_stop_reason_display()}…"
        return "Aborting…"

    @property
    def reason_label(self):
        """Why it ended; an empty reason on a terminal row is 'unknown', never 'completed'."""
        if not self.is_terminal:
            return ""
        if not self.termination_reason:
            return "unknown"
        return self.get_termination_reason_display()


class Step(models.Model):
    """A committed step: one model message and, for a tool turn, all its results."""

    class Kind(models.TextChoices):
        MESSAGE = "message", "message"  # model text only
        TOOL_CALLS = "tool_calls", "tool calls"  # model text plus tool calls with their results

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="step_set")
    index = models.PositiveIntegerField()
    kind = models.CharField(max_length=16, choices=Kind.choices)
    text = models.TextField(blank=True)
    # [{"id", "name", "args", "result", "error"}]: never a call without its result.
    tool_calls = models.JSONField(default=list, blank=True)
    tokens_in = models.PositiveIntegerField(default=0)
    tokens_out = models.PositiveIntegerField(default=0)
    cost = models.DecimalField(max_digits=14, decimal_places=6, default=0)
    committed_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run", "index"]
        constraints = [
            models.UniqueConstraint(fields=["run", "index"], name="step_unique_index"),
        ]

    def __str__(self):
        return f"step {self.index} of {self.run_id}"


class RunEvent(models.Model):
    """One entry of a run's timeline; `seq` orders it and lets viewers resume."""

    class Kind(models.TextChoices):
        CREATED = "created", "created"
        CLAIMED = "claimed", "claimed"
        CANCEL_REQUESTED = "cancel_requested", "cancel requested"
        STEP_COMMITTED = "step_committed", "step committed"
        STEP_DISCARDED = "step_discarded", "step discarded"
        SUSPENDED = "suspended", "suspended"
        RESUMED = "resumed", "resumed"
        SETTLED = "settled", "settled"
        CANCEL_TOO_LATE = "cancel_too_late", "cancel arrived too late"
        LATE_SETTLE_IGNORED = "late_settle_ignored", "late settle ignored"
        CANCEL_NOT_HONOURED = "cancel_not_honoured", "cancel not honoured: hard stop asked"
        HARD_STOPPED = "hard_stopped", "hard stop: the worker dropped the run's task"
        RETIRED = "retired", "retired"
        REAPED = "reaped", "reaped"
        RETRIED = "retried", "retried"
        INPUT_QUEUED = "input_queued", "input queued"
        INPUT_CANCELLED = "input_cancelled", "input cancelled"
        STOP_REQUESTED = "stop_requested", "stop requested"  # a guardrail asked it to stop (data: reason, limit…)
        BUDGET_CHANGED = "budget_changed", "budget changed"  # an operator raised or lowered a limit mid-run
        FLAGGED = "flagged", "flagged"  # loop or no-progress detection (data: flag, evidence)

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="events")
    seq = models.PositiveIntegerField()
    kind = models.CharField(max_length=32, choices=Kind.choices)
    at = models.DateTimeField(auto_now_add=True)
    actor = models.CharField(max_length=150, blank=True)
    source = models.CharField(max_length=16, blank=True)
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["run", "seq"]
        constraints = [
            models.UniqueConstraint(fields=["run", "seq"], name="event_unique_seq"),
        ]
        indexes = [models.Index(fields=["kind", "at"], name="event_kind_at")]

    def __str__(self):
        return f"{self.kind} #{self.seq} of {self.run_id}"


class RunInput(models.Model):
    """An input queued for a live run: an operator message or an approval answer."""

    class Kind(models.TextChoices):
        MESSAGE = "message", "message"
        APPROVAL = "approval", "approval"

    class Status(models.TextChoices):
        QUEUED = "queued", "queued"  # waiting for the run to take it
        CONSUMED = "consumed", "consumed"  # the run took it
        CANCELLED = "cancelled", "cancelled"  # the run ended first; see resolution

    class Resolution(models.TextChoices):
        FAILED = "failed", "run failed"
        INTERRUPTED = "interrupted", "run interrupted"

    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="inputs")
    kind = models.CharField(max_length=16, choices=Kind.choices)
    payload = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.QUEUED)
    resolution = models.CharField(max_length=16, choices=Resolution.choices, blank=True)
    created_by = models.CharField(max_length=150, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    resolved_at = models.DateTimeField(null=True, blank=True)
    # For an API agent: the suspend `request` this answer answers, copied when it is first
    # delivered (the agent cannot suspend again before acknowledging it, so the latest
    # suspend is the one). An acknowledged answer is `consumed`.
    request = models.JSONField(null=True, blank=True)

    class Meta:
        ordering = ["run", "created_at", "id"]
        indexes = [models.Index(fields=["run", "status"], name="input_run_status")]
        constraints = [
            models.CheckConstraint(
                name="input_resolution_matches_status",
                condition=Q(status="cancelled", resolution__in=["failed", "interrupted"])
                | (~Q(status="cancelled") & Q(resolution="")),
            ),
        ]

    def __str__(self):
        return f"{self.kind} input for {self.run_id}"


# The agent API's records live in a module of their own (keys, tickets, idempotency,
# in-flight text); they are models of this app, re-exported here for `runs.models` imports.
from runs.api_records import ApiInflight, ApiKey, ApiRunCreator, ApiTicket, IdempotencyRecord  # noqa: E402, F401
from runs.guardrail_records import AgentPolicy  # noqa: E402, F401
