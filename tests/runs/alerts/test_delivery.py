"""Sending the outbox to real receivers on loopback: signed, once, retried, given up."""

import json
import socket
import threading
import time
from datetime import timedelta

import httpx
import pytest
from channels.db import database_sync_to_async
from django.db import connection
from django.utils import timezone

from runs import watchdog
from runs.alert_records import AlertDelivery, AlertOn
from runs.alerts import delivery, outbox, signing
from runs.alerts.delivery import Result
from runs.models import Run
from tests.runs.alerts.conftest import SECRET, WAIT_S, free_port

pytestmark = pytest.mark.django_db


def stale(run, seconds=600):
    Run.objects.filter(pk=run.id).update(heartbeat_at=timezone.now() - timedelta(seconds=seconds))


def owe(rule, run=None, key="k", data=None):
    outbox.enqueue([rule], on=rule.on, run=run, key=key, data=data or {})
    return AlertDelivery.objects.get(rule=rule, dedupe_key=key)


def make_due(row):
    AlertDelivery.objects.filter(pk=row.pk).update(next_attempt_at=timezone.now() - timedelta(seconds=1))


def test_a_stuck_run_fires_exactly_one_signed_webhook_the_documented_receiver_verifies(rule, running_run, receiver):
    hook = receiver()
    rule(AlertOn.STUCK, url=hook.url, name="stuck-runs")
    run = running_run(title="summarise the logs")
    stale(run, 30)
    sent = []
    for _ in range(3):
        watchdog.sweep(stuck_s=5, reap_s=600)
        sent.append(delivery.deliver_due())
    assert sent == [{Result.SENT: 1}, {}, {}]
    key, body = hook.received()  # the receiver prints only what it verified
    row = AlertDelivery.objects.get()
    assert key == str(row.idempotency_key) == body["id"]
    assert (body["event"], body["rule"], body["agent"]) == ("stuck", "stuck-runs", "scripted")
    assert body["run"] == {"id": str(run.id), "title": "summarise the logs", "status": "running", "reason": "",
                           "url": f"/runs/{run.id}/"}
    assert (row.status, row.attempts, row.last_status_code, row.last_error) == ("sent", 1, 204, "")
    assert row.sent_at is not None
    assert hook.nothing_more()


def test_a_delivery_carries_the_headers_and_the_documented_body(rule, running_run, capture, settings):
    settings.RUNWARDEN_PUBLIC_URL = "https://runwarden.example.com/"
    server = capture()
    run = running_run()
    row = owe(rule(AlertOn.LOOP_FLAGGED, url=server.url, name="loops"), run, data={"flag": "repeated_tool"})
    assert delivery.deliver_due() == {Result.SENT: 1}
    headers, content = server.requests.get(timeout=WAIT_S)
    assert headers["Content-Type"] == "application/json" and headers["User-Agent"] == "Runwarden-Alerts"
    assert headers["Idempotency-Key"] == str(row.idempotency_key)
    assert signing.verify(SECRET, headers["X-Runwarden-Signature"], content) == signing.Verdict.VALID
    body = json.loads(content)
    assert set(body) == {"id", "event", "rule", "agent", "run", "at", "data"}
    assert body["run"]["url"] == f"https://runwarden.example.com/runs/{run.id}/"
    assert body["data"] == {"flag": "repeated_tool"} and body["at"].startswith(str(timezone.now().year))


def test_a_slack_rule_sends_a_text_line_signed_the_same_way(rule, running_run, capture):
    server = capture()
    run = running_run(title="nightly import")
    owe(rule(AlertOn.REAPED, url=server.url, name="to-slack", format="slack"), run)
    assert delivery.deliver_due() == {Result.SENT: 1}
    headers, content = server.requests.get(timeout=WAIT_S)
    body = json.loads(content)
    assert list(body) == ["text"]
    assert "reaped" in body["text"] and "nightly import" in body["text"] and str(run.id) in body["text"]
    assert signing.verify(SECRET, headers["X-Runwarden-Signature"], content) == signing.Verdict.VALID


def test_the_documented_receiver_refuses_a_tampered_body_an_old_replay_and_another_secret(receiver):
    hook = receiver()
    body = b'{"event":"stuck"}'
    now = int(time.time())

    def post(content, header):
        return httpx.post(hook.url, content=content, headers={"X-Runwarden-Signature": header,
                                                              "Idempotency-Key": "k"}).status_code

    assert post(body, signing.sign(SECRET, body, now)) == 204
    assert post(b'{"event":"reaped"}', signing.sign(SECRET, body, now)) == 401  # tampered
    assert post(body, signing.sign(SECRET, body, now - 301)) == 401  # a replay over 5 minutes old
    assert post(body, signing.sign(SECRET, body, now - 200)) == 204  # within the 5 minutes
    assert post(body, signing.sign("another", body, now)) == 401
    assert post(body, "") == 401 and post(body, "t=abc,v1=00") == 401
    assert [hook.received()[0] for _ in range(2)] == ["k", "k"] and hook.nothing_more()


def test_a_receiver_down_for_a_while_gets_the_delivery_later_exactly_once(rule, running_run, receiver):
    port = free_port()  # nothing listens there yet
    run = running_run()
    row = owe(rule(AlertOn.REAPED, url=f"http://127.0.0.1:{port}/hook"), run)
    assert delivery.deliver_due() == {Result.RETRYING: 1}
    row.refresh_from_db()
    assert (row.status, row.attempts, row.last_status_code) == ("pending", 1, None)
    assert "ConnectError" in row.last_error and row.next_attempt_at > timezone.now()
    assert delivery.deliver_due() == {}  # not due before its backoff
    make_due(row)
    assert delivery.deliver_due() == {Result.RETRYING: 1}  # still down
    hook = receiver(port)
    make_due(row)
    assert delivery.deliver_due() == {Result.SENT: 1}
    key, body = hook.received()
    assert key == str(row.idempotency_key) == body["id"]  # the same key on every attempt
    make_due(row)  # a sent delivery is never due again
    assert delivery.deliver_due() == {}
    row.refresh_from_db()
    assert (row.status, row.attempts, row.last_status_code, row.last_error) == ("sent", 3, 204, "")
    assert hook.nothing_more()


def test_a_delivery_still_failing_a_day_after_it_was_written_is_failed_for_good(rule):
    row = owe(rule(AlertOn.REAPED, url=f"http://127.0.0.1:{free_port()}/hook"))
    AlertDelivery.objects.filter(pk=row.pk).update(created_at=timezone.now() - timedelta(hours=25))
    assert delivery.deliver_due() == {Result.GAVE_UP: 1}
    make_due(row)
    assert delivery.deliver_due() == {}
    row.refresh_from_db()
    assert (row.status, row.attempts) == ("failed", 1)


def test_a_refusal_is_retried_with_exponential_backoff(rule, capture, settings):
    settings.RUNWARDEN_ALERT_BACKOFF_S = 100
    server = capture(code=500)
    row = owe(rule(AlertOn.REAPED, url=server.url))
    delays = []
    for _ in range(3):
        before = timezone.now()
        assert delivery.deliver_due() == {Result.RETRYING: 1}
        row.refresh_from_db()
        delays.append((row.next_attempt_at - before).total_seconds())
        make_due(row)
    assert row.last_status_code == 500 and row.last_error.startswith("HTTP 500") and row.attempts == 3
    # base · 2^(n-1) with up to a fifth of jitter below; a second's slack for a loaded machine
    for n, delay in enumerate(delays):
        assert 0.8 * 100 * 2**n - 1 <= delay <= 100 * 2**n + 1


def test_a_receiver_that_never_answers_times_out_and_is_retried(rule, settings):
    settings.RUNWARDEN_ALERT_TIMEOUT_S = 0.3
    with socket.socket() as silent:  # accepts connections (the backlog), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        row = owe(rule(AlertOn.REAPED, url=f"http://127.0.0.1:{silent.getsockname()[1]}/hook"))
        assert delivery.deliver_due() == {Result.RETRYING: 1}
    row.refresh_from_db()
    assert "ReadTimeout" in row.last_error and row.status == "pending"


def test_retry_now_makes_a_pending_or_failed_delivery_due_once_more(rule, capture):
    server = capture()
    row = owe(rule(AlertOn.REAPED, url=server.url))
    AlertDelivery.objects.filter(pk=row.pk).update(status="failed", next_attempt_at=timezone.now() + timedelta(hours=1))
    assert delivery.deliver_due() == {}
    assert delivery.retry_now(row.pk)
    assert delivery.deliver_due() == {Result.SENT: 1}
    assert not delivery.retry_now(row.pk)  # sent: nothing to retry


def test_two_deliverers_at_once_send_each_delivery_once(postgres, rule, receiver):
    hook = receiver()
    alert = rule(AlertOn.REAPED, url=hook.url)
    rows = [owe(alert, key=f"k{i}") for i in range(24)]
    start, results = threading.Barrier(2), []

    def deliverer():
        try:
            start.wait()
            while sent := delivery.deliver_due(limit=3):
                results.append(sent)
        finally:
            connection.close()

    threads = [threading.Thread(target=deliverer) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S)
    assert sum(n for sent in results for n in sent.values()) == 24
    assert all(set(sent) == {Result.SENT} for sent in results)
    keys = [hook.received()[0] for _ in range(24)]
    assert sorted(keys) == sorted(str(r.idempotency_key) for r in rows)
    assert set(AlertDelivery.objects.values_list("status", "attempts")) == {("sent", 1)}
    assert hook.nothing_more()


@pytest.mark.django_db(transaction=True)
def test_the_watchdog_loop_delivers_in_a_task_of_its_own(rule, running_run, receiver):
    import asyncio

    hook = receiver()
    rule(AlertOn.STUCK, url=hook.url)
    stale(running_run(), 30)  # stuck (RUNWARDEN_STUCK_S), not yet lost (RUNWARDEN_REAP_S)

    async def main():
        stop = asyncio.Event()
        serving = asyncio.ensure_future(watchdog.serve(stop, interval_s=0.05))
        try:
            return await asyncio.to_thread(hook.received)
        finally:
            stop.set()
            await serving

    key, body = asyncio.run(main())
    assert body["event"] == "stuck" and key == str(AlertDelivery.objects.get().idempotency_key)


def test_a_halted_deliverer_gives_its_unsent_leases_back_due_at_once(rule, capture):
    server = capture()
    alert = rule(AlertOn.REAPED, url=server.url)
    rows = [owe(alert, key=k) for k in "ab"]
    halt = threading.Event()
    halt.set()
    assert delivery.deliver_due(halt=halt) == {}
    assert delivery.deliver_due() == {Result.SENT: 2}  # nothing waited for a lease to run out
    assert server.requests.qsize() == 2 and {r.pk for r in rows} == set(AlertDelivery.objects.values_list("pk", flat=True))


def test_two_claims_at_once_never_lease_the_same_delivery(postgres, rule):
    alert = rule(AlertOn.REAPED)
    rows = {owe(alert, key=f"k{i}").pk for i in range(40)}
    start, claimed = threading.Barrier(4), []

    def claimer():
        try:
            start.wait()
            claimed.append({d.pk for d in delivery.claim(15)})
        finally:
            connection.close()

    threads = [threading.Thread(target=claimer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_S)
    assert len(claimed) == 4 and sum(len(c) for c in claimed) == len(set().union(*claimed))  # disjoint
    assert set().union(*claimed) <= rows and len(set().union(*claimed)) == 40  # 4 × 15 ≥ 40: all leased
    assert delivery.claim(15) == []  # every lease is still running


@pytest.mark.django_db(transaction=True)
def test_a_receiver_that_hangs_does_not_hold_up_the_watchdogs_sweeps(rule, running_run, settings):
    import asyncio

    settings.RUNWARDEN_ALERT_TIMEOUT_S = 60  # far longer than the test may take
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        silent.settimeout(WAIT_S)
        owe(rule(AlertOn.REAPED, url=f"http://127.0.0.1:{silent.getsockname()[1]}/hook"))
        lost = running_run()

        async def main():
            stop = asyncio.Event()
            serving = asyncio.ensure_future(watchdog.serve(stop, interval_s=0.05))
            try:
                hanging, _ = await asyncio.to_thread(silent.accept)  # the delivery is in flight, unanswered
                try:
                    await database_sync_to_async(stale)(lost, 600)
                    status = database_sync_to_async(lambda: Run.objects.get(pk=lost.id).status)
                    deadline = time.monotonic() + WAIT_S
                    while await status() != "failed":
                        assert time.monotonic() < deadline, "no sweep reaped the run while the receiver hung"
                        await asyncio.sleep(0.05)
                finally:
                    hanging.close()  # the receiver goes away: the send fails now, not in 60 s
            finally:
                stop.set()
                await serving

        asyncio.run(main())
