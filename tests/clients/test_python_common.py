"""The client's pure parts: batching, code-point offsets, safe failure messages."""

import httpx

from runwarden_client import _common as c


def test_contiguous_deltas_merge_and_offsets_count_code_points():
    state = c.StepState()
    state.delta("Hé")
    state.delta("😀!")
    assert state.take_events() == [{"type": "delta", "step": 0, "offset": 0, "text": "Hé😀!"}]
    state.delta("x")
    assert state.take_events() == [{"type": "delta", "step": 0, "offset": 4, "text": "x"}]


def test_a_batch_is_due_by_size_or_age():
    state = c.StepState()
    state.delta("abc")
    assert not state.due(flush_s=60, max_chars=10)
    assert state.due(flush_s=60, max_chars=3)
    assert state.due(flush_s=0, max_chars=10)


def test_an_exceptions_text_never_reaches_the_run():
    assert c.failure_of(ValueError("key sk-123")) == ("provider_failed", "ValueError", "the agent raised ValueError")
    assert c.failure_of(c.Failed("no", reason="policy_denied")) == ("policy_denied", "Failed", "no")


def test_a_non_json_answer_is_an_error_body_not_a_crash():
    response = httpx.Response(405, text="<html>Method Not Allowed</html>")
    assert c.json_of(response)["error"]["code"] == "not_json"


def test_a_stop_is_a_cancel_that_names_its_ending():
    signal = c.Signal()
    assert signal.set("guardrail", "token budget 10 reached", stop="budget_exhausted")
    stopped = signal.reason
    assert isinstance(stopped, c.Stopped) and isinstance(stopped, c.Cancelled)
    assert (stopped.reason, stopped.source, stopped.note) == ("budget_exhausted", "guardrail", "token budget 10 reached")
    assert c.ending_of(stopped) == ("completed", "budget_exhausted", {"truncated": True})
    assert c.ending_of(c.Stopped("policy_denied")) == ("failed", "policy_denied", {})
    assert c.ending_of(c.Stopped("a_newer_reason")) == ("cancelled", "cancelled", {})  # the server records the stop's
    assert c.ending_of(c.Cancelled("dashboard")) == ("cancelled", "cancelled", {})


def test_the_hard_stop_of_an_escalated_stop_is_still_that_stop():
    signal = c.Signal()
    signal.set("guardrail", stop="budget_exhausted")
    assert not signal.set("server", "a cancel is pending")  # heard again on another path: nothing new
    assert signal.set("watchdog", "cancel not honoured: stop now", hard=True)
    assert isinstance(signal.reason, c.Stopped) and signal.reason.hard and signal.reason.reason == "budget_exhausted"


def test_a_bare_cancel_learns_it_was_a_stop_until_the_agent_met_it():
    signal = c.Signal()
    signal.set("server", "a cancel is pending")
    assert signal.set("guardrail", stop="budget_exhausted") and isinstance(signal.reason, c.Stopped)

    met = c.Signal()
    met.set("server", "a cancel is pending")
    met.delivered = True  # raised to the agent already: what it saw stands
    assert not met.set("guardrail", stop="budget_exhausted") and not isinstance(met.reason, c.Stopped)

    lost = c.Signal()
    lost.set("server", "the run is no longer ours", lost=True)
    assert not lost.set("guardrail", stop="budget_exhausted") and lost.reason.lost
