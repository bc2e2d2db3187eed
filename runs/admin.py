"""The Django admin for runs: read-only rows, and two actions through the transitions."""

from collections import Counter

from django.contrib import admin, messages

from runs import transitions
from runs.models import ApiKey, Run, RunEvent, Step


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
    actions = ("request_cancel", "retire")

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

    @admin.action(description="Request cancel", permissions=["cancel"])
    def request_cancel(self, request, queryset):
        outcomes = Counter(
            transitions.request_cancel(run_id, by=request.user, source=Run.CancelSource.ADMIN)
            for run_id in queryset.values_list("pk", flat=True)
        )
        self.message_user(request, summarize(outcomes), messages.SUCCESS)

    @admin.action(description="Retire (force cancel)", permissions=["cancel"])
    def retire(self, request, queryset):
        outcomes = Counter(
            transitions.CancelOutcome.SETTLED
            if transitions.force_cancel(run_id, by=request.user, source=Run.CancelSource.ADMIN)
            else transitions.CancelOutcome.ALREADY_TERMINAL
            for run_id in queryset.values_list("pk", flat=True)
        )
        self.message_user(request, summarize(outcomes), messages.SUCCESS)


def summarize(outcomes):
    """'2 requested, 1 settled, 3 already terminal' — every outcome counted, none hidden."""
    labels = {
        transitions.CancelOutcome.REQUESTED: "requested",
        transitions.CancelOutcome.ALREADY_REQUESTED: "already requested",
        transitions.CancelOutcome.SETTLED: "settled",
        transitions.CancelOutcome.ALREADY_TERMINAL: "already terminal",
        transitions.CancelOutcome.NOT_FOUND: "not found",
    }
    parts = [f"{outcomes[o]} {label}" for o, label in labels.items() if outcomes[o]]
    return ", ".join(parts) or "nothing selected"


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
