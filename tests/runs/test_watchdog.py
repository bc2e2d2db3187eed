"""The watchdog's table, one finding at a time."""

import asyncio
from datetime import timedelta

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.utils import timezone

from runs import groups, transitions, watchdog
from runs.models import Run, RunEvent

pytestmark = pytest.mark.django_db


def age_heartbeat(run, seconds):
    Run.objects.filter(pk=run.id).update(heartbeat_at=timezone.now() - timedelta(seconds=seconds))


def age_cancel(run, seconds):
    Run.objects.filter(pk=run.id).update(cancel_requested_at=timezone.now() - timedelta(seconds=seconds))


def test_stale_heartbeat_is_flagged_stuck_then_reaped(running_run):
    run = running_run()
    age_heartbeat(run, 10)
    report = watchdog.sweep(stuck_s=5, reap_s=60)
    assert (report.stuck, report.reaped) == (1, [])
    age_heartbeat(run, 61)
    report = watchdog.sweep(stuck_s=5, reap_s=60)
    assert report.reaped == [run.id]
    row = Run.objects.get(pk=run.id)
    assert (row.status, row.termination_reason, row.is_retryable) == ("failed", "worker_lost", True)


def test_a_released_wait_is_never_stuck_nor_reaped_and_ends_at_its_deadline(released_in, running_run):
    released = released_in()
    held = running_run()  # an API agent's wait: its holder keeps beating, or it goes stuck
    assert transitions.suspend(held.id, worker="w1", status="waiting_for_input", request={"prompt": "?"})
    age_heartbeat(held, 120)
    report = watchdog.sweep(stuck_s=5, reap_s=60)
    assert (report.stuck, report.reaped, report.expired) == (1, [], [])  # the held one only
    Run.objects.filter(pk=released.id).update(wait_deadline=timezone.now() - timedelta(seconds=1))
    report = watchdog.sweep(stuck_s=5, reap_s=60)
    assert report.expired == [released.id] and report.acted
    row = Run.objects.get(pk=released.id)
    assert (row.status, row.termination_reason, row.is_retryable) == ("failed", "approval_denied", False)
    assert Run.objects.get(pk=held.id).status == "waiting_for_input"  # not the watchdog's to end


def test_reaper_loses_to_a_heartbeat(running_run):
    run = running_run()
    age_heartbeat(run, 120)
    assert transitions.heartbeat(run.id, worker="w1").held  # lands before the sweep
    assert watchdog.sweep(stuck_s=5, reap_s=60).reaped == []
    assert Run.objects.get(pk=run.id).status == "running"


def test_deadline_ends_a_queued_run_its_wall_clock_budget_spent(make_run):
    run = make_run(deadline=timezone.now() - timedelta(seconds=1))
    assert watchdog.sweep().deadline_stopped == [run.id]
    row = Run.objects.get(pk=run.id)
    assert (row.status, row.termination_reason, row.truncated) == ("completed", "budget_exhausted", True)
    assert (row.cancel_source, row.cancel_note) == ("watchdog", "deadline passed")


def test_deadline_asks_a_running_run_to_stop_and_it_ends_budget_exhausted_not_failed(running_run):
    run = running_run(deadline=timezone.now() - timedelta(seconds=1))
    assert watchdog.sweep().deadline_stopped == [run.id]
    assert watchdog.sweep().deadline_stopped == []  # asked once
    # The worker notices and stops; even an error on the way out reads as the stop it was.
    transitions.settle(run.id, status="failed", reason="provider_failed", worker="w1")
    row = Run.objects.get(pk=run.id)
    assert (row.status, row.termination_reason, row.cancel_source) == ("completed", "budget_exhausted", "watchdog")
    assert RunEvent.objects.get(run=run, kind="stop_requested").data["limit"] == "wall_clock"


def test_future_deadline_is_left_alone(running_run):
    running_run(deadline=timezone.now() + timedelta(hours=1))
    assert watchdog.sweep().deadline_stopped == []


def test_unhonoured_cancel_is_flagged_and_retired_once_the_worker_is_silent(running_run):
    run = running_run()
    transitions.request_cancel(run.id, by="alice")
    age_cancel(run, 31)
    report = watchdog.sweep(stuck_s=5, grace_s=30)
    assert (report.not_honoured, report.retired) == (1, [])  # heartbeat still fresh: flagged only
    age_heartbeat(run, 6)
    report = watchdog.sweep(stuck_s=5, grace_s=30, reap_s=600)
    assert report.retired == [run.id]
    row = Run.objects.get(pk=run.id)
    assert (row.status, row.cancel_requested_by) == ("cancelled", "alice")
    retired = RunEvent.objects.get(run=run, kind="retired")
    assert (retired.actor, retired.source) == ("watchdog", "watchdog")


def age_escalation(run, seconds):
    Run.objects.filter(pk=run.id).update(cancel_escalated_at=timezone.now() - timedelta(seconds=seconds))


def test_a_cancel_ignored_by_a_beating_worker_is_escalated_then_retired(running_run):
    run = running_run()
    transitions.request_cancel(run.id, by="alice")
    age_cancel(run, 31)
    report = watchdog.sweep(stuck_s=5, grace_s=30, escalate_s=30)
    assert (report.escalated, report.retired) == ([run.id], [])  # told to stop hard, still live
    assert watchdog.sweep(stuck_s=5, grace_s=30, escalate_s=30).escalated == []  # once
    assert Run.objects.get(pk=run.id).status == "running"
    assert transitions.heartbeat(run.id, worker="w1").held  # it keeps beating, ignoring it
    age_escalation(run, 31)
    report = watchdog.sweep(stuck_s=5, grace_s=30, escalate_s=30)
    assert report.retired == [run.id]
    row = Run.objects.get(pk=run.id)
    assert (row.status, row.termination_reason, row.cancel_requested_by) == ("cancelled", "cancelled", "alice")
    # The worker's settle comes too late: it loses and is traced.
    assert not transitions.settle(run.id, status="completed", reason="completed", worker="w1")
    kinds = list(RunEvent.objects.filter(run=run).order_by("seq").values_list("kind", flat=True))
    assert kinds[-4:] == ["cancel_requested", "cancel_not_honoured", "retired", "late_settle_ignored"]
    retired = RunEvent.objects.get(run=run, kind="retired")
    assert retired.data["note"] == "cancel not honoured; hard stop ignored"


def test_a_run_that_ends_after_the_hard_stop_is_not_retired(running_run):
    run = running_run()
    transitions.request_cancel(run.id)
    age_cancel(run, 31)
    assert watchdog.sweep(stuck_s=5, grace_s=30, escalate_s=30).escalated == [run.id]
    assert transitions.settle(run.id, status="cancelled", reason="cancelled", worker="w1")
    age_escalation(run, 31)
    assert watchdog.sweep(stuck_s=5, grace_s=30, escalate_s=30).retired == []
    assert not RunEvent.objects.filter(run=run, kind="retired").exists()


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_the_escalation_tells_the_worker_to_stop_hard(running_run):
    run = await database_sync_to_async(running_run)()
    await database_sync_to_async(transitions.request_cancel)(run.id)
    await database_sync_to_async(age_cancel)(run, 31)
    layer = get_channel_layer()
    channel = await layer.new_channel()
    await layer.group_add(groups.control(run.id), channel)
    report = await database_sync_to_async(watchdog.sweep)(stuck_s=5, grace_s=30, escalate_s=30)
    assert report.escalated == [run.id]
    message = await asyncio.wait_for(layer.receive(channel), 5)
    assert (message["type"], message["hard"]) == ("run.cancel", True)


def test_cancel_within_grace_is_not_flagged(running_run):
    run = running_run()
    transitions.request_cancel(run.id)
    age_heartbeat(run, 100)
    report = watchdog.sweep(stuck_s=5, grace_s=30, reap_s=600)
    assert (report.not_honoured, report.retired) == (0, [])


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_serve_sweeps_until_stopped():
    run = await transitions.acreate_run(agent="scripted", deadline=timezone.now() - timedelta(seconds=1))
    layer = get_channel_layer()
    channel = await layer.new_channel()
    await layer.group_add(groups.viewers(run.id), channel)
    stop = asyncio.Event()
    task = asyncio.create_task(watchdog.serve(stop, interval_s=0.05))
    changed = await asyncio.wait_for(layer.receive(channel), 5)  # the sweep's stop, announced
    stop.set()
    await asyncio.wait_for(task, 2)
    assert changed["event"] == "stop_requested"
    # database_sync_to_async, not aget: it closes its connection, so the test database can be dropped.
    assert (await database_sync_to_async(Run.objects.get)(pk=run.id)).status == "completed"
