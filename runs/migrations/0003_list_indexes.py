"""Indexes for the triage board and for searching titles at a million runs.

The title search (`title__icontains`, i.e. `UPPER(title::text) LIKE UPPER('%…%')`) gets
a trigram GIN index on PostgreSQL; SQLite, the embedded default, has no such index and
does not need one at its size.
"""

import logging

from django.db import DatabaseError, migrations, models, transaction

log = logging.getLogger("runs.migrations")

TRGM_INDEX = "run_title_trgm"


def create_title_trigram_index(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    try:
        with transaction.atomic(using=schema_editor.connection.alias):
            schema_editor.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
            schema_editor.execute(
                f"CREATE INDEX IF NOT EXISTS {TRGM_INDEX} ON runs_run USING gin ((UPPER(title::text)) gin_trgm_ops)"
            )
    except DatabaseError as error:  # a role that may not create the extension: search still works, slower
        log.warning("title search index not created (%s); searching titles will scan", error)


def drop_title_trigram_index(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(f"DROP INDEX IF EXISTS {TRGM_INDEX}")


class Migration(migrations.Migration):

    dependencies = [
        ("runs", "0002_api_keys_idempotency"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="run",
            index=models.Index(fields=["status", "started_at"], name="run_status_started"),
        ),
        migrations.RunPython(create_title_trigram_index, drop_title_trigram_index),
    ]
