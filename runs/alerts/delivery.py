"""Sending the outbox: signed POSTs, at least once, retried with backoff for a day.

`deliver_due` claims due pending rows, sends each outside any transaction and records
the answer. Claiming pushes `next_attempt_at` forward as a lease: on PostgreSQL the
candidates are read `FOR UPDATE SKIP LOCKED` (another deliverer skips them instead of
waiting), and everywhere the lease is a conditional UPDATE that only one deliverer
wins, so two deliverers never send the same row at once. A deliverer that dies while
sending leaves a lease that simply runs out: the row is sent again (at least once; the
Idempotency-Key lets the receiver drop the repeat).

The one module that writes an alert delivery's `status` (not a run's).
"""

import asyncio
import enum
import logging
import random
import threading
import uuid
from datetime import timedelta

import httpx
from channels.db import database_sync_to_async
from django.conf import settings
from django.db import transaction
from django.db.models import Case, DateTimeField, ExpressionWrapper, F, Q, Value, When
from django.db.models.functions import Now

from runs.alert_records import AlertDelivery
from runs.alerts import body, signing

log = logging.getLogger("runs.alerts")
D = AlertDelivery.Status
USER_AGENT = "Runwarden-Alerts"


class Result(enum.Enum):
    SENT = "sent"  # the receiver answered 2xx
    RETRYING = "retrying"  # refused, unreachable or too slow: tried again after the backoff
    GAVE_UP = "gave up"  # still failing a day after it was written: failed for good
    LOST_LEASE = "lost lease"  # someone else settled or re-leased it meanwhile: nothing recorded


def _later(seconds):
    return ExpressionWrapper(Now() + timedelta(seconds=seconds), output_field=DateTimeField())


def lease_s():
    # Longer than one send can take, so a lease never runs out under a live sender.
    return 2 * settings.RUNWARDEN_ALERT_TIMEOUT_S + 30


def backoff_s(attempts):
    """Seconds before the next try after `attempts` failed ones: base · 2^(n-1), capped,
    with up to a fifth of jitter so a receiver coming back is not hit by all at once."""
    delay = min(settings.RUNWARDEN_ALERT_BACKOFF_S * 2 ** max(attempts - 1, 0), settings.RUNWARDEN_ALERT_BACKOFF_MAX_S)
    return delay * random.uniform(0.8, 1.0)


DUE = Q(status=D.PENDING, next_attempt_at__lte=Now())


def claim(limit):
    """Lease up to `limit` due deliveries to this caller; returns them (with their rule)."""
    with transaction.atomic():
        # Rows another deliverer holds locked are skipped (PostgreSQL), not waited for.
        candidates = list(
            AlertDelivery.objects.select_for_update(skip_locked=True, of=("self",))
            .filter(DUE).order_by("next_attempt_at").values_list("pk", flat=True)[:limit]
        )
        # Re-checked in the UPDATE: where rows are not locked (SQLite), one deliverer wins each.
        lease = _later(lease_s())
        won = [pk for pk in candidates if AlertDelivery.objects.filter(DUE, pk=pk).update(next_attempt_at=lease)]
    return list(AlertDelivery.objects.select_related("rule").filter(pk__in=won).order_by("next_attempt_at"))


def post(delivery, client):
    """POST one delivery; returns (status code or None, error text or "")."""
    content = body.encode(delivery)
    headers = {
        "Content-Type": "application/json",
        "Idempotency-Key": str(delivery.idempotency_key),
        signing.HEADER: signing.sign(delivery.rule.secret, content),
        "User-Agent": USER_AGENT,
    }
    try:
        response = client.post(delivery.rule.url, content=content, headers=headers)
    except httpx.HTTPError as error:
        return None, f"{type(error).__name__}: {error}"[:500] if str(error) else type(error).__name__
    if 200 <= response.status_code < 300:
        return response.status_code, ""
    return response.status_code, f"HTTP {response.status_code}: {response.text[:200]}"[:500]


def record(delivery, code, error):
    """Store one attempt's answer; a Result. Guarded on the lease (pending, not since
    re-leased by someone else after it ran out)."""
    mine = AlertDelivery.objects.filter(pk=delivery.pk, status=D.PENDING, next_attempt_at=delivery.next_attempt_at)
    common = {"attempts": F("attempts") + 1, "last_status_code": code, "last_error": error}
    if not error:
        won = mine.update(status=D.SENT, sent_at=Now(), **common)
        return Result.SENT if won else Result.LOST_LEASE
    give_up = Q(created_at__lt=ExpressionWrapper(
        Now() - timedelta(seconds=settings.RUNWARDEN_ALERT_GIVE_UP_S), output_field=DateTimeField()
    ))
    won = mine.update(
        status=Case(When(give_up, then=Value(D.FAILED)), default=Value(D.PENDING)),
        next_attempt_at=_later(backoff_s(delivery.attempts + 1)), **common,
    )
    if not won:
        return Result.LOST_LEASE
    gave_up = AlertDelivery.objects.filter(pk=delivery.pk, status=D.FAILED).exists()
    return Result.GAVE_UP if gave_up else Result.RETRYING


def send(delivery, client=None):
    """Send one claimed delivery now and record the answer: (Result, code, error)."""
    own = client is None
    client = client or httpx.Client(timeout=settings.RUNWARDEN_ALERT_TIMEOUT_S, follow_redirects=False)
    try:
        code, error = post(delivery, client)
    finally:
        if own:
            client.close()
    result = record(delivery, code, error)
    if result == Result.GAVE_UP:
        log.warning("alert %s (rule %s) failed for good after %d attempts: %s",
                    delivery.idempotency_key, delivery.rule.name, delivery.attempts + 1, error)
    elif error:
        log.info("alert %s (rule %s) not delivered (%s); retrying later", delivery.idempotency_key,
                 delivery.rule.name, error)
    return result, code, error


def release(delivery):
    """Give back an unsent lease (due again now), unless someone else holds it since."""
    AlertDelivery.objects.filter(pk=delivery.pk, status=D.PENDING, next_attempt_at=delivery.next_attempt_at).update(
        next_attempt_at=Now()
    )


def deliver_due(limit=20, *, halt=None):
    """Send up to `limit` due deliveries; returns {Result: count}. No transaction is
    open while a request is in flight. `halt` (a threading.Event) set meanwhile stops
    after the send in flight; the rest are given back, due at once."""
    results = {}
    claimed = claim(limit)
    if not claimed:
        return results
    with httpx.Client(timeout=settings.RUNWARDEN_ALERT_TIMEOUT_S, follow_redirects=False) as client:
        for n, delivery in enumerate(claimed):
            if halt is not None and halt.is_set():
                for unsent in claimed[n:]:
                    release(unsent)
                break
            result, _, _ = send(delivery, client)
            results[result] = results.get(result, 0) + 1
    return results


def send_test(rule):
    """Send one test delivery for `rule` now, logged like any other: (Result, code,
    error). A test that fails is failed at once, never retried."""
    test = AlertDelivery.objects.create(
        rule=rule, event="test", dedupe_key=f"test:{uuid.uuid4()}", next_attempt_at=_later(lease_s()),
        payload={"agent": rule.agent, "run": None, "data": {"test": True}},
    )
    test = AlertDelivery.objects.select_related("rule").get(pk=test.pk)  # its lease and created_at, as stored
    result, code, error = send(test)
    if result != Result.SENT:
        AlertDelivery.objects.filter(pk=test.pk).update(status=D.FAILED)
        result = Result.GAVE_UP
    return result, code, error


def retry_now(delivery_id):
    """Make a pending or failed delivery due now (the alerts page's button); a failed one
    is pending again for one more try. Returns whether there was such a delivery."""
    return bool(AlertDelivery.objects.filter(pk=delivery_id, status__in=[D.PENDING, D.FAILED]).update(
        status=D.PENDING, next_attempt_at=Now()
    ))


# Its own thread, not the sweep's: a receiver that hangs (up to the timeout per row)
# never holds up the watchdog's sweep.
adeliver_due = database_sync_to_async(deliver_due, thread_sensitive=False)


async def serve(stop, *, interval_s=None):
    """Deliver every `interval_s` (RUNWARDEN_WATCHDOG_S) until `stop` is set (or this
    task is cancelled); a failing round is logged and retried next time (the database
    may be away). Stopping waits for the one send in flight at most."""
    interval = interval_s if interval_s is not None else settings.RUNWARDEN_WATCHDOG_S
    halt = threading.Event()  # the delivering thread's view of `stop`
    try:
        while not stop.is_set():
            try:
                await adeliver_due(halt=halt)
            except Exception:  # noqa: BLE001 - keep delivering; the next round retries
                log.exception("alert delivery failed")
            try:
                await asyncio.wait_for(stop.wait(), timeout=interval)
            except TimeoutError:
                pass
    finally:
        halt.set()
