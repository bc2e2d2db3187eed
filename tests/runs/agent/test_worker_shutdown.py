"""SIGTERM to a real `run_agents` process on PostgreSQL + Redis: a graceful shutdown is
not worse than a crash. Runs still going after the grace end failed / worker_shutdown
(retryable, their committed steps intact, Retry works), never as if an operator had
cancelled them; a run an operator did cancel still ends cancelled."""

import signal

from runs import transitions
from runs.models import Run, RunEvent, Step
from tests.runs.agent.test_e2e_worker import DEAD_REDIS, redis_url, start_worker, wait_until  # noqa: F401 - fixtures

LONG = " ".join(f"w{i}" for i in range(500))


def streaming_run(title):
    """One short committed step, then a step that streams for ~25 s."""
    return transitions.create_run(
        agent="scripted", title=title,
        input={"script": [{"say": "the first step"}, {"say": LONG, "token_delay_ms": 50}]},
    )


def committed(run_id):
    return list(Step.objects.filter(run_id=run_id).order_by("index").values_list("index", "text", "committed_at"))


def test_sigterm_ends_unfinished_runs_failed_worker_shutdown_and_they_can_be_retried(start_worker, redis_url):  # noqa: F811
    proc, log = start_worker(redis_url, worker_id="e2e-term", concurrency=4, RUNWARDEN_SHUTDOWN_GRACE_S="1")
    short = transitions.create_run(agent="scripted", input={"script": [{"say": "a b c d", "token_delay_ms": 100}]})
    streaming = [streaming_run(f"stream {i}") for i in range(3)]
    ids = [r.id for r in streaming]
    wait_until(lambda: Run.objects.filter(pk__in=ids, steps=1).count() == 3, 20, "a committed step each")
    before = {run_id: committed(run_id) for run_id in ids}

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 0

    short.refresh_from_db()
    assert (short.status, short.termination_reason) == ("completed", "completed")  # finished within the grace
    for run in Run.objects.filter(pk__in=ids):
        assert (run.status, run.termination_reason, run.is_retryable) == ("failed", "worker_shutdown", True)
        assert (run.cancel_requested_at, run.cancel_source, run.worker) == (None, "", "e2e-term")
        assert committed(run.id) == before[run.id] and run.steps == 1  # nothing half-done was kept
        events = {e.kind: e.data for e in RunEvent.objects.filter(run=run)}
        assert "cancel_requested" not in events
        assert events["settled"]["reason"] == "worker_shutdown" and events["settled"]["error_class"] == "WorkerShutdown"
        assert events["step_discarded"]["reason"] == "worker shutdown" and events["step_discarded"]["index"] == 1
        assert events["step_discarded"]["text"]  # what was streaming when it stopped
        retried = transitions.retry(run.id, by="op").created
        assert retried is not None and (retried.status, retried.retry_of_id) == ("queued", run.id)
    text = log.read_text()
    assert "they end failed/worker_shutdown" in text and "Traceback" not in text


def test_a_run_an_operator_cancelled_just_before_sigterm_ends_cancelled(start_worker):
    # The fast path is down and the heartbeat slow, so the worker has not heard of the
    # cancel when SIGTERM stops the run: its failed/worker_shutdown settle must still
    # come out cancelled (the cancel is in the row, and a pending cancel wins).
    proc, log = start_worker(DEAD_REDIS, worker_id="e2e-term-slow", concurrency=2,
                             RUNWARDEN_SHUTDOWN_GRACE_S="0", RUNWARDEN_HEARTBEAT_S="30")
    cancelled, other = streaming_run("cancelled by an operator"), streaming_run("interrupted")
    wait_until(lambda: Run.objects.filter(pk__in=[cancelled.id, other.id], steps=1).count() == 2, 20, "running")
    assert transitions.request_cancel(cancelled.id, by="op", note="not needed") == transitions.CancelOutcome.REQUESTED

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 0

    cancelled.refresh_from_db()
    other.refresh_from_db()
    assert (cancelled.status, cancelled.termination_reason, cancelled.cancel_source) == ("cancelled", "cancelled", "dashboard")
    assert cancelled.steps == 1 and not cancelled.is_retryable
    assert (other.status, other.termination_reason) == ("failed", "worker_shutdown")
    # The worker settled it as a shutdown; the database recorded the cancel that came first.
    assert f"run {cancelled.id} settled failed/worker_shutdown" in log.read_text()
