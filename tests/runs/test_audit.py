"""Every operator action is in the audit trail, with who, where and the note."""

import io
from datetime import timedelta

import pytest
from django.utils import timezone

from runs import audit, transitions, watchdog

pytestmark = pytest.mark.django_db


def test_audit_rows_for_each_action_and_source(make_run, running_run, run_in):
    a = running_run()
    transitions.request_cancel(a.id, by="alice", source="user", note="from the page")
    b = running_run()
    transitions.retire(b.id, by="cli", source="cli", note="worker died")
    c = run_in("failed")
    transitions.retry(c.id, by="bob", source="api")
    d = make_run(deadline=timezone.now() - timedelta(seconds=1))
    watchdog.sweep()
    rows = [audit.as_row(e) for e in audit.entries()]
    seen = {(r["actor"], r["where"], r["action"], r["note"]) for r in rows}
    assert ("alice", "browser", "cancel requested", "from the page") in seen
    assert ("cli", "CLI", "retired", "worker died") in seen
    assert ("bob", "API", "retried", "") in seen
    assert ("watchdog", "watchdog", "cancel requested", "deadline exceeded") in seen
    assert {e.run_id for e in audit.entries(actor="watchdog")} == {d.id}
    assert {e.run_id for e in audit.entries(source="cli")} == {b.id}


def test_csv_export_is_inert_against_formula_injection(running_run):
    run = running_run(title="=HYPERLINK(\"http://evil\")")
    transitions.request_cancel(run.id, by="alice", note="+1 cmd")
    out = io.StringIO()
    audit.write_csv(audit.entries(), out)
    lines = out.getvalue().splitlines()
    assert lines[0] == "at,actor,where,action,run_id,run_title,note"
    assert "'=HYPERLINK" in lines[1] and "'+1 cmd" in lines[1]
