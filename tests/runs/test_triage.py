"""Triage sections find exactly the runs that need an operator."""

from datetime import timedelta

import pytest
from django.utils import timezone

from runs import transitions, triage
from runs.models import Run

pytestmark = pytest.mark.django_db


def ids(key):
    return [r.id for r in triage.section(key).runs]


def test_each_section_finds_its_runs(settings, make_run, running_run, run_in):
    settings.RUNWARDEN_STUCK_S = 5
    settings.RUNWARDEN_CANCEL_GRACE_S = 30
    stuck = running_run()
    Run.objects.filter(pk=stuck.id).update(heartbeat_at=timezone.now() - timedelta(seconds=60))
    ignored = running_run()
    transitions.request_cancel(ignored.id)
    Run.objects.filter(pk=ignored.id).update(cancel_requested_at=timezone.now() - timedelta(seconds=60))
    older_approval, newer_approval = run_in("waiting_for_approval"), run_in("waiting_for_approval")
    lost = run_in("failed")
    retried = run_in("failed")
    transitions.retry(retried.id)
    make_run(), run_in("completed")

    assert ids("stuck") == [stuck.id]
    assert ids("not_honoured") == [ignored.id]
    assert ids("approval") == [older_approval.id, newer_approval.id]
    assert ids("retryable") == [lost.id]
    assert set(ids("longest")) == {stuck.id, ignored.id}
    assert triage.section("stuck").action == "retire"
    with pytest.raises(KeyError):
        triage.section("nope")


def test_flagged_live_runs_are_a_section_with_their_evidence_in_words(running_run, run_in):
    from runs import loops

    first, second, quiet = running_run(), running_run(), running_run()
    ended = run_in("completed")
    loops.flag(first.id, loops.REPEATED_TOOL, {"tool": "search", "args": {"q": "x"}, "times": 3, "steps": [0, 1, 2]})
    loops.flag(second.id, loops.NO_PROGRESS, {"idle_s": 700, "limit_s": 600})
    loops.flag(first.id, loops.FAILING_TOOLS, {"times": 3, "steps": [2], "tools": ["a"] * 3, "last_error": "x"})
    from runs import events

    events.append(ended.id, "flagged", flag="repeated_tool", evidence={})  # ended since: not triage's business

    section = triage.section("flagged")
    assert ids("flagged") == [first.id, second.id] and quiet.id not in ids("flagged")
    assert section.action == "cancel"
    rows = section.detail(list(section.runs))
    assert [[f["words"] for f in run.flags] for run in rows] == [
        ["called search(q='x') 3 times in a row (steps 1–3)", "3 tool calls failed in a row (step 3); last: x"],
        ["no new step for 12 min while heartbeating (limit 10 min)"],
    ]
    assert [f["label"] for f in rows[0].flags] == ["repeated tool", "failing tools"]
