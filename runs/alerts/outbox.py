"""The outbox: an alert is written in the transaction of the event that causes it.

`record` is called by the two places that write timeline events (the transition guard
and `events.append`), right after the event row, inside their transaction: a change
rolled back writes no alert, and no webhook is ever sent from a transition. It is on
the hot path of every step and cancel, so an event kind that never alerts returns
before any query; only the kinds in EVENT_ALERTS read the rules table.
"""

from django.db.models import Q

from runs.alert_records import AlertDelivery, AlertOn, AlertRule
from runs.alerts import body
from runs.models import RunEvent

E = RunEvent.Kind

# Timeline event kind -> the rule event it fires. STOP_REQUESTED only for a budget.
EVENT_ALERTS = {
    E.REAPED: AlertOn.REAPED,
    E.CANCEL_NOT_HONOURED: AlertOn.CANCEL_NOT_HONOURED,
    E.STOP_REQUESTED: AlertOn.BUDGET_REACHED,
    E.FLAGGED: AlertOn.LOOP_FLAGGED,
}


def matching(on, agent):
    """Enabled rules on `on` for `agent` (a rule with no agent matches every agent)."""
    return AlertRule.objects.filter(Q(agent="") | Q(agent=agent), enabled=True, on=on)


def dedupe_key(on, run_id, data):
    """Once per run for reaped and cancel not honoured, per run and budget limit for a
    budget, per run and flag for a loop flag."""
    detail = {AlertOn.BUDGET_REACHED: data.get("limit"), AlertOn.LOOP_FLAGGED: data.get("flag")}.get(on)
    return f"{on}:{run_id}" + (f":{detail}" if detail else "")


def enqueue(rules, *, on, run, key, data):
    """Write one pending delivery per rule (a key already written for a rule is skipped:
    the unique constraint, so two writers at once give one row). Returns how many rules."""
    rules = list(rules)
    if rules:
        snapshot = body.payload(run, data)
        AlertDelivery.objects.bulk_create(
            [AlertDelivery(rule=r, event=on, run=run, dedupe_key=key, payload=snapshot) for r in rules],
            ignore_conflicts=True,
        )
    return len(rules)


def record(run, event_row):
    """Queue the alerts `event_row` (just written for `run`) fires; call it inside the
    event's transaction. Returns the number of rules that matched (0 at once, with no
    query, for a kind that never alerts)."""
    on = EVENT_ALERTS.get(event_row.kind)
    if on is None:
        return 0
    data = event_row.data or {}
    if on == AlertOn.BUDGET_REACHED and data.get("reason") != "budget_exhausted":
        return 0  # a policy stop is not a budget; its flag (if any) alerts as loop_flagged
    return enqueue(matching(on, run.agent), on=on, run=run, key=dedupe_key(on, run.id, data), data=data)
