"""Per-agent guardrails: the rolling 24-hour caps and the loop policy of one agent name.

An agent with no row gets the defaults (settings RUNWARDEN_LOOP_*): no caps, `flag`.
A model of the `runs` app, re-exported from `runs.models`.
"""

from django.db import models
from django.db.models import Q


class AgentPolicy(models.Model):
    class LoopPolicy(models.TextChoices):
        FLAG = "flag", "flag"  # flag the run in triage and on its timeline; let it go on
        STOP = "stop", "stop"  # flag it and ask it to stop (ends failed/policy_denied)

    agent = models.CharField(max_length=100, unique=True)
    # Rolling 24 h spend of all the agent's runs; reached: new runs stay queued, live ones are asked to stop.
    token_cap_24h = models.PositiveBigIntegerField(null=True, blank=True)
    cost_cap_24h = models.DecimalField(max_digits=14, decimal_places=6, null=True, blank=True)
    loop_policy = models.CharField(max_length=8, choices=LoopPolicy.choices, default=LoopPolicy.FLAG)
    # Null: the setting's default. Same tool with the same arguments N times in a row;
    # K failed tool calls in a row; no new token or step for T seconds while heartbeating.
    repeat_limit = models.PositiveSmallIntegerField(null=True, blank=True)
    failure_limit = models.PositiveSmallIntegerField(null=True, blank=True)
    no_progress_s = models.PositiveIntegerField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)
    updated_by = models.CharField(max_length=150, blank=True)

    class Meta:
        verbose_name_plural = "agent policies"
        constraints = [
            models.CheckConstraint(
                name="agentpolicy_loop_policy_valid", condition=Q(loop_policy__in=["flag", "stop"])
            ),
            models.CheckConstraint(
                name="agentpolicy_repeat_limit_min", condition=Q(repeat_limit__isnull=True) | Q(repeat_limit__gte=2)
            ),
            models.CheckConstraint(
                name="agentpolicy_failure_limit_min", condition=Q(failure_limit__isnull=True) | Q(failure_limit__gte=1)
            ),
            models.CheckConstraint(
                name="agentpolicy_cost_cap_positive", condition=Q(cost_cap_24h__isnull=True) | Q(cost_cap_24h__gt=0)
            ),
        ]

    def __str__(self):
        return f"policy of {self.agent}"
