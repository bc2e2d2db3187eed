"""What the run pages show, read from the database (read-only helpers).

The page views and the live consumers build their context here, so a fragment pushed
over the socket is the same HTML the page would render after a reload.
"""

import time
from dataclasses import dataclass

from django.template.loader import render_to_string
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import mark_safe

from dashboard import budgetview, listing
from runs import agent_caps, loops, rules
from runs.models import Run, RunEvent, RunInput, Step

TIMELINE_LIMIT = 500
# Keys shown by the timeline template itself; anything else goes under "details".
SHOWN_EVENT_KEYS = {"status", "reason", "note", "settled_queued", "index", "kind", "text", "partial_text",
                    "interrupted_text", "refused", "standing", "new_run", "retry_of", "answer", "request",
                    "interrupted", "tool_calls", "truncated", "error_class",
                    "tokens_in", "tokens_out", "cost", "estimated",
                    "flag", "policy", "limit", "changes"}


@dataclass(frozen=True)
class Access:
    """What the viewer may do; checked on the server for every action too."""

    can_cancel: bool

    @classmethod
    def of(cls, user):
        return cls(can_cancel=user.has_perm("runs.cancel_run"))


def cancel_unhonoured(run):
    """A pending abort the watchdog escalated already, or older than the grace (the rule
    is `rules.not_honoured`, on the database clock), and still not settled."""
    if not run.is_cancelling or run.status not in Run.LIVE:
        return False
    return run.cancel_escalated_at is not None or rules.is_not_honoured(run)


def buttons(run, access):
    """Which actions apply to this run for this viewer."""
    if not access.can_cancel:
        return {}
    live = not run.is_terminal
    return {
        "abort": live,
        "retire": run.status in Run.LIVE and (rules.is_stuck(run) or cancel_unhonoured(run)),
        "retry": run.is_retryable and run.retried_at is None,
        "approve": run.status == Run.Status.WAITING_FOR_APPROVAL and not run.is_cancelling,
        "send_input": run.status == Run.Status.WAITING_FOR_INPUT and not run.is_cancelling,
        "budgets": live,
    }


def event_rows(events):
    rows = []
    for event in events:
        extra = {k: v for k, v in (event.data or {}).items() if k not in SHOWN_EVENT_KEYS}
        interrupted = ""
        for key in ("interrupted_text", "partial_text", "text"):
            if isinstance((event.data or {}).get(key), str):
                interrupted = event.data[key]
                break
        rows.append({"event": event, "data": event.data or {}, "extra": extra, "interrupted": interrupted,
                     "words": event_words(event)})
    return rows


LIMIT_WORDS = {"tokens": "token budget", "cost": "cost budget", "tool_calls": "tool-call budget",
               "wall_clock": "deadline", "agent_tokens_24h": "the agent's 24 h token cap",
               "agent_cost_24h": "the agent's 24 h cost cap", "loop": "the agent's loop policy"}


def event_words(event):
    """What a guardrail's event says in words (flagged, stop requested, budget changed),
    or "" for the kinds the template words itself."""
    data, kind = event.data or {}, event.kind
    if kind == RunEvent.Kind.FLAGGED:
        flag = data.get("flag")
        words = f"{loops.LABELS.get(flag, flag)}: {loops.describe(flag, data.get('evidence'))}"
        return words + ("; the agent's policy is stop" if data.get("policy") == "stop" else "")
    if kind == RunEvent.Kind.STOP_REQUESTED:
        reason, limit = data.get("reason"), data.get("limit")
        if reason in Run.TerminationReason.values:
            reason = Run.TerminationReason(reason).label
        return f"asked to stop: {reason}" + (f" ({LIMIT_WORDS.get(limit, limit)})" if limit else "")
    if kind == RunEvent.Kind.BUDGET_CHANGED and isinstance(data.get("changes"), dict):
        return "; ".join(f"{name.replace('_', ' ')} {_shown(pair[0])} → {_shown(pair[1])}"
                         for name, pair in sorted(data["changes"].items()) if isinstance(pair, list) and len(pair) == 2)
    return ""


def _shown(value):
    return "none" if value is None else str(value)


def header_context(run, access):
    return {
        "run": run,
        "access": access,
        "buttons": buttons(run, access),
        "stuck": rules.is_stuck(run),
        "retries": list(run.retries.order_by("created_at").values_list("pk", flat=True)),
        "bars": budgetview.bars(run),
        "held_back": agent_caps.held_back(run),
        "stopping": budgetview.stopping(run),
        "limits": budgetview.form_values(run),
    }


def detail_context(run, access):
    events = list(RunEvent.objects.filter(run=run).order_by("-seq")[:TIMELINE_LIMIT])[::-1]
    return {
        **header_context(run, access),
        "steps": list(Step.objects.filter(run=run).order_by("index")),
        "events": event_rows(events),
        "inputs": list(RunInput.objects.filter(run=run).order_by("created_at", "id")),
        "inflight_step": run.steps,
    }


def get_run(run_id):
    """The run with its database-clock flags (`runs.rules.with_flags`), or None."""
    return rules.with_flags(Run.objects.select_related("retry_of")).filter(pk=run_id).first()


def render_update(run_id, access, *, after_seq, steps_known):
    """The fragments that bring a viewer from (`after_seq`, `steps_known`) to now:
    header, actions and inputs replaced; new timeline events and committed steps
    appended. Returns (html, seq, steps, run) or None when the run is gone."""
    run = get_run(run_id)
    if run is None:
        return None
    events = event_rows(RunEvent.objects.filter(run=run, seq__gt=after_seq).order_by("seq")[:TIMELINE_LIMIT])
    steps = list(Step.objects.filter(run=run, index__gte=steps_known).order_by("index"))
    seq = events[-1]["event"].seq if events else after_seq
    steps_known = max(steps_known, steps[-1].index + 1 if steps else 0)
    context = {
        **header_context(run, access),
        "events": events,
        "new_steps": steps,
        "inputs": list(RunInput.objects.filter(run=run).order_by("created_at", "id")),
        "seq": seq,
        "steps_known": steps_known,
    }
    return render_to_string("runs/live_detail.html", context), seq, steps_known, run


_rows = {}
ROW_TTL_S = 1.0
ROW_CACHE_LIMIT = 5000


def render_row(run, access, insert):
    """One list row. Every list socket of a process renders the same rows, so a row is
    memoised by what changes it (its event seq: every change of status, totals or
    cancel bumps it) for a second; ages in it tick in the browser anyway."""
    key = (run.pk, run.event_seq, access.can_cancel, insert)
    now = time.monotonic()
    hit = _rows.get(key)
    if hit is not None and now - hit[0] < ROW_TTL_S:
        return hit[1]
    html = render_to_string("runs/list.html#row", {"run": run, "access": access, "insert": insert})
    if len(_rows) >= ROW_CACHE_LIMIT:
        _rows.clear()
    _rows[key] = (now, html)
    return html


def render_rows(run_ids, access, *, insertable, matching=None):
    """List rows for `run_ids` (newest first) in one out-of-band block; rows in
    `insertable` may be added to a first page that lacks them (where the list's order
    puts them). A run not in `matching` (when given) no longer fits the page's filters:
    it is sent as a removal, so the page drops it."""
    last_event = listing.last_event_id()  # before the rows: the cursor never runs ahead of them
    runs = rules.with_flags(Run.objects.filter(pk__in=list(run_ids))).order_by("-created_at", "-id")
    rows = [
        render_row(run, access, run.pk in insertable) if matching is None or run.pk in matching
        else format_html('<div id="run-{}" data-remove></div>', run.pk)
        for run in runs
    ]
    return render_to_string(
        "runs/live_list.html",
        {"rows": mark_safe("".join(rows)), "counts": listing.counts(), "last_event": last_event},  # rendered HTML
    )


@dataclass(frozen=True)
class Cursor:
    seq: int
    steps: int
    terminal: bool
    clock: tuple  # retire_clock(run): for a viewer to re-render when Retire is offered


def get_run_cursor(run_id):
    """Where the run stands (last event seq, committed steps), or None if unknown."""
    run = (rules.with_flags(Run.objects.filter(pk=run_id))
           .only("id", "event_seq", "steps", "status", "cancel_requested_at", "cancel_escalated_at",
                 "heartbeat_at", "worker")
           .first())
    if run is None:
        return None
    return Cursor(seq=run.event_seq, steps=run.steps, terminal=run.is_terminal, clock=retire_clock(run))


def retire_clock(run):
    """(whether Retire is offered now, seconds until the clock alone offers it or None)
    for a viewer who may change runs."""
    offered = run.status in Run.LIVE and (rules.is_stuck(run) or cancel_unhonoured(run))
    return offered, None if offered else retire_due(run)


def retire_due(run):
    """Seconds until Retire is offered for a pending abort by the clock alone (no event
    says so), or None when it will not be by the clock. Only the delay of the page's
    timer: when it fires, the re-render asks the database (`rules`) again."""
    if not run.is_cancelling or run.status not in Run.LIVE:
        return None
    due = run.cancel_requested_at + rules.thresholds().grace
    return max(0.0, (due - timezone.now()).total_seconds())


_heartbeats = {"at": 0.0, "cells": {}}
STUCK_MARK = '<span class="tag alert">stuck</span>'  # as _heartbeat.html writes it
HEARTBEATS_TTL_S = 1.0
HEARTBEATS_LIMIT = 500


def heartbeat_cells():
    """{run id: heartbeat cell HTML} for live runs. Heartbeats are not broadcast (they
    are not events), so viewers refresh them from here; memoised for a second so all
    the sockets of a process share one query and one render."""
    now = time.monotonic()
    if now - _heartbeats["at"] < HEARTBEATS_TTL_S:
        return _heartbeats["cells"]
    # Flagged in the same query: a run's "stuck" tag is judged on the database clock.
    live = Run.objects.filter(status__in=Run.LIVE).only("id", "status", "heartbeat_at", "worker")
    runs = rules.with_flags(live)[:HEARTBEATS_LIMIT]
    cells = {str(run.pk): render_to_string("runs/_heartbeat.html", {"run": run}) for run in runs}
    _heartbeats.update(at=now, cells=cells)
    return cells


def upsert(html_parts):
    """Wrap elements (with ids) so they replace their namesakes wherever they are on
    the page, and are dropped where they are not (see live.js)."""
    return '<div hx-swap-oob="afterbegin:#upsert-sink">' + "".join(html_parts) + "</div>"
