"""Migration 0007 stores the dashboard's source as "dashboard" (the glossary's word),
rows written before it included, and back again when unapplied."""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

BEFORE, AFTER = ("runs", "0007_drop_last_progress_at"), ("runs", "0008_cancel_source_dashboard")


def migrate(target):
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate([target])
    return executor.loader.project_state([target]).apps


@pytest.mark.django_db(transaction=True)
def test_old_user_rows_read_dashboard_after_the_migration():
    try:
        apps = migrate(BEFORE)
        Run, RunEvent = apps.get_model("runs", "Run"), apps.get_model("runs", "RunEvent")
        run = Run.objects.create(agent="a", status="running", worker="w1", cancel_source="user", event_seq=1)
        RunEvent.objects.create(run=run, seq=1, kind="cancel_requested", source="user", data={})
        apps = migrate(AFTER)
        assert apps.get_model("runs", "Run").objects.get(pk=run.pk).cancel_source == "dashboard"
        assert apps.get_model("runs", "RunEvent").objects.get(run_id=run.pk).source == "dashboard"
        apps = migrate(BEFORE)
        assert apps.get_model("runs", "Run").objects.get(pk=run.pk).cancel_source == "user"
    finally:  # back to the newest migration: later tests need every column
        executor = MigrationExecutor(connection)
        executor.migrate(executor.loader.graph.leaf_nodes("runs"))
