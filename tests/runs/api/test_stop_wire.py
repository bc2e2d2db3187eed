"""A guardrail's stop on every path an API agent hears a cancel: the control socket
(`{"type": "stop"}`, also when it was pending before the socket opened), the long-poll,
the heartbeat's, an events batch's and a step's 409 answer — each naming the reason —
and the settle that ends the run as the stop says."""

import pytest
from channels.db import database_sync_to_async

from runs import transitions
from runs.models import Run, RunEvent
from tests.runs.api.conftest import error_code
from tests.runs.api.test_control import communicator, held

BUDGET, POLICY = Run.TerminationReason.BUDGET_EXHAUSTED, Run.TerminationReason.POLICY_DENIED


def stop(run_id, reason=BUDGET, limit="tokens", note="token budget 10 reached (12 spent)"):
    outcome = transitions.request_stop(run_id, reason=reason, limit=limit, note=note)
    assert outcome == transitions.StopOutcome.REQUESTED
    return outcome


astop = database_sync_to_async(stop)


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_the_socket_says_stop_with_the_reason_the_moment_it_is_asked():
    _, token, run_id = await held("stop-sock")
    socket = communicator(run_id, token)
    assert (await socket.connect())[0]
    assert (await socket.receive_json_from())["type"] == "ready"
    await astop(run_id)
    assert await socket.receive_json_from(timeout=5) == {
        "type": "stop", "reason": "budget_exhausted", "source": "guardrail", "note": "token budget 10 reached (12 spent)",
    }
    await socket.disconnect()


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_the_socket_says_a_stop_that_was_pending_before_it_opened():
    _, token, run_id = await held("stop-sock-late")
    await astop(run_id, POLICY, "loop", "the same tool thrice")
    socket = communicator(run_id, token)
    assert (await socket.connect())[0]
    assert (await socket.receive_json_from())["type"] == "ready"
    frame = await socket.receive_json_from(timeout=5)
    assert (frame["type"], frame["reason"], frame["note"]) == ("stop", "policy_denied", "the same tool thrice")
    await socket.disconnect()


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_an_ignored_stop_is_escalated_on_the_socket_as_a_hard_cancel():
    _, token, run_id = await held("stop-sock-hard")
    socket = communicator(run_id, token)
    await socket.connect()
    assert (await socket.receive_json_from())["type"] == "ready"
    await astop(run_id)
    assert (await socket.receive_json_from(timeout=5))["type"] == "stop"
    assert await database_sync_to_async(transitions.escalate_cancel)(run_id)
    frame = await socket.receive_json_from(timeout=5)
    assert (frame["type"], frame["hard"]) == ("cancel", True)
    await socket.disconnect()


@pytest.mark.asyncio
@pytest.mark.django_db(transaction=True)
async def test_the_long_poll_names_the_stop_reason_and_an_abort_has_none():
    client, _, run_id = await held("stop-poll")
    await astop(run_id)
    body = (await client.get(f"/api/v1/runs/{run_id}/control?wait=30")).json()
    assert (body["cancel"]["stop_reason"], body["cancel"]["source"], body["held"]) == ("budget_exhausted", "guardrail", True)

    client, _, aborted = await held("abort-poll")
    await database_sync_to_async(transitions.request_cancel)(aborted, by="alice", source="dashboard")
    body = (await client.get(f"/api/v1/runs/{aborted}/control?wait=30")).json()
    assert body["cancel"]["stop_reason"] is None


@pytest.mark.django_db
def test_heartbeat_events_and_a_step_answer_name_the_stop(agent, held_run):
    _, client = agent
    run_id = held_run()
    beat = client.post(f"/runs/{run_id}/heartbeat").json()
    assert (beat["cancel_requested"], beat["stop_reason"]) == (False, None)
    stop(run_id)
    beat = client.post(f"/runs/{run_id}/heartbeat").json()
    assert (beat["cancel_requested"], beat["stop_reason"], beat["held"]) == (True, "budget_exhausted", True)
    batch = client.post(f"/runs/{run_id}/events", {"events": [{"type": "delta", "step": 0, "offset": 0, "text": "x"}]})
    assert (batch.json()["cancel_requested"], batch.json()["stop_reason"]) == (True, "budget_exhausted")
    refused = client.post(f"/runs/{run_id}/steps", {"index": 0, "kind": "message", "text": "x"})
    assert refused.status_code == 409 and error_code(refused) == "cancel_requested"
    assert refused.json()["stop_reason"] == "budget_exhausted"
    assert "completed/budget_exhausted" in refused.json()["error"]["message"]


@pytest.mark.django_db
def test_an_aborts_step_answer_has_no_stop_reason(agent, held_run):
    _, client = agent
    run_id = held_run()
    transitions.request_cancel(run_id, by="alice")
    refused = client.post(f"/runs/{run_id}/steps", {"index": 0, "kind": "message", "text": "x"})
    assert error_code(refused) == "cancel_requested" and refused.json().get("stop_reason") is None
    assert client.post(f"/runs/{run_id}/heartbeat").json()["stop_reason"] is None


@pytest.mark.django_db
@pytest.mark.parametrize("settled_as", [("completed", "budget_exhausted", True), ("cancelled", "cancelled", False)])
def test_settling_under_a_budget_stop_ends_completed_budget_exhausted_truncated(agent, held_run, settled_as):
    # An agent that knows the stop settles as it says; one that knows only cancels settles
    # cancelled, and the server records the stop's ending all the same.
    _, client = agent
    run_id = held_run()
    stop(run_id)
    status, reason, truncated = settled_as
    answer = client.post(f"/runs/{run_id}/settle", {"status": status, "reason": reason, "truncated": truncated})
    assert answer.status_code == 200
    assert answer.json() == {"settled": True, "status": "completed", "reason": "budget_exhausted"}
    row = Run.objects.get(pk=run_id)
    assert (row.status, row.termination_reason, row.truncated) == ("completed", "budget_exhausted", True)
    kinds = list(RunEvent.objects.filter(run_id=run_id).values_list("kind", flat=True))
    assert "stop_requested" in kinds and "cancel_requested" not in kinds  # a stop, not an abort


@pytest.mark.django_db
def test_settling_under_a_policy_stop_ends_failed_policy_denied(agent, held_run):
    _, client = agent
    run_id = held_run()
    stop(run_id, POLICY, "loop", "the same tool thrice")
    answer = client.post(f"/runs/{run_id}/settle", {"status": "failed", "reason": "policy_denied"})
    assert answer.json() == {"settled": True, "status": "failed", "reason": "policy_denied"}
    row = Run.objects.get(pk=run_id)
    assert (row.status, row.termination_reason, row.truncated) == ("failed", "policy_denied", False)
