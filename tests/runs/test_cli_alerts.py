"""`manage.py alerts …`: rules from the command line, one-line errors, a test delivery."""

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from runs.alert_records import AlertDelivery, AlertRule
from tests.runs.alerts.conftest import free_port, receiver  # noqa: F401 - the fixture

pytestmark = pytest.mark.django_db


def alerts(*args):
    out = StringIO()
    call_command("alerts", *args, stdout=out)
    return out.getvalue()


def refused(*args):
    with pytest.raises(CommandError) as found:
        alerts(*args)
    return found.value.returncode, str(found.value)


def test_add_writes_a_rule_and_prints_a_generated_secret_once():
    out = alerts("add", "--on", "stuck", "--url", "https://hooks.example.com/rw", "--agent", "openai", "stuck-openai")
    rule = AlertRule.objects.get()
    assert (rule.name, rule.on, rule.agent, rule.format, rule.enabled) == ("stuck-openai", "stuck", "openai", "json", True)
    assert len(rule.secret) >= 32 and out.count(rule.secret) == 1
    out = alerts("add", "--on", "waiting_too_long", "--threshold-s", "600", "--url", "http://127.0.0.1:1/h",
                 "--secret", "mine", "--format", "slack", "slow-approvals")
    assert "mine" not in out and AlertRule.objects.get(name="slow-approvals").threshold_s == 600
    alerts("add", "--on", "failure_rate", "--rate-pct", "20", "--window-s", "3600", "--min-runs", "10",
           "--url", "http://127.0.0.1:1/h", "--secret", "s", "rate")
    rate = AlertRule.objects.get(name="rate")
    assert (rate.failure_rate_pct, rate.window_s, rate.min_runs) == (20, 3600, 10)


@pytest.mark.parametrize("args, message", [
    (["--on", "stuck", "--url", "ftp://example.com/x", "n"], "url: the URL must be http:// or https:// and name a host"),
    (["--on", "stuck", "--url", "not a url", "n"], "url: the URL must be http:// or https:// and name a host"),
    (["--on", "waiting_too_long", "--url", "http://h/x", "n"], "threshold-s: waiting_too_long needs a threshold"),
    (["--on", "failure_rate", "--rate-pct", "20", "--url", "http://h/x", "n"], "window-s: failure_rate needs a window"),
    (["--on", "failure_rate", "--rate-pct", "120", "--window-s", "60", "--url", "http://h/x", "n"], "failure-rate-pct:"),
    (["--on", "stuck", "--threshold-s", "5", "--url", "http://h/x", "n"], "--threshold-s is only for"),
    (["--on", "stuck", "--url", "http://h/x", "not a slug"], "name:"),
    (["--on", "stuck", "--url", "http://h/x", "--secret", "", "n"], "secret: may not be empty"),
])
def test_add_refuses_bad_input_in_one_line_and_writes_nothing(args, message):
    code, text = refused("add", *args)
    assert code == 2 and text.startswith(message) and "\n" not in text
    assert not AlertRule.objects.exists()


def test_add_refuses_a_name_taken():
    alerts("add", "--on", "stuck", "--url", "http://h/x", "--secret", "s", "taken")
    code, text = refused("add", "--on", "reaped", "--url", "http://h/y", "--secret", "s", "taken")
    assert code == 2 and text.startswith("name:") and AlertRule.objects.get().on == "stuck"


def test_test_sends_a_signed_delivery_now_and_list_shows_it(receiver):  # noqa: F811
    hook = receiver()
    alerts("add", "--on", "reaped", "--url", hook.url, "--secret", "s3cret-for-tests", "reaped-hook")
    assert alerts("test", "reaped-hook") == f"sent: {hook.url} answered 204\n"
    key, body = hook.received()
    assert body["event"] == "test" and body["data"] == {"test": True} and body["run"] is None
    assert str(AlertDelivery.objects.get(status="sent").idempotency_key) == key
    listed = alerts("list")
    assert "reaped-hook" in listed and "sent 20" in listed and hook.url in listed


def test_test_against_a_receiver_that_is_down_exits_1_and_is_not_retried():
    alerts("add", "--on", "reaped", "--url", f"http://127.0.0.1:{free_port()}/h", "--secret", "s", "down")
    code, text = refused("test", "down")
    assert code == 1 and "ConnectError" in text
    assert AlertDelivery.objects.get().status == "failed"
    assert refused("test", "nope")[0] == 2


def test_remove_deletes_the_rule_and_its_log():
    alerts("add", "--on", "reaped", "--url", f"http://127.0.0.1:{free_port()}/h", "--secret", "s", "gone")
    refused("test", "gone")
    assert alerts("remove", "gone") == "removed alert rule gone and its 1 deliveries\n"
    assert not AlertRule.objects.exists() and not AlertDelivery.objects.exists()
    assert "no alert rules" in alerts("list")


def test_watchdog_once_queues_and_sends_the_alerts_it_finds(receiver, running_run):  # noqa: F811
    from datetime import timedelta

    from django.utils import timezone

    from runs.models import Run

    hook = receiver()
    alerts("add", "--on", "stuck", "--url", hook.url, "--secret", "s3cret-for-tests", "stuck-runs")
    run = running_run()
    Run.objects.filter(pk=run.id).update(heartbeat_at=timezone.now() - timedelta(seconds=30))
    out = StringIO()
    call_command("watchdog", "--once", stdout=out)
    assert "alerts queued 1" in out.getvalue() and "alerts: 1 sent" in out.getvalue()
    assert hook.received()[1]["run"]["id"] == str(run.id)
