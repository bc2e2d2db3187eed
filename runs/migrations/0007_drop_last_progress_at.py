"""Drop what nothing reads: `last_progress_at` (written on every step commit, never
read; the heartbeat says a holder is alive) and the `policy` cancel source (a policy
hook ends a run failed / policy_denied, it never cancels). Add the `worker` source: a
run's own worker asks for the cancel when its deadline passes. Old rows keep their
value: `cancel_source` has no check constraint."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0006_waiting_runs_release'),
    ]

    operations = [
        migrations.RemoveField(
            model_name='run',
            name='last_progress_at',
        ),
        migrations.AlterField(
            model_name='run',
            name='cancel_source',
            field=models.CharField(blank=True, choices=[('user', 'user'), ('api', 'api'), ('cli', 'cli'), ('admin', 'admin'), ('watchdog', 'watchdog'), ('worker', 'worker'), ('shutdown', 'shutdown')], max_length=16),
        ),
    ]
