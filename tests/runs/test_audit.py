"""Every operator action is in the audit trail, with who, where and the note."""

from datetime import timedelta

import pytest
from django.utils import timezone

from runs import audit, transitions, watchdog

pytestmark = pytest.mark.django_db


def test_audit_rows_for_each_action_and_source(make_run, running_run, run_in):
    a = running_run()
    transitions.request_cancel(a.id, by="alice", source="dashboard", note="from the page", client="203.0.113.7")
    b = running_run()
    transitions.retire(b.id, by="cli", source="cli", note="worker died")
    c = run_in("failed")
    transitions.retry(c.id, by="bob", source="api")
    d = make_run(deadline=timezone.now() - timedelta(seconds=1))
    watchdog.sweep()
    rows = [audit.as_row(e) for e in audit.entries()]
    seen = {(r["actor"], r["where"], r["client"], r["action"], r["note"]) for r in rows}
    assert ("alice", "dashboard", "203.0.113.7", "abort", "from the page") in seen
    assert ("cli", "cli", "", "retire", "worker died") in seen
    assert ("bob", "api", "", "retry", "") in seen
    assert ("watchdog", "watchdog", "", "stop", "deadline passed") in seen
    assert {e.run_id for e in audit.entries(actor="watchdog")} == {d.id}
    assert {e.run_id for e in audit.entries(source="cli")} == {b.id}


@pytest.mark.parametrize("verb", ["request_cancel", "retire", "retry", "resume", "queue_input"])
def test_every_operator_verb_keeps_the_client_address(run_in, released_in, verb):
    run = run_in("failed") if verb == "retry" else released_in() if verb == "resume" else run_in("running")
    extra = {"resume": {"expect": "waiting_for_approval", "answer": {"approved": True}},
             "queue_input": {"kind": "message", "payload": {"text": "hi"}}}.get(verb, {})
    assert getattr(transitions, verb)(run.id, by="alice", client="2001:db8::7", **extra)
    (row,) = [audit.as_row(e) for e in audit.entries(run_id=run.id)]
    assert (row["actor"], row["where"], row["client"]) == ("alice", "dashboard", "2001:db8::7")


def test_the_where_words_are_the_glossarys():
    assert set(audit.WHERE.values()) <= {"dashboard", "cli", "api", "admin", "watchdog", "worker", "guardrail"}


@pytest.mark.parametrize("answer, word", [({"approved": True}, "approve"), ({"approved": False}, "deny")])
def test_an_answer_says_which_in_the_audit(released_in, answer, word):
    run = released_in()
    assert transitions.resume(run.id, expect="waiting_for_approval", by="alice", answer=answer)
    assert [audit.as_row(e)["action"] for e in audit.entries(run_id=run.id)] == [word]


def test_the_audit_names_actions_in_the_glossarys_words():
    assert {audit.ACTIONS[k] for k in audit.ACTION_KINDS} >= {"abort", "retire", "retry"}
    assert "cancel" not in " ".join(audit.ACTIONS.values())
