"""A real agent process that keeps heartbeating but ignores a cancel is escalated by
the watchdog (not honoured → hard stop → retired), and its late settle loses."""

import subprocess
import sys
from pathlib import Path

import pytest

from runs import transitions, watchdog
from runs.api.auth import create_key
from runs.models import Run, RunEvent
from tests.runs.test_watchdog import age_cancel, age_escalation

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.django_db(transaction=True)
def test_a_beating_agent_that_ignores_a_cancel_is_escalated_then_retired(live_server_url):
    _, key = create_key("stubborn")
    agent = subprocess.Popen([sys.executable, "tests/runs/api/stubborn_agent.py", live_server_url, key],
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        run_id = agent.stdout.readline().strip()  # the agent holds its run and beats
        assert run_id, agent.stderr.read()
        assert transitions.request_cancel(run_id, by="alice") == transitions.CancelOutcome.REQUESTED
        run = Run.objects.get(pk=run_id)
        age_cancel(run, 31)  # the grace has passed: not honoured
        report = watchdog.sweep(stuck_s=600, grace_s=30, escalate_s=30, reap_s=600)
        assert report.escalated == [run.id] and report.retired == []  # its beats keep it from the silent path
        age_escalation(run, 31)
        assert watchdog.sweep(stuck_s=600, grace_s=30, escalate_s=30, reap_s=600).retired == [run.id]
        late = agent.stdout.readline().strip()  # its next beat says "not held": it settles anyway
        assert agent.wait(timeout=30) == 0
    finally:
        agent.kill()
    assert late.startswith("409 ") and '"run_ended"' in late
    row = Run.objects.get(pk=run_id)
    assert (row.status, row.termination_reason) == ("cancelled", "cancelled")
    kinds = list(RunEvent.objects.filter(run_id=run_id).order_by("seq").values_list("kind", flat=True))
    assert kinds[-4:] == ["cancel_requested", "cancel_not_honoured", "retired", "late_settle_ignored"]
