"""The dashboard's source is stored as "dashboard" (the glossary's word, shown on every
page, the CLI, the audit and the agents' control channel), no longer "user"."""

from django.db import migrations, models

RENAMES = (("Run", "cancel_source"), ("RunEvent", "source"))


def rename(old, new):
    def run(apps, schema_editor):
        for model, field in RENAMES:
            apps.get_model("runs", model).objects.filter(**{field: old}).update(**{field: new})

    return run


class Migration(migrations.Migration):
    dependencies = [("runs", "0007_drop_last_progress_at")]

    operations = [
        migrations.AlterField(
            model_name="run",
            name="cancel_source",
            field=models.CharField(
                blank=True,
                choices=[("dashboard", "dashboard"), ("api", "api"), ("cli", "cli"), ("admin", "admin"),
                         ("watchdog", "watchdog"), ("worker", "worker"), ("shutdown", "shutdown")],
                max_length=16,
            ),
        ),
        migrations.RunPython(rename("user", "dashboard"), rename("dashboard", "user")),
    ]
