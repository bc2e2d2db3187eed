"""Fault: the worker process is killed with SIGKILL mid-run. Nobody settles the run, so
the watchdog must: flagged stuck within RUNWARDEN_STUCK_S of silence, reaped at
RUNWARDEN_REAP_S (both shortened here), with the steps it had committed intact."""

from datetime import timedelta

from runs import queries, transitions, watchdog
from runs.models import Run, Step
from tests.runs.agent.test_e2e_worker import redis_url, start_worker, wait_until  # noqa: F401 - fixtures

STUCK_S, REAP_S, HEARTBEAT_S = 1.0, 3.0, 0.2


def test_killed_worker_is_flagged_stuck_then_reaped_with_its_steps_intact(start_worker, redis_url):  # noqa: F811
    proc, _ = start_worker(redis_url, worker_id="doomed", concurrency=2, RUNWARDEN_HEARTBEAT_S=str(HEARTBEAT_S))
    long_text = " ".join(f"word{i}" for i in range(400))
    run = transitions.create_run(
        agent="scripted", title="doomed",
        input={"script": [{"say": "the first step"}, {"say": long_text, "token_delay_ms": 50}]},
    )
    wait_until(lambda: Run.objects.get(pk=run.id).steps >= 1, 20, "a committed step")
    committed = list(Step.objects.filter(run=run).order_by("index").values_list("index", "text", "committed_at"))

    proc.kill()  # SIGKILL: no finalize, no settle, no goodbye
    proc.wait()
    stuck_after = timedelta(seconds=STUCK_S)

    # Generous timeouts (no bound a loaded machine could miss); the thresholds are
    # checked on the database clock, where the watchdog reads them.
    wait_until(lambda: queries.stuck(stuck_after).filter(pk=run.id).exists(), STUCK_S + 30, "flagged stuck")
    first = watchdog.sweep(stuck_s=STUCK_S, reap_s=REAP_S)
    if run.id not in first.reaped:  # unless the machine was so slow REAP_S passed already
        assert first.stuck >= 1  # stuck, not yet given up on

    wait_until(lambda: run.id in watchdog.sweep(stuck_s=STUCK_S, reap_s=REAP_S).reaped, REAP_S + 30, "reaped")

    row = Run.objects.get(pk=run.id)
    assert row.finished_at - row.heartbeat_at >= timedelta(seconds=REAP_S)  # never reaped early
    assert (row.status, row.termination_reason, row.is_retryable) == ("failed", "worker_lost", True)
    after = list(Step.objects.filter(run=run).order_by("index").values_list("index", "text", "committed_at"))
    assert after == committed and row.steps == len(committed)  # committed steps intact, nothing half-done


def test_an_approval_after_the_worker_was_killed_is_resumed_by_another_worker(start_worker, redis_url):  # noqa: F811
    from django.test import Client

    from tests.dashboard.conftest import make_user

    first, _ = start_worker(redis_url, worker_id="first", concurrency=2, RUNWARDEN_HEARTBEAT_S=str(HEARTBEAT_S))
    run = transitions.create_run(
        agent="scripted", title="needs a yes",
        input={"script": [{"say": "the first step"},
                          {"ask_approval": {"tool": "echo", "args": {"ok": True}}},
                          {"say": "after the approval"}],
               "approval_timeout_s": 120},
    )
    wait_until(lambda: Run.objects.get(pk=run.id).status == "waiting_for_approval", 20, "waiting for approval")
    committed = list(Step.objects.filter(run=run).values_list("index", "text", "committed_at"))
    assert [c[0] for c in committed] == [0]

    first.kill()  # SIGKILL while the run waits: it held nothing, so nothing is lost
    first.wait()
    row = Run.objects.get(pk=run.id)
    assert (row.status, row.worker, row.heartbeat_at) == ("waiting_for_approval", "", None)
    sweep = watchdog.sweep(stuck_s=0.01, reap_s=0.01)  # any heartbeat would be stale by now
    assert run.id not in sweep.reaped and not queries.stuck(timedelta(seconds=0.01)).filter(pk=run.id).exists()

    operator = make_user("operator", "view_run", "cancel_run")
    client = Client()
    client.force_login(operator)
    response = client.post(f"/runs/{run.id}/approve", {"decision": "approve"}, HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    # Answered with no worker alive: queued for whichever worker comes, never reaped.
    assert Run.objects.get(pk=run.id).status == "queued"
    assert run.id not in watchdog.sweep(stuck_s=0.01, reap_s=0.01).reaped

    start_worker(redis_url, worker_id="second", concurrency=2, RUNWARDEN_HEARTBEAT_S=str(HEARTBEAT_S))
    wait_until(lambda: Run.objects.get(pk=run.id).status in Run.TERMINAL, 20, "the second worker finishing it")
    row = Run.objects.get(pk=run.id)
    assert (row.status, row.termination_reason, row.worker) == ("completed", "completed", "second")
    steps = list(Step.objects.filter(run=run).order_by("index"))
    assert [s.index for s in steps] == [0, 1, 2] and row.steps == 3  # no duplicate, no gap
    assert [(s.index, s.text, s.committed_at) for s in steps[:1]] == committed  # committed steps intact
    assert steps[1].tool_calls[0]["result"] == {"ok": True}
    assert steps[1].text == "I need approval to run echo."
