"""Real races on PostgreSQL: many threads, each with its own connection, on the same runs.

Each test asserts exactly one winner per run and the first outcome intact.
"""

import threading
from collections import Counter, defaultdict
from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.db import connections
from django.utils import timezone

from runs import transitions
from runs.models import Run, RunEvent, RunInput
from runs.transitions import CancelOutcome
from tests.conftest import claim_new_run

THREADS = 8
RUNS = 100


def race(workers, runs):
    """Run each `worker(run, index)` on every run, all threads released at once and
    walking the runs in the same order so they collide. Returns {(run_id, i): result}."""
    barrier = threading.Barrier(len(workers))
    results, errors = {}, []

    def body(i, work):
        try:
            barrier.wait()
            for run in runs:
                results[(run.id, i)] = work(run)
        except Exception as error:  # noqa: BLE001 - reported below, in the test thread
            errors.append(error)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=body, args=(i, w)) for i, w in enumerate(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    return results


def by_run(results):
    grouped = defaultdict(dict)
    for (run_id, i), value in results.items():
        grouped[run_id][i] = value
    return grouped


@pytest.fixture
def running_runs(postgres):
    def make(n=RUNS, worker="w1"):
        return [claim_new_run(worker=worker, title=f"race {i}") for i in range(n)]

    return make


OUTCOMES = [
    ("completed", "completed", {"tokens_in": 1}),
    ("failed", "provider_failed", {"tokens_in": 2}),
    ("completed", "budget_exhausted", {"tokens_in": 3}),
    ("failed", "policy_denied", {"tokens_in": 4}),
]


def test_settle_vs_settle_one_winner_first_outcome_intact(running_runs):
    runs = running_runs()

    def settler(i):
        status, reason, totals = OUTCOMES[i % len(OUTCOMES)]
        return lambda run: transitions.settle(
            run.id, status=status, reason=reason, worker="w1", totals=totals,
            truncated=reason == "budget_exhausted",
        )

    results = by_run(race([settler(i) for i in range(THREADS)], runs))
    for run in runs:
        winners = [i for i, won in results[run.id].items() if won]
        assert len(winners) == 1
        status, reason, totals = OUTCOMES[winners[0] % len(OUTCOMES)]
        row = Run.objects.get(pk=run.id)
        assert (row.status, row.termination_reason, row.tokens_in) == (status, reason, totals["tokens_in"])
        assert RunEvent.objects.filter(run=run, kind="settled").count() == 1
        assert RunEvent.objects.filter(run=run, kind="late_settle_ignored").count() == THREADS - 1


def test_settle_vs_cancel_vs_retire_one_terminal_outcome(running_runs):
    runs = running_runs()
    settle = lambda run: ("settle", transitions.settle(run.id, status="completed", reason="completed", worker="w1"))  # noqa: E731
    retire = lambda run: ("retire", transitions.force_cancel(run.id, by="op"))  # noqa: E731
    cancel = lambda run: ("cancel", transitions.request_cancel(run.id, by="op"))  # noqa: E731
    results = by_run(race([settle, retire, cancel, settle, retire, cancel, settle, retire], runs))
    for run in runs:
        outcomes = list(results[run.id].values())
        terminal_wins = [verb for verb, won in outcomes if verb in ("settle", "retire") and won]
        assert len(terminal_wins) == 1
        row = Run.objects.get(pk=run.id)
        assert row.status == ("completed" if terminal_wins[0] == "settle" else "cancelled")
        requested = [won for verb, won in outcomes if verb == "cancel" and won == CancelOutcome.REQUESTED]
        assert len(requested) <= 1
        assert RunEvent.objects.filter(run=run, kind__in=["settled", "retired"]).count() == 1


def test_cancel_vs_claim_of_a_queued_run(postgres):
    runs = [transitions.create_run(agent="scripted") for _ in range(RUNS)]
    claimers = [lambda run, w=f"w{i}": ("claim", transitions.claim(run.id, worker=w)) for i in range(4)]
    cancellers = [lambda run: ("cancel", transitions.request_cancel(run.id, by="op")) for _ in range(4)]
    results = by_run(race(claimers + cancellers, runs))
    for run in runs:
        outcomes = list(results[run.id].values())
        claims = [won for verb, won in outcomes if verb == "claim" and won]
        settled = [o for verb, o in outcomes if verb == "cancel" and o == CancelOutcome.SETTLED]
        requested = [o for verb, o in outcomes if verb == "cancel" and o == CancelOutcome.REQUESTED]
        assert len(claims) + len(settled) == 1
        row = Run.objects.get(pk=run.id)
        if settled:
            assert (row.status, row.worker, requested) == ("cancelled", "", [])
        else:
            assert row.status == "running"
            assert len(requested) <= 1 and row.is_cancelling == bool(requested)


def test_reap_vs_heartbeat_heartbeat_that_lands_first_wins(running_runs):
    runs = running_runs()
    stale = timezone.now() - timedelta(minutes=10)
    Run.objects.filter(pk__in=[r.id for r in runs]).update(heartbeat_at=stale)
    # A reaper sweeps every stale run, so count each run's reaps across all sweeps.
    reaper = lambda run: ("reap", transitions.reap_stale(older_than=timedelta(minutes=5)))  # noqa: E731
    beater = lambda run: ("beat", transitions.heartbeat(run.id, worker="w1").held)  # noqa: E731
    results = race([reaper, beater] * (THREADS // 2), runs)
    reaps = Counter(rid for verb, ids in results.values() if verb == "reap" for rid in ids)
    held = Counter(rid for (rid, _), (verb, ok) in results.items() if verb == "beat" and ok)
    for run in runs:
        row = Run.objects.get(pk=run.id)
        assert reaps[run.id] <= 1
        if reaps[run.id]:
            assert (row.status, row.termination_reason) == ("failed", "worker_lost")
        else:
            # Not reaped: a heartbeat landed first and the reaper's re-check saw it fresh.
            assert row.status == "running" and held[run.id]
    assert RunEvent.objects.filter(kind="reaped").count() == sum(reaps.values())


def test_reap_loses_to_a_heartbeat_that_already_landed(running_runs):
    runs = running_runs(n=20)
    Run.objects.update(heartbeat_at=timezone.now() - timedelta(minutes=10))
    for run in runs:
        assert transitions.heartbeat(run.id, worker="w1").held
    results = race([lambda run: transitions.reap_stale(older_than=timedelta(minutes=5))] * THREADS, runs[:1])
    assert all(reaped == [] for reaped in results.values())
    assert not Run.objects.exclude(status="running").exists()


def test_resume_vs_resume_one_resume(running_runs):
    runs = running_runs()
    for run in runs:
        assert transitions.suspend(run.id, worker="w1", status="waiting_for_approval")
    approvers = [
        lambda run, i=i: transitions.resume(run.id, by=f"op{i}", answer={"approved": i % 2 == 0})
        for i in range(THREADS)
    ]
    results = by_run(race(approvers, runs))
    for run in runs:
        assert sum(results[run.id].values()) == 1
        assert RunInput.objects.filter(run=run).count() == 1
        assert Run.objects.get(pk=run.id).status == "running"


def claim_all_in_threads():
    """THREADS workers call claim_next until the queue is empty; {run id: times claimed}."""
    claimed = Counter()
    lock = threading.Lock()

    def worker(i):
        def take(_):
            while (run := transitions.claim_next(worker=f"w{i}")) is not None:
                with lock:
                    claimed[run.id] += 1
        return take

    race([worker(i) for i in range(THREADS)], [SimpleNamespace(id="queue")])
    return claimed


def test_claim_next_never_hands_one_run_to_two_workers(postgres):
    for _ in range(RUNS):
        transitions.create_run(agent="scripted")
    claimed = claim_all_in_threads()
    assert len(claimed) == RUNS and set(claimed.values()) == {1}
    assert not Run.objects.filter(status="queued").exists()


@pytest.fixture
def answered_waits(postgres):
    """Runs the engine released while waiting for approval (as worker w1 leaves them)."""

    def make(n=RUNS, answer=True):
        runs = [transitions.create_run(agent="scripted", title=f"wait {i}") for i in range(n)]
        for run in runs:
            assert transitions.claim(run.id, worker="w1")
            assert transitions.suspend(run.id, worker="w1", status="waiting_for_approval", release=True,
                                       request={"tool": "echo"}, timeout_s=300)
            if answer:
                assert transitions.resume(run.id, by="op", answer={"approved": True})
        return runs

    return make


def test_workers_racing_for_answered_runs_claim_each_once(answered_waits):
    runs = answered_waits()
    claimed = claim_all_in_threads()
    assert len(claimed) == RUNS and set(claimed.values()) == {1}
    resumed = RunEvent.objects.filter(kind="claimed", data__resumed=True)
    assert resumed.count() == RUNS and resumed.values("run").distinct().count() == RUNS


def test_an_answer_and_the_wait_expiry_racing_give_one_outcome(answered_waits):
    runs = answered_waits(n=20, answer=False)
    both = [
        lambda run: transitions.resume(run.id, by="op", answer={"approved": True}),
        lambda run: run.id in transitions.expire_waits(),
    ] * (THREADS // 2)
    for run in runs:  # one run due at a time, so every expiry thread aims at it
        Run.objects.filter(pk=run.id).update(wait_deadline=timezone.now() - timedelta(minutes=1))
        results = by_run(race(both, [run]))[run.id]
        answered = sum(v for i, v in results.items() if i % 2 == 0)
        expired = sum(v for i, v in results.items() if i % 2 == 1)
        assert answered + expired == 1
        row = Run.objects.get(pk=run.id)
        if answered:
            assert row.status == "queued" and RunInput.objects.filter(run=run).count() == 1
        else:
            assert (row.status, row.termination_reason) == ("failed", "approval_denied")
            assert not RunInput.objects.filter(run=run).exists()


def test_an_answer_and_a_cancel_racing_on_a_released_wait_end_cancelled_once(answered_waits):
    runs = answered_waits(answer=False)
    both = [
        lambda run: transitions.resume(run.id, by="op", answer={"approved": True}),
        lambda run: transitions.request_cancel(run.id, by="op"),
    ] * (THREADS // 2)
    results = by_run(race(both, runs))
    for run in runs:
        row = Run.objects.get(pk=run.id)
        assert (row.status, row.termination_reason) == ("cancelled", "cancelled")
        outcomes = [v for i, v in results[run.id].items() if i % 2 == 1]
        assert outcomes.count(CancelOutcome.SETTLED) == 1  # whichever came first, one settle
        # An answer that won first was queued, then resolved once by the cancel.
        assert set(RunInput.objects.filter(run=run).values_list("status", "resolution")) <= {("cancelled", "interrupted")}
        assert RunEvent.objects.filter(run=run, kind="cancel_requested").count() == 1
