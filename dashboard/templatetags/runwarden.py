"""Small display helpers for run pages: durations, ages, money, tokens."""

from datetime import datetime, timedelta
from decimal import Decimal

from django import template
from django.utils import timezone

register = template.Library()


def _span(seconds):
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m {seconds % 60:02d}s"
    if seconds < 86400:
        return f"{seconds // 3600}h {seconds % 3600 // 60:02d}m"
    return f"{seconds // 86400}d {seconds % 86400 // 3600:02d}h"


@register.filter
def ago(value):
    """'12s', '3m 04s' since `value` (a datetime); '—' when unset."""
    if not isinstance(value, datetime):
        return "—"
    return _span((timezone.now() - value).total_seconds())


@register.filter
def span(value):
    """A timedelta or seconds as '3m 04s'."""
    if value is None:
        return "—"
    if isinstance(value, timedelta):
        value = value.total_seconds()
    return _span(value)


@register.simple_tag
def duration(run):
    """How long the run has been (or was) running."""
    if run.started_at is None:
        return "—"
    end = run.finished_at or timezone.now()
    return _span((end - run.started_at).total_seconds())


@register.filter
def money(value):
    """Cost in dollars: '$0.0123'; trailing zeros trimmed, at least two decimals."""
    if value in (None, ""):
        return "—"
    value = Decimal(value)
    text = f"{value:.4f}" if value < 1 else f"{value:.2f}"
    return f"${text}"


@register.filter
def tokens(value):
    """1234 → '1.2k'."""
    value = int(value or 0)
    if value < 1000:
        return str(value)
    if value < 1_000_000:
        return f"{value / 1000:.1f}k"
    return f"{value / 1_000_000:.1f}M"


@register.filter
def iso(value):
    return value.isoformat() if isinstance(value, datetime) else ""


@register.filter
def stuck(run):
    """A live run whose heartbeat is older than RUNWARDEN_STUCK_S."""
    from dashboard.runview import is_stuck

    return is_stuck(run)


@register.filter
def pretty(value):
    """JSON-ish values as indented text (escaped by the template like any text)."""
    import json

    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, indent=2, sort_keys=True, default=str)
    except (TypeError, ValueError):
        return str(value)


@register.filter
def cursor(run):
    """The keyset cursor of the page that starts after this run."""
    from dashboard.listing import encode_cursor

    return encode_cursor(run)


# The operator's word for where an action came from (glossary: "alice via dashboard").
WHERE = {"user": "dashboard", "browser": "dashboard"}


@register.filter
def where(source):
    """'dashboard', 'cli', 'api', …; '?' when unknown."""
    return WHERE.get(source, source) if source else "?"
