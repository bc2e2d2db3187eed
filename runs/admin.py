"""The Django admin for runs: read-only rows, and two actions through the transitions
(Abort and Retire, the operator's words)."""

from collections import Counter

from django.contrib import admin, messages

from runs import transitions
from runs.clientip import client_ip
from runs.models import AgentPolicy, AlertDelivery, AlertRule, ApiKey, Run, RunEvent, Step


class StepInline(admin.TabularInline):
    model = Step
    fields = ("index", "kind", "text", "tool_calls", "tokens_in", "tokens_out", "committed_at")
    readonly_fields = fields
    extra = 0
    can_delete = False


class EventInline(admin.TabularInline):
    model = RunEvent
    fields = ("seq", "kind", "at", "actor", "source", "data")
    readonly_fields = fields
    extra = 0
    can_delete = False


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = (
        "id", "title", "agent", "status", "termination_reason", "truncated",
        "cancel_requested_at", "created_at", "heartbeat_at", "worker",
    )
    list_filter = ("status", "termination_reason", "agent")
    search_fields = ("id", "title", "agent")
    date_hierarchy = "created_at"
    inlines = (StepInline, EventInline)
    actions = ("abort", "retire")

    # Rows change only through runs.transitions: the admin can look, never save a run
    # (a save would write every field back, status included, over a concurrent settle).
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def has_cancel_permission(self, request):
        return request.user.has_perm("runs.cancel_run")

    @admin.action(description="Abort", permissions=["cancel"])
    def abort(self, request, queryset):
        self.message_user(request, summarize(
            transitions.request_cancel(run_id, by=request.user, source=Run.CancelSource.ADMIN, client=client_ip(request))
            for run_id in queryset.values_list("pk", flat=True)
        ), messages.SUCCESS)

    @admin.action(description="Retire", permissions=["cancel"])
    def retire(self, request, queryset):
        self.message_user(request, summarize(
            transitions.retire(run_id, by=request.user, source=Run.CancelSource.ADMIN, client=client_ip(request))
            for run_id in queryset.values_list("pk", flat=True)
        ), messages.SUCCESS)


def summarize(outcomes):
    """'2 requested, 1 settled, 3 already terminal' — every outcome counted, none hidden,
    in the outcomes' own order."""
    counts = Counter(outcomes)
    if not counts:
        return "nothing selected"
    verb_outcomes = type(next(iter(counts)))  # all of one verb: its enum gives the order
    return ", ".join(f"{counts[o]} {o.short}" for o in verb_outcomes if counts[o])


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    """Keys are created and revoked with `manage.py runs apikey` (the key is shown once);
    the admin lists them and edits only the agent names a key may create and claim."""

    list_display = ("name", "scope", "agents", "prefix", "created_at", "last_used_at", "revoked_at")
    list_filter = ("scope",)
    readonly_fields = ("name", "scope", "prefix", "created_at", "last_used_at", "revoked_at")
    fields = ("name", "scope", "agents", "prefix", "created_at", "last_used_at", "revoked_at")

    def has_add_permission(self, request):
        return False

    def save_model(self, request, obj, form, change):
        from runs.api.auth import clean_agents

        obj.agents = clean_agents(obj.agents if isinstance(obj.agents, (list, str)) else [])
        super().save_model(request, obj, form, change)


@admin.register(AlertRule)
class AlertRuleAdmin(admin.ModelAdmin):
    list_display = ("name", "on", "agent", "url", "format", "enabled", "created_at")
    list_filter = ("on", "format", "enabled")
    search_fields = ("name", "agent", "url")


@admin.register(AlertDelivery)
class AlertDeliveryAdmin(admin.ModelAdmin):
    """The delivery log, read-only: rows are written by the outbox and the deliverers."""

    list_display = ("created_at", "rule", "event", "run", "status", "attempts", "last_status_code",
                    "next_attempt_at", "idempotency_key")
    list_filter = ("status", "event", "rule")
    search_fields = ("dedupe_key", "idempotency_key", "last_error")
    date_hierarchy = "created_at"

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(AgentPolicy)
class AgentPolicyAdmin(admin.ModelAdmin):
    """Per-agent guardrails: the rolling 24 h caps (also `manage.py budgets`) and the
    loop policy. A cap already reached keeps new runs queued and asks live ones to stop
    at the watchdog's next sweep."""

    list_display = ("agent", "token_cap_24h", "cost_cap_24h", "loop_policy", "repeat_limit", "failure_limit",
                    "no_progress_s", "updated_at", "updated_by")
    list_filter = ("loop_policy",)
    search_fields = ("agent",)
    readonly_fields = ("updated_at", "updated_by")

    def save_model(self, request, obj, form, change):
        obj.updated_by = request.user.get_username()
        super().save_model(request, obj, form, change)
