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
