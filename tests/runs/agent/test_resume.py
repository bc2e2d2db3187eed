"""What a released run carries for the worker that resumes it (runs.agent.resume)."""

import pytest

from runs import transitions
from runs.agent import resume
from runs.agent.providers.base import Reply, ToolCall
from runs.models import Run


def test_a_resume_state_whose_step_was_committed_since_is_never_replayed():
    step = {"index": 1, "text": "", "tool_calls": [], "approved": []}
    pending = {"resume": {"step": step, "taken": [{"before": 0, "content": "hi"}]}}
    assert resume.state_of(Run(steps=1, pending_request=pending))["step"] == step
    stale = resume.state_of(Run(steps=2, pending_request=pending))
    assert stale["step"] is None and stale["taken"] == [{"before": 0, "content": "hi"}]
    assert resume.state_of(Run(steps=0)) == {"step": None, "taken": []}


def test_an_in_flight_reply_survives_the_round_trip_through_the_row():
    from decimal import Decimal

    reply = Reply(text="may I?", tool_calls=[ToolCall("c1", "echo", {"x": [1, 2]})], parallel=True,
                  needs_approval=True, final=False, tokens_in=7, tokens_out=5, cost=Decimal("0.000024"))
    step = resume.dump_step(3, reply, {"c0"})
    assert step["index"] == 3 and step["approved"] == ["c0"]
    assert resume.load_reply(step) == reply


@pytest.mark.django_db
def test_history_puts_each_operator_message_before_the_step_that_took_it(make_run):
    run = make_run(title="the task", input={"system": "be careful"})
    assert transitions.claim(run.id, worker="w1")
    assert transitions.commit_step(run.id, worker="w1", index=0, kind="message", text="first")
    calls = [{"id": "c1", "name": "echo", "args": {"a": 1}, "error": "boom"}]
    assert transitions.commit_step(run.id, worker="w1", index=1, kind="tool_calls", text="", tool_calls=calls)
    taken = [{"before": 1, "content": "now the tool"}, {"before": 2, "content": "and then?"}]
    messages = resume.history(Run.objects.get(pk=run.id), taken)
    assert [(m["role"], m.get("content")) for m in messages] == [
        ("system", "be careful"), ("user", "the task"), ("assistant", "first"), ("user", "now the tool"),
        ("assistant", None), ("tool", '{"error": "boom"}'), ("user", "and then?"),
    ]
    assert messages[4]["tool_calls"][0]["function"] == {"name": "echo", "arguments": '{"a": 1}'}
