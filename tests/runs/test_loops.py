"""Loop detection on committed steps: the rules, their limits per agent, once per run."""

import threading

import pytest
from django.db import connection

from runs import loops, transitions
from runs.models import AgentPolicy, Run, RunEvent

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def fresh_policies():
    loops.forget()
    yield
    loops.forget()


@pytest.fixture
def commit(django_capture_on_commit_callbacks):
    """`commit(run, *calls)`: commit the run's next step with these tool-call records
    (none: a message step), running what waits for the commit (the detection)."""

    def do(run, *calls, worker="w1"):
        index = Run.objects.get(pk=run.id).steps
        with django_capture_on_commit_callbacks(execute=True):
            step = transitions.commit_step(
                run.id, worker=worker, index=index, kind="tool_calls" if calls else "message", text="t",
                tool_calls=list(calls),
            )
        assert step is not None
        return step

    return do


def ok(name, **args):
    return {"id": f"c-{name}-{len(args)}", "name": name, "args": args, "result": {"ok": True}}


def err(name, **args):
    return {"id": f"e-{name}", "name": name, "args": args, "error": "TimeoutError: slow"}


def flags(run):
    return [e.data for e in RunEvent.objects.filter(run_id=run.id, kind=RunEvent.Kind.FLAGGED).order_by("seq")]


def test_the_same_call_three_times_in_a_row_is_flagged_once_with_its_evidence(running_run, commit):
    run = running_run()
    commit(run, ok("search", q="x"))
    commit(run, ok("search", q="x"))
    assert flags(run) == []
    commit(run, ok("search", q="x"))
    commit(run, ok("search", q="x"))  # the loop goes on: still one flag

    (data,) = flags(run)
    assert data == {"flag": "repeated_tool", "policy": "flag",
                    "evidence": {"tool": "search", "args": {"q": "x"}, "times": 3, "steps": [0, 1, 2]}}
    event = RunEvent.objects.get(run_id=run.id, kind=RunEvent.Kind.FLAGGED)
    assert (event.actor, event.source) == ("runwarden", "guardrail")
    assert Run.objects.get(pk=run.id).status == Run.Status.RUNNING  # `flag` lets it go on


def test_arguments_are_compared_canonically_and_other_arguments_break_the_row(running_run, commit):
    run = running_run()
    commit(run, ok("fetch", url="a", timeout=5))
    commit(run, ok("fetch", timeout=5, url="a"))  # same arguments, other key order
    commit(run, ok("fetch", url="b", timeout=5))  # breaks the row
    commit(run, ok("fetch", url="b", timeout=5))
    assert flags(run) == []
    commit(run, {**ok("fetch", timeout=5, url="b"), "id": "other-id"})  # ids do not matter
    assert [d["evidence"]["steps"] for d in flags(run)] == [[2, 3, 4]]


def test_message_steps_between_calls_do_not_break_the_row(running_run, commit):
    run = running_run()
    commit(run, ok("search", q="x"))
    commit(run)
    commit(run, ok("search", q="x"))
    commit(run)
    commit(run, ok("search", q="x"))
    assert flags(run)[0]["evidence"]["steps"] == [0, 2, 4]


def test_a_parallel_wave_of_the_same_call_counts_each_call(running_run, commit):
    run = running_run()
    commit(run, ok("echo", v=1), ok("echo", v=1), ok("echo", v=1))
    assert flags(run)[0]["evidence"] == {"tool": "echo", "args": {"v": 1}, "times": 3, "steps": [0]}


def test_a_different_call_after_the_repeats_ends_the_row(running_run, commit):
    run = running_run()
    commit(run, ok("echo", v=1), ok("echo", v=1))
    commit(run, ok("echo", v=2), ok("echo", v=1))
    assert flags(run) == []


def test_failed_calls_in_a_row_are_flagged_whatever_the_tools(running_run, commit):
    run = running_run()
    commit(run, err("fetch"))
    commit(run, ok("echo"))  # a success resets the row
    commit(run, err("fetch"), err("read"))
    assert flags(run) == []
    commit(run, err("write", path="p"))
    (data,) = flags(run)
    assert data["flag"] == "failing_tools"
    assert data["evidence"] == {"times": 3, "steps": [2, 3], "tools": ["fetch", "read", "write"],
                                "last_error": "TimeoutError: slow"}


def test_a_repeated_failing_call_raises_both_flags(running_run, commit):
    run = running_run()
    for _ in range(3):
        commit(run, err("fetch", url="a"))
    assert sorted(d["flag"] for d in flags(run)) == ["failing_tools", "repeated_tool"]


def test_the_agents_policy_overrides_the_settings(settings, running_run, commit):
    settings.RUNWARDEN_LOOP_REPEAT = 5
    strict = running_run(agent="strict")
    lax = running_run(agent="lax")
    AgentPolicy.objects.create(agent="strict", repeat_limit=2, failure_limit=1)
    for _ in range(3):
        commit(lax, ok("echo"))
    commit(strict, ok("echo"))
    assert flags(strict) == [] and flags(lax) == []
    commit(strict, ok("echo"))
    commit(strict, err("read"))
    assert [d["flag"] for d in flags(strict)] == ["repeated_tool", "failing_tools"]
    assert flags(lax) == []


def test_the_policy_is_memoised_until_forgotten(running_run, commit):
    run = running_run(agent="later")
    commit(run, ok("echo"))  # reads "no policy" for `later`
    AgentPolicy.objects.create(agent="later", repeat_limit=2)
    commit(run, ok("echo"))
    assert flags(run) == []  # within POLICY_TTL_S the old answer stands
    loops.forget()
    commit(run, ok("echo"))
    assert flags(run)[0]["evidence"]["times"] == 2


def test_a_busy_worker_checks_its_runs_steps_without_reading_them_back(running_run, commit,
                                                                      django_assert_num_queries):
    run = running_run()
    commit(run, ok("a"))
    commit(run)  # a message step keeps what this process knows
    loops.limits(run.agent)  # memoised, as in a busy worker
    with django_assert_num_queries(0):  # the step before was committed (and checked) here
        assert loops.check_step(run.id, 2, [ok("b")]) == []


def test_a_step_after_another_processs_steps_reads_them_back(running_run, commit):
    from django.test.utils import CaptureQueriesContext

    run = running_run()
    commit(run, ok("search", q="x"))
    # Step 1 committed elsewhere (another worker held the run meanwhile): not seen here.
    assert transitions.commit_step(run.id, worker="w1", index=1, kind="tool_calls", tool_calls=[ok("search", q="x")])
    loops.limits(run.agent)
    with CaptureQueriesContext(connection) as queries:
        assert loops.check_step(run.id, 2, [ok("search", q="x")]) == ["repeated_tool"]
    assert sum('FROM "runs_step"' in q["sql"] for q in queries.captured_queries) == 1  # read back once
    assert flags(run)[0]["evidence"]["steps"] == [0, 1, 2]


def test_a_raised_limit_reads_past_what_was_kept(running_run, commit):
    from django.test.utils import CaptureQueriesContext

    run = running_run(agent="grows")
    for _ in range(3):
        commit(run, ok("b"))
    assert [d["evidence"]["times"] for d in flags(run)] == [3]
    AgentPolicy.objects.create(agent="grows", repeat_limit=9)
    loops._policies.clear()  # the kept tail (3 calls) stays: too short for a limit of 9
    index = Run.objects.get(pk=run.id).steps
    transitions.commit_step(run.id, worker="w1", index=index, kind="tool_calls", tool_calls=[ok("b")])
    with CaptureQueriesContext(connection) as queries:
        assert loops.check_step(run.id, index, [ok("b")]) == []  # four in a row: short of 9 (and flagged once)
    assert sum('FROM "runs_step"' in q["sql"] for q in queries.captured_queries) == 1


def test_a_message_step_runs_no_detection(running_run, django_assert_num_queries):
    run = running_run()
    step = transitions.commit_step(run.id, worker="w1", index=0, kind="message", text="hi")
    with django_assert_num_queries(0):
        loops.after_commit(run.id, step)
        loops.after_commit(run.id, None)


def test_under_the_stop_policy_the_flag_asks_the_run_to_stop(running_run, commit):
    AgentPolicy.objects.create(agent="strict", loop_policy="stop", failure_limit=2)
    run = running_run(agent="strict")
    commit(run, err("fetch", url="a"))
    step = commit(run, err("fetch", url="b"))
    assert step.stopping is transitions.StopOutcome.REQUESTED  # the committing engine stops at once
    row = Run.objects.get(pk=run.id)
    assert (row.status, row.stop_reason, row.cancel_source) == ("running", "policy_denied", "guardrail")
    kinds = list(RunEvent.objects.filter(run_id=run.id).order_by("seq").values_list("kind", flat=True))
    assert kinds[-2:] == ["flagged", "stop_requested"]
    stop = RunEvent.objects.get(run_id=run.id, kind="stop_requested").data
    assert (stop["reason"], stop["limit"], stop["flag"], stop["times"]) == ("policy_denied", "loop", "failing_tools", 2)
    assert stop["note"] == "failing_tools: 2 tool calls failed in a row (steps 1–2); last: TimeoutError: slow"
    # Nothing more commits; a second flag kind later asks nothing twice.
    assert transitions.commit_step(run.id, worker="w1", index=2, kind="message") is None


def test_a_flag_on_a_run_already_stopping_asks_no_second_stop(running_run, commit):
    AgentPolicy.objects.create(agent="strict", loop_policy="stop")
    run = running_run(agent="strict")
    for _ in range(2):
        commit(run, ok("echo"))
    transitions.request_cancel(run.id, by="alice")
    assert loops.flag(run.id, loops.NO_PROGRESS, {"idle_s": 1, "limit_s": 1}, "stop") is loops.FlagOutcome.FLAGGED
    row = Run.objects.get(pk=run.id)
    assert (row.stop_reason, row.cancel_requested_by) == ("", "alice")  # the abort stands
    assert not RunEvent.objects.filter(run_id=run.id, kind="stop_requested").exists()


def test_an_ended_run_is_not_flagged(running_run):
    run = running_run()
    transitions.settle(run.id, worker="w1", status="completed", reason="completed")
    assert loops.flag(run.id, loops.REPEATED_TOOL, {"tool": "x"}) is loops.FlagOutcome.NOT_LIVE
    assert flags(run) == []


def test_detection_never_fails_the_commit(running_run, commit, monkeypatch, caplog):
    run = running_run()

    def broken(agent):
        raise RuntimeError("policy store down")

    monkeypatch.setattr(loops, "limits", broken)
    step = commit(run, ok("echo"))
    assert step.index == 0 and Run.objects.get(pk=run.id).steps == 1
    assert "loop detection failed" in caplog.text


@pytest.mark.parametrize("kind,evidence,words", [
    (loops.REPEATED_TOOL, {"tool": "search", "args": {"q": "x"}, "times": 3, "steps": [3, 4, 5]},
     "called search(q='x') 3 times in a row (steps 4–6)"),
    (loops.REPEATED_TOOL, {"tool": "echo", "args": {}, "times": 3, "steps": [0]},
     "called echo() 3 times in a row (step 1)"),
    (loops.FAILING_TOOLS, {"times": 3, "steps": [0, 2, 4], "tools": ["a", "b", "c"], "last_error": "boom"},
     "3 tool calls failed in a row (steps 1, 3, 5); last: boom"),
    (loops.NO_PROGRESS, {"idle_s": 612, "limit_s": 600, "since": "…"},
     "no new step for 10 min while heartbeating (limit 10 min)"),
    (loops.NO_PROGRESS, {"idle_s": 75, "limit_s": 60}, "no new step for 75s while heartbeating (limit 60s)"),
])
def test_evidence_in_words(kind, evidence, words):
    assert loops.describe(kind, evidence) == words


@pytest.mark.django_db(transaction=True)
def test_two_flaggers_racing_write_one_flag(postgres):
    run = transitions.create_run(agent="scripted", title="race")
    assert transitions.claim(run.id, worker="w1")
    barrier = threading.Barrier(4)
    outcomes = []

    def flagger():
        try:
            barrier.wait()
            outcomes.append(loops.flag(run.id, loops.NO_PROGRESS, {"idle_s": 1, "limit_s": 1}))
        finally:
            connection.close()

    threads = [threading.Thread(target=flagger) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == sorted([loops.FlagOutcome.FLAGGED] + [loops.FlagOutcome.ALREADY_FLAGGED] * 3)
    assert len(flags(run)) == 1
