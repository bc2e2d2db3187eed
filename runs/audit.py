"""The audit trail: every operator action, read from the runs' timelines.

Each action is a RunEvent written by its transition in the same transaction as the
change, with who (`actor`), from where (`source`, in the glossary's words: dashboard,
cli, api, admin, watchdog, worker), the client address when it came over HTTP (the
forwarded one behind a trusted proxy; for the CLI the actor is the operating-system
user) and the note: nothing to keep in sync. Shown as "alice via dashboard".
"""

import csv

from runs.models import RunEvent

E = RunEvent.Kind
ACTION_KINDS = (E.CANCEL_REQUESTED, E.STOP_REQUESTED, E.RETIRED, E.RETRIED, E.RESUMED, E.INPUT_QUEUED, E.REAPED,
                E.BUDGET_CHANGED)
# event kind -> the action in the operator's words (the glossary's "abort", "retire";
# a guardrail's "stop": a budget reached or a loop policy)
ACTIONS = {E.CANCEL_REQUESTED: "abort", E.STOP_REQUESTED: "stop", E.RETIRED: "retire", E.RETRIED: "retry",
           E.RESUMED: "answer", E.INPUT_QUEUED: "send input", E.REAPED: "reap", E.BUDGET_CHANGED: "change budgets"}
# stored source -> the word shown (a stopping worker's and a policy's: the worker's)
WHERE = {"dashboard": "dashboard", "cli": "cli", "api": "api", "admin": "admin", "watchdog": "watchdog",
         "worker": "worker", "guardrail": "guardrail", "policy": "worker", "shutdown": "worker"}
COLUMNS = ("at", "actor", "where", "client", "action", "run_id", "run_title", "note")


def entries(*, actor="", source="", kind="", run_id=None):
    """Operator actions, newest first, optionally filtered."""
    rows = RunEvent.objects.filter(kind__in=ACTION_KINDS).select_related("run").order_by("-at", "-pk")
    if actor:
        rows = rows.filter(actor=actor)
    if source:
        rows = rows.filter(source=source)
    if kind:
        rows = rows.filter(kind=kind)
    if run_id:
        rows = rows.filter(run_id=run_id)
    return rows


def as_row(event):
    return {
        "at": event.at.isoformat(),
        "actor": event.actor or "-",
        "where": WHERE.get(event.source, event.source or "-"),
        "client": (event.data or {}).get("client", ""),
        "action": action(event),
        "run_id": str(event.run_id),
        "run_title": event.run.title,
        "note": (event.data or {}).get("note", "") or changes_text(event),
    }


def changes_text(event):
    """A budget change in words: "token_budget 100 → 500; deadline none → 2030-…"."""
    changes = (event.data or {}).get("changes") if event.kind == E.BUDGET_CHANGED else None
    if not isinstance(changes, dict):
        return ""
    return "; ".join(f"{name} {_shown(old)} → {_shown(new)}" for name, (old, new) in changes.items())


def _shown(value):
    return "none" if value is None else str(value)


def action(event):
    """What the operator did: an answer says which (approve, deny, send input)."""
    if event.kind == E.RESUMED:
        answer = (event.data or {}).get("answer") or {}
        if "approved" in answer:
            return "approve" if answer["approved"] is True else "deny"
        return "send input"
    return ACTIONS.get(event.kind, event.get_kind_display())


def inert_row(event):
    """`as_row` with every cell that a spreadsheet would run as a formula prefixed
    with a quote (CSV injection): titles and notes come from users and agents."""
    return {k: _inert(v) for k, v in as_row(event).items()}


class _Line:
    """A file for csv.writer that hands each written line back instead of storing it."""

    def write(self, line):
        return line


def csv_lines(events):
    """The CSV of `events` (a queryset), header first, one line at a time: the audit
    export streams it, however long the trail. The only CSV writer of the audit."""
    writer = csv.DictWriter(_Line(), fieldnames=COLUMNS)
    yield writer.writeheader()
    for event in events.iterator(chunk_size=1000):
        yield writer.writerow(inert_row(event))


# What a spreadsheet reads as the start of a formula (OWASP "CSV injection"); TAB and CR
# too: some strip a leading one and then read the "=" that follows it.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def _inert(value):
    text = str(value)
    return "'" + text if text.startswith(FORMULA_STARTS) and text != "-" else text
