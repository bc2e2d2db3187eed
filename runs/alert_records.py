"""Alert rules and their outbox: what to tell whom, and each delivery's log.

An `AlertRule` names an event (a timeline event such as `reaped`, or a condition the
watchdog scans for such as `stuck`), an optional agent, and a webhook. An
`AlertDelivery` is one message owed to one rule: written in the transaction of the
event that caused it (the outbox), then sent by `runs.alerts.delivery` outside any
transaction, retried with backoff for a day. Models of the `runs` app, re-exported
from `runs.models`.
"""

import uuid
from urllib.parse import urlsplit

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q
from django.db.models.functions import Now


class AlertOn(models.TextChoices):
    STUCK = "stuck", "stuck"  # a live run's heartbeat went stale (RUNWARDEN_STUCK_S); once per run
    REAPED = "reaped", "reaped"  # the watchdog ended a lost run failed/worker_lost
    CANCEL_NOT_HONOURED = "cancel_not_honoured", "cancel not honoured"  # the worker was told to stop hard
    WAITING_TOO_LONG = "waiting_too_long", "waiting too long"  # waiting for approval over threshold_s; once per wait
    BUDGET_REACHED = "budget_reached", "budget reached"  # a budget asked the run to stop
    LOOP_FLAGGED = "loop_flagged", "loop flagged"  # loop or no-progress detection flagged the run
    FAILURE_RATE = "failure_rate", "failure rate"  # failed / ended runs in window_s over failure_rate_pct


class AlertFormat(models.TextChoices):
    JSON = "json", "JSON"  # the documented body (docs/alerts.md)
    SLACK = "slack", "Slack"  # a Slack incoming-webhook body: {"text": …}


# A failure rate over very few runs says nothing: one failure of one run is 100 %.
MIN_RUNS_DEFAULT = 5


def http_url(value):
    """http(s)://host[:port]/…; any host name, as an intranet's (`http://alertmanager:9093/`),
    which Django's URLValidator refuses for want of a dot."""
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError:
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname or any(c.isspace() for c in value):
        raise ValidationError("the URL must be http:// or https:// and name a host", code="invalid")


class AlertRule(models.Model):
    On = AlertOn
    Format = AlertFormat

    name = models.SlugField(max_length=64, unique=True)
    on = models.CharField(max_length=32, choices=AlertOn.choices)
    agent = models.CharField(max_length=100, blank=True, help_text="blank: any agent")
    url = models.CharField(max_length=500, validators=[http_url])
    secret = models.CharField(max_length=200, help_text="signs every delivery (X-Runwarden-Signature)")
    format = models.CharField(max_length=8, choices=AlertFormat.choices, default=AlertFormat.JSON)
    threshold_s = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)], help_text="waiting_too_long: seconds waiting"
    )
    failure_rate_pct = models.PositiveSmallIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1), MaxValueValidator(100)],
        help_text="failure_rate: alert when failed runs are over this share of ended runs",
    )
    window_s = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(60)], help_text="failure_rate: the window, in seconds"
    )
    min_runs = models.PositiveSmallIntegerField(
        default=MIN_RUNS_DEFAULT, validators=[MinValueValidator(1)],
        help_text="failure_rate: fewer ended runs in the window never alert",
    )
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(name="alertrule_on_valid", condition=Q(on__in=AlertOn.values)),
            models.CheckConstraint(name="alertrule_format_valid", condition=Q(format__in=AlertFormat.values)),
            models.CheckConstraint(
                name="alertrule_waiting_has_threshold",
                condition=~Q(on=AlertOn.WAITING_TOO_LONG) | Q(threshold_s__gte=1),
            ),
            models.CheckConstraint(
                name="alertrule_rate_has_window",
                condition=~Q(on=AlertOn.FAILURE_RATE)
                | Q(failure_rate_pct__gte=1, failure_rate_pct__lte=100, window_s__gte=60),
            ),
        ]

    def __str__(self):
        return self.name

    def clean(self):
        errors = {}
        if self.on == AlertOn.WAITING_TOO_LONG and not self.threshold_s:
            errors["threshold_s"] = "waiting_too_long needs a threshold in seconds (--threshold-s)"
        if self.on == AlertOn.FAILURE_RATE:
            if not self.failure_rate_pct:
                errors["failure_rate_pct"] = "failure_rate needs a percentage (--rate-pct, 1 to 100)"
            if not self.window_s:
                errors["window_s"] = "failure_rate needs a window in seconds (--window-s, at least 60)"
        if errors:
            raise ValidationError(errors)


class AlertDelivery(models.Model):
    """One message owed to one rule: the outbox row and, once tried, its log."""

    class Status(models.TextChoices):
        PENDING = "pending", "pending"  # not sent yet; tried again at next_attempt_at
        SENT = "sent", "sent"  # the receiver answered 2xx
        FAILED = "failed", "failed"  # still not sent a day after it was written: given up

    rule = models.ForeignKey(AlertRule, on_delete=models.CASCADE, related_name="deliveries")
    event = models.CharField(max_length=32)  # the rule's `on`, or "test" (`manage.py alerts test`)
    run = models.ForeignKey("runs.Run", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    # What makes it the same alert: "stuck:<run>" fires once per run, "failure_rate:<bucket>"
    # once per window. Unique with the rule, so a second writer's insert is ignored.
    dedupe_key = models.CharField(max_length=200)
    payload = models.JSONField(default=dict, blank=True)  # the run as it was, and the event's data
    # Sent as Idempotency-Key (and the body's id) on every attempt: the receiver drops repeats.
    idempotency_key = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    status = models.CharField(max_length=8, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    # Due then; a deliverer pushes it forward as its lease while it sends.
    next_attempt_at = models.DateTimeField(db_default=Now())
    last_error = models.CharField(max_length=500, blank=True)
    last_status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "alert deliveries"
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["rule", "dedupe_key"], name="alertdelivery_once_per_key"),
            models.CheckConstraint(
                name="alertdelivery_status_valid", condition=Q(status__in=["pending", "sent", "failed"])
            ),
        ]
        indexes = [
            models.Index(fields=["next_attempt_at"], name="alertdelivery_due", condition=Q(status="pending")),
            models.Index(fields=["-created_at", "-id"], name="alertdelivery_newest"),
        ]

    def __str__(self):
        return f"{self.event} alert to {self.rule_id} ({self.status})"
