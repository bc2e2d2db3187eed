"""`worker_shutdown`: a failed, retryable reason for runs a stopping worker (SIGTERM)
interrupted, so a rolling deploy does not read as operators cancelling runs. The
status/reason check constraint is dropped and re-created with it (SQLite rebuilds the
table; PostgreSQL alters the constraint in place)."""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0004_run_cancel_escalated_at'),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name='run',
            name='run_reason_matches_status',
        ),
        migrations.AlterField(
            model_name='run',
            name='termination_reason',
            field=models.CharField(blank=True, choices=[('completed', 'completed'), ('max_iterations', 'max iterations'), ('budget_exhausted', 'budget exhausted'), ('policy_denied', 'policy denied'), ('approval_denied', 'approval denied'), ('provider_failed', 'provider failed'), ('worker_lost', 'worker lost'), ('worker_shutdown', 'worker shutdown'), ('cancelled', 'cancelled')], default='', max_length=32),
        ),
        migrations.AddConstraint(
            model_name='run',
            constraint=models.CheckConstraint(condition=models.Q(models.Q(('status__in', ['queued', 'running', 'waiting_for_input', 'waiting_for_approval']), ('termination_reason', '')), models.Q(('status', 'completed'), ('termination_reason__in', ('completed', 'max_iterations', 'budget_exhausted'))), models.Q(('status', 'failed'), ('termination_reason__in', ('policy_denied', 'approval_denied', 'provider_failed', 'worker_lost', 'worker_shutdown'))), models.Q(('status', 'cancelled'), ('termination_reason__in', ('cancelled',))), _connector='OR'), name='run_reason_matches_status'),
        ),
    ]
