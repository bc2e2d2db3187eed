"""Every operator action is in the audit trail, with who, where and the note."""

from datetime import timedelta

import pytest
from django.utils import timezone

from runs import audit, transitions, watchdog

pytestmark = pytest.mark.django_db


def test_audit_rows_for_each_action_and_source(make_run, running_run, run_in):
    a = running_run()
    transitions.request_cancel(a.id, by="alice", source="user", note="from the page")
    b = running_run()
    transitions.force_cancel(b.id, by="cli", source="cli", note="worker died")
    c = run_in("failed")
    transitions.retry(c.id, by="bob", source="api")
    d = make_run(deadline=timezone.now() - timedelta(seconds=1))
    watchdog.sweep()
    rows = [audit.as_row(e) for e in audit.entries()]
    seen = {(r["actor"], r["where"], r["action"], r["note"]) for r in rows}
    assert ("alice", "browser", "cancel requested", "from the page") in seen
    assert ("cli", "CLI", "retired", "worker died") in seen
    assert ("bob", "API", "retried", "") in seen
    assert ("watchdog", "watchdog", "cancel requested", "deadline passed") in seen
    assert {e.run_id for e in audit.entries(actor="watchdog")} == {d.id}
    assert {e.run_id for e in audit.entries(source="cli")} == {b.id}

