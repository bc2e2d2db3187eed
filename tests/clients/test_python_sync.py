"""The blocking Python client against a real server: stream, commit, abort mid-stream,
abort mid-tool, an exception's safe failure, and a cut connection."""

import threading

import pytest

from runs.models import Run, Step
from runwarden_client import Cancelled, Client, Failed
from tests.clients.conftest import Background, discarded, outcome

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def client(live_server_url, agent_key):
    with Client(live_server_url, agent_key, flush_s=0.02, heartbeat_s=0.5) as api:
        yield api


def test_a_run_streams_commits_and_settles_completed(client):
    with client.run("client-demo", title="sync") as run:
        for word in ("Hello", " world"):
            run.stream(word)
        run.usage(tokens_in=12, tokens_out=2, cost=0.0001)
        assert run.step() == 0
        run.stream("bye")  # left in flight: the context manager commits it on return
    assert outcome(run.id) == ("completed", "completed")
    steps = list(Step.objects.filter(run_id=run.id).order_by("index").values_list("index", "text"))
    assert steps == [(0, "Hello world"), (1, "bye")]
    row = Run.objects.get(pk=run.id)
    assert (row.tokens_in, row.tokens_out, row.steps) == (12, 2, 2)


def test_a_tool_call_is_committed_with_its_result(client):
    with client.run("client-demo") as run:
        assert run.call_tool("add", lambda a, b: a + b, a=2, b=3) == 5
        run.step("added")
    (step,) = Step.objects.filter(run_id=run.id)
    assert step.kind == "tool_calls"
    assert [(c["name"], c["args"], c["result"]) for c in step.tool_calls] == [("add", {"a": 2, "b": 3}, 5)]


def test_abort_mid_stream_discards_the_step_and_settles_cancelled(client, operator):
    streaming = threading.Event()

    def agent():
        with client.run("client-demo") as run:
            run.stream("first ")
            run.step()
            while True:  # streams until the abort lands at a checkpoint
                run.stream("w ")
                streaming.set()
                run._stopped.wait(0.01)
        return run

    body = Background(agent)
    assert streaming.wait(30)
    run_id = Run.objects.get(agent="client-demo").pk
    operator.abort(run_id)
    run = body.result()
    assert outcome(run.id) == ("cancelled", "cancelled")
    assert Step.objects.filter(run_id=run.id).count() == 1  # the half step was never committed
    (trace,) = discarded(run.id)
    assert trace["index"] == 1 and trace["text"].startswith("w ") and trace["reason"] == "cancelled"


def test_abort_mid_tool_abandons_the_call(client, operator):
    in_tool, release = threading.Event(), threading.Event()

    def slow_tool():
        in_tool.set()
        release.wait(30)  # a tool that would outlive the abort
        return "too late"

    def agent():
        with client.run("client-demo") as run:
            run.call_tool("crawl", slow_tool)
            run.step("never")
        return run

    body = Background(agent)
    assert in_tool.wait(30)
    operator.abort(Run.objects.get(agent="client-demo").pk)
    run = body.result()  # returns while the tool is still blocked: the call was abandoned
    release.set()
    assert outcome(run.id) == ("cancelled", "cancelled")
    assert not Step.objects.filter(run_id=run.id).exists()
    assert discarded(run.id)[0]["tool_calls"] == ["crawl"]


def test_an_exception_fails_the_run_with_a_safe_message(client):
    with pytest.raises(KeyError):
        with client.run("client-demo") as run:
            run.stream("thinking")
            raise KeyError("sk-secret-in-the-text")
    row = Run.objects.get(pk=run.id)
    assert (row.status, row.termination_reason, row.error_class) == ("failed", "provider_failed", "KeyError")
    assert "sk-secret" not in row.error_message
    assert discarded(run.id)[0]["text"] == "thinking"


def test_failed_names_its_reason(client):
    with pytest.raises(Failed):
        with client.run("client-demo") as run:
            raise Failed("the policy forbids this input", reason="policy_denied")
    row = Run.objects.get(pk=run.id)
    assert (row.status, row.termination_reason, row.error_message) == (
        "failed", "policy_denied", "the policy forbids this input")


def test_a_cancel_the_body_caught_still_settles_cancelled(client, operator):
    with client.run("client-demo") as run:
        operator.abort(run.id)
        with pytest.raises(Cancelled):
            while True:
                run.checkpoint()
                run._stopped.wait(0.01)
    # The body went on to return, but it had been told to stop: not a completion.
    assert outcome(run.id) == ("cancelled", "cancelled")


def test_a_cut_connection_is_retried_and_the_abort_still_lands(live_server_url, agent_key, proxy, operator):
    url = proxy.url(live_server_url)
    streamed = threading.Event()
    with Client(url, agent_key, flush_s=0.02, heartbeat_s=0.3) as client:
        def agent():
            with client.run("client-demo") as run:
                run.stream("before ")
                run.step()
                while True:
                    run.stream("w ")
                    streamed.set()
                    run._stopped.wait(0.01)
            return run

        body = Background(agent)
        assert streamed.wait(30)
        proxy.cut()  # every connection reset: the long-poll, the pump's batches
        accepted = proxy.accepted
        proxy.restore()
        operator.abort(Run.objects.get(agent="client-demo").pk)
        run = body.result()
    assert proxy.accepted > accepted  # it reconnected
    assert outcome(run.id) == ("cancelled", "cancelled")
    assert Step.objects.filter(run_id=run.id).count() == 1


def test_approvals_are_answered_approved_runs_the_tool_denied_does_not(client, answering):
    answered = answering("client-demo", lambda request: request.get("args", {}).get("path", "").startswith("/tmp/"))
    ran = []
    with client.run("client-demo") as run:
        for path in ("/tmp/a", "/etc/b"):
            if run.wait_for_approval("rm", {"path": path}):
                run.call_tool("rm", lambda path: ran.append(path), path=path)
        run.step("asked twice")
    assert ran == ["/tmp/a"] and answered == [True, False]
    assert outcome(run.id) == ("completed", "completed")
    (step,) = Step.objects.filter(run_id=run.id)
    assert [c["args"] for c in step.tool_calls] == [{"path": "/tmp/a"}]


def test_an_operator_message_is_the_answer_to_wait_for_input(client, transactional_db):
    from runs import transitions

    def operator():
        while not Run.objects.filter(agent="client-demo", status="waiting_for_input").exists():
            threading.Event().wait(0.05)
        run_id = Run.objects.get(agent="client-demo").pk
        try:
            assert transitions.resume(run_id, expect="waiting_for_input", by=None, answer={"text": "blue"})
        except BaseException:  # the agent would wait forever: abort it, so the test fails here
            transitions.request_cancel(run_id, by="test operator")
            raise

    helper = Background(operator)
    with client.run("client-demo") as run:
        assert run.wait_for_input("which colour?") == "blue"
    helper.result()
    assert outcome(run.id) == ("completed", "completed")
