"""A covering index for the overview's windows at a million runs (PostgreSQL only).

The overview groups a window of runs (up to 7 days) by time bucket, status and ending
reason. With those two columns in the index, PostgreSQL answers from the index alone
(an index-only scan) instead of fetching every row of the window from the table.
SQLite, the embedded default, has no INCLUDE and does not need it at its size.
"""

from django.db import migrations

INDEX = "run_created_outcome"


def create(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(
            f"CREATE INDEX IF NOT EXISTS {INDEX} ON runs_run (created_at) INCLUDE (status, termination_reason)"
        )


def drop(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP INDEX IF EXISTS {INDEX}")


class Migration(migrations.Migration):

    dependencies = [
        ("runs", "0009_input_delivery"),
    ]

    operations = [migrations.RunPython(create, drop)]
