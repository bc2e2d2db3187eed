"""The database enforces the status/reason table, not only Python."""

import uuid

import pytest
from django.db import IntegrityError, connection, transaction

from runs.models import Run

INSERT = """
INSERT INTO runs_run (id, agent, title, input, status, termination_reason, truncated, error_class,
    error_message, created_at, finished_at, cancel_requested_by, cancel_source, cancel_note, worker,
    tokens_in, tokens_out, cost, steps, tool_calls, event_seq)
VALUES (%s, 'a', '', '{}', %s, %s, %s, '', '', CURRENT_TIMESTAMP, {finished}, '', '', '', %s, 0, 0, 0, 0, 0, 0)
"""


def insert(status, reason, *, finished=True, truncated=False, worker=None):
    sql = INSERT.replace("{finished}", "CURRENT_TIMESTAMP" if finished else "NULL")
    run_id = uuid.uuid4().hex if connection.vendor == "sqlite" else str(uuid.uuid4())
    if worker is None:
        worker = "w1" if status == "running" else ""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql, [run_id, status, reason, truncated, worker])


VALID = [
    ("queued", "", False), ("running", "", False), ("waiting_for_input", "", False),
    ("completed", "completed", True), ("completed", "max_iterations", True),
    ("failed", "worker_lost", True), ("failed", "worker_shutdown", True), ("cancelled", "cancelled", True),
]
INVALID = [
    ("completed", "", True),  # terminal without a reason: unknown is not allowed in
    ("completed", "cancelled", True),
    ("completed", "provider_failed", True),
    ("failed", "completed", True),
    ("cancelled", "worker_lost", True),
    ("cancelled", "worker_shutdown", True),  # a rolling deploy is not an operator's cancel
    ("completed", "worker_shutdown", True),
    ("running", "completed", False),  # a live run has no reason
    ("queued", "cancelled", False),
    ("exploded", "", False),
]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("status,reason,finished", VALID)
def test_valid_pairs_are_accepted(status, reason, finished):
    insert(status, reason, finished=finished)
    assert Run.objects.filter(status=status).count() == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("status,reason,finished", INVALID)
def test_invalid_status_reason_pair_rejected_by_database(status, reason, finished):
    with pytest.raises(IntegrityError):
        insert(status, reason, finished=finished)
    assert not Run.objects.exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "status, worker, ok",
    [("queued", "", True), ("queued", "w1", False), ("running", "w1", True), ("running", "", False),
     ("waiting_for_approval", "w1", True), ("waiting_for_approval", "", True), ("waiting_for_input", "", True)],
)
def test_who_holds_a_run_is_enforced_by_the_database(status, worker, ok):
    # Queued: nobody. Running: its worker. Waiting: its holder (an API agent), or nobody
    # (released by the engine, so it takes no slot and needs no heartbeat).
    if ok:
        insert(status, "", finished=False, worker=worker)
        assert Run.objects.filter(status=status, worker=worker).count() == 1
    else:
        with pytest.raises(IntegrityError):
            insert(status, "", finished=False, worker=worker)


@pytest.mark.django_db(transaction=True)
def test_terminal_row_needs_finished_at():
    with pytest.raises(IntegrityError):
        insert("completed", "completed", finished=False)


@pytest.mark.django_db(transaction=True)
def test_truncated_needs_a_truncating_reason():
    insert("completed", "budget_exhausted", truncated=True)
    with pytest.raises(IntegrityError):
        insert("completed", "completed", truncated=True)


def test_properties():
    assert Run(status="failed", termination_reason="worker_lost").is_retryable
    assert Run(status="failed", termination_reason="provider_failed").is_retryable
    assert Run(status="failed", termination_reason="worker_shutdown").is_retryable
    assert Run(status="failed", termination_reason="worker_shutdown").reason_label == "worker shutdown"
    assert not Run(status="failed", termination_reason="policy_denied").is_retryable
    assert not Run(status="cancelled", termination_reason="cancelled").is_retryable
    assert Run(status="cancelled").is_terminal and not Run(status="waiting_for_input").is_terminal
    assert Run(status="completed", termination_reason="").reason_label == "unknown"
    assert Run(status="running").reason_label == ""
    assert [s.value for s in Run.Status] == [
        "queued", "running", "waiting_for_input", "waiting_for_approval", "completed", "failed", "cancelled",
    ]
