"""The benchmarks' own arithmetic and parsing: what they read from the workers' logs is
the log line the worker writes (a contract: bench_cancel counts slow-path cancels by it)."""

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from runs import benchkit

SETTLE_LINES = """\
2026-12-01 07:12:10,794 INFO runs.agent.runner run d0d7adae-5038-4dff-a60c-9e36abab7a65 settled cancelled/cancelled (cancel via channel, settled 10.1 ms after it arrived)
2026-12-01 07:12:10,853 INFO runs.agent.runner run e7ef38ec-4efb-4442-bd6c-c5d4444fd5a8 settled cancelled/cancelled (cancel via heartbeat, settled 16.4 ms after it arrived)
2026-12-01 07:12:10,899 INFO runs.agent.runner run bb903f9e-bdf5-4b05-8bd3-9ba3dbac3b88 settled cancelled/cancelled (cancel via shutdown)
2026-12-01 07:12:11,000 INFO runs.agent.runner run 11111111-5038-4dff-a60c-9e36abab7a65 settled completed/completed
2026-12-01 07:12:12,000 WARNING runs.agent.worker worker w: claim failed (connection failed: FATAL:  sorry, too many clients already); retrying
Traceback (most recent call last):
psycopg.OperationalError: connection failed: FATAL:  sorry, too many clients already
"""


def test_cancel_paths_count_how_each_cancel_arrived_for_the_runs_asked_about():
    asked = ["d0d7adae-5038-4dff-a60c-9e36abab7a65", "e7ef38ec-4efb-4442-bd6c-c5d4444fd5a8",
             "11111111-5038-4dff-a60c-9e36abab7a65"]
    assert benchkit.cancel_paths(SETTLE_LINES, asked) == {"channel": 1, "heartbeat": 1}


def test_connection_errors_count_log_records_not_traceback_lines():
    assert benchkit.connection_errors(SETTLE_LINES) == 1


def test_percentile_is_nearest_rank():
    values = list(range(1, 201))
    assert (benchkit.percentile(values, 50), benchkit.percentile(values, 99)) == (100, 198)
    assert benchkit.percentile([], 50) is None


@pytest.mark.django_db
def test_a_bench_database_name_must_be_the_benchs_own():
    with pytest.raises(CommandError, match="real database"):
        benchkit.bench_database_name("postgres", "bench_cancel")
    with pytest.raises(CommandError, match="lowercase"):
        benchkit.bench_database_name("Robert'); DROP", "bench_cancel")
    assert benchkit.bench_database_name("", "bench_cancel").startswith("bench_cancel_")


@pytest.mark.parametrize("command", ["bench_cancel", "bench_live"])
def test_the_benchmarks_say_in_one_line_what_they_need(command, settings):
    if connection.vendor == "postgresql" and settings.REDIS_URL:
        pytest.skip("only the embedded default lacks what they need")
    with pytest.raises(CommandError, match="needs (PostgreSQL|Redis)"):
        call_command(command)


def test_a_malformed_curve_is_one_line():
    with pytest.raises(CommandError, match="--curve 'twenty'"):
        call_command("bench_cancel", "--curve", "twenty")
    with pytest.raises(CommandError, match="must be positive"):
        call_command("bench_cancel", "--live", "0")
