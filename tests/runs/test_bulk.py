"""Bulk actions: right counts, also while runs settle under them."""

import threading

import pytest

from runs import bulk, transitions
from runs.models import Run

pytestmark = pytest.mark.django_db


def test_preview_counts_only_runs_the_action_can_change(make_run, running_run, run_in):
    make_run(), running_run(), run_in("completed"), run_in("failed")
    cancel = bulk.preview("cancel", Run.objects.all())
    assert cancel.count == 2 and {r.status for r in cancel.sample} == {"queued", "running"}
    assert bulk.preview("retry", Run.objects.all()).count == 1


def test_cancel_by_selection_reports_each_outcome(make_run, running_run, run_in):
    runs = [make_run(), running_run(), running_run(), run_in("completed")]
    transitions.request_cancel(runs[2].id)
    summary = bulk.execute("cancel", Run.objects.filter(pk__in=[r.id for r in runs]), by="alice", note="cleanup")
    assert summary == {"settled": 1, "requested": 1,
                       "already requested": 1, "had already ended": 1}
    assert Run.objects.get(pk=runs[1].id).cancel_note == "cleanup"


def test_retire_and_retry_by_filter_in_small_batches(running_run, run_in):
    for _ in range(5):
        running_run(agent="flaky")
    run_in("failed", agent="flaky")
    retire = bulk.execute("retire", Run.objects.filter(agent="flaky"), by="alice", batch=2)
    assert retire == {"retired": 5, "had already ended": 1}
    retry = bulk.execute("retry", Run.objects.filter(agent="flaky", status="failed"), by="alice", batch=2)
    assert retry == {"retried": 1}
    assert Run.objects.filter(agent="flaky", status="queued").count() == 1


def test_unknown_action_is_refused(make_run):
    with pytest.raises(ValueError):
        bulk.execute("explode", Run.objects.all())


@pytest.mark.django_db(transaction=True)
def test_counts_stay_right_while_runs_settle_concurrently(postgres):
    runs = [transitions.create_run(agent="bulk") for _ in range(150)]
    for run in runs:
        transitions.claim(run.id, worker="w1")
    start = threading.Barrier(2)
    settled_by_worker = []

    def worker():
        from django.db import connections

        start.wait()
        for run in reversed(runs):  # from the other end, so the two meet in the middle
            if transitions.settle(run.id, status="completed", reason="completed", worker="w1"):
                settled_by_worker.append(run.id)
        connections.close_all()

    thread = threading.Thread(target=worker)
    thread.start()
    start.wait()
    summary = bulk.execute("retire", Run.objects.filter(agent="bulk"), by="alice", batch=25)
    thread.join()
    assert summary["retired"] + len(settled_by_worker) == len(runs)
    assert summary["retired"] + summary["had already ended"] == len(runs)
    assert Run.objects.filter(agent="bulk", status="cancelled").count() == summary["retired"]
    assert Run.objects.filter(agent="bulk", status="completed").count() == len(settled_by_worker)


def test_frozen_ids_are_acted_on_exactly_and_ended_ones_reported(make_run, running_run):
    runs = [running_run() for _ in range(3)]
    frozen = bulk.freeze("cancel", Run.objects.all())
    assert set(frozen) == {r.id for r in runs}
    transitions.settle(runs[0].id, status="completed", reason="completed", worker="w1")
    newcomer = make_run()  # created after the preview: not in the frozen set
    summary = bulk.execute_ids("cancel", frozen, by="alice")
    assert summary == {"requested": 2, "had already ended": 1}
    assert Run.objects.get(pk=newcomer.id).status == "queued"
