"""The alerts page: the rules, the delivery log, and "retry now"."""

from datetime import timedelta

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from runs import transitions
from runs.alert_records import AlertDelivery, AlertRule
from runs.alerts import outbox

pytestmark = pytest.mark.django_db


@pytest.fixture
def logged():
    """A rule on reaped with one failed and one sent delivery, about a real run."""
    rule = AlertRule.objects.create(name="reaped-hook", on="reaped", url="http://hooks.internal:8125/rw", secret="s")
    run = transitions.create_run(agent="scripted", title="nightly import")
    outbox.enqueue([rule], on="reaped", run=run, key="a", data={})
    outbox.enqueue([rule], on="reaped", run=run, key="b", data={})
    failed, sent = AlertDelivery.objects.order_by("dedupe_key")
    AlertDelivery.objects.filter(pk=failed.pk).update(
        status="failed", attempts=7, last_status_code=503, last_error="HTTP 503: try later",
        next_attempt_at=timezone.now() + timedelta(hours=1),
    )
    AlertDelivery.objects.filter(pk=sent.pk).update(status="sent", attempts=1, last_status_code=204, sent_at=timezone.now())
    return rule, failed, sent


def test_the_page_needs_login_and_view_permission(stranger):
    url = reverse("dashboard:alerts")
    assert Client().get(url).status_code == 302
    client = Client()
    client.force_login(stranger)
    assert client.get(url).status_code == 403


def test_the_page_lists_the_rules_and_the_log_newest_first(watcher_client, logged):
    rule, failed, sent = logged
    page = watcher_client.get(reverse("dashboard:alerts")).content.decode()
    assert "reaped-hook" in page and "http://hooks.internal:8125/rw" in page and "nightly import" in page
    assert str(failed.idempotency_key) in page and str(sent.idempotency_key) in page
    assert "HTTP 503: try later" in page and ">7<" in page
    assert page.index(str(sent.idempotency_key)) < page.index(str(failed.idempotency_key))  # newest first
    assert "Retry now" not in page  # a watcher may look, not act
    assert f'<a href="{reverse("dashboard:alerts")}">Alerts</a>' in page  # the nav link


def test_retry_now_makes_a_failed_delivery_due_again(op_client, watcher_client, logged):
    _, failed, sent = logged
    page = op_client.get(reverse("dashboard:alerts")).content.decode()
    assert page.count("Retry now") == 1  # the failed one, not the sent one
    assert watcher_client.post(reverse("dashboard:alert_retry", args=[failed.pk])).status_code == 403
    response = op_client.post(reverse("dashboard:alert_retry", args=[failed.pk]), follow=True)
    assert "The delivery is due now" in response.content.decode()
    failed.refresh_from_db()
    assert failed.status == "pending" and failed.next_attempt_at <= timezone.now()
    response = op_client.post(reverse("dashboard:alert_retry", args=[sent.pk]), follow=True)
    assert "nothing to retry" in response.content.decode()
    assert op_client.get(reverse("dashboard:alert_retry", args=[sent.pk])).status_code == 405
