"""Small display helpers for run pages: instants, durations, ages, money, tokens.

Instants are rendered as `<time datetime=… title=…>` with the exact UTC time as text
and on hover; times.js turns the text into the viewer's local time and zone (the CSP
forbids inline scripts, so the page's own script does it).
"""

from datetime import UTC, datetime
from decimal import Decimal

from django import template
from django.utils import timezone
from django.utils.html import format_html

from runs import agent_caps

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


def _instant(value):
    """A datetime (aware, in UTC) from a datetime or an ISO string; None otherwise."""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            return None
    if not isinstance(value, datetime):
        return None
    if timezone.is_naive(value):
        value = timezone.make_aware(value, UTC)
    return value.astimezone(UTC)


def exact_utc(value):
    """'2026-12-01 05:51:31 UTC' (what the hover shows)."""
    return f"{value:%Y-%m-%d %H:%M:%S} UTC"


@register.filter
def utc_text(value):
    """An instant as exact UTC text ('' when unset), for titles."""
    at = _instant(value)
    return exact_utc(at) if at else ""


@register.simple_tag
def when(value):
    """An instant: exact UTC as text and title; the viewer's local time once times.js ran."""
    at = _instant(value)
    if at is None:
        return "—"
    return format_html('<time datetime="{}" title="{}" data-at>{}</time>', at.isoformat(), exact_utc(at), exact_utc(at))


@register.simple_tag
def now_when():
    """This instant, as `when` renders it (an answer's time stamp)."""
    return when(timezone.now())


@register.simple_tag
def age(value, tick=True):
    """How long ago `value` was ('3m 04s'), ticking in the page; the instant on hover."""
    at = _instant(value)
    if at is None:
        return "—"
    text = _span((timezone.now() - at).total_seconds())
    if not tick:
        return format_html('<time datetime="{}" title="{}">{}</time>', at.isoformat(), exact_utc(at), text)
    return format_html('<time datetime="{}" title="{}" data-tick>{}</time>', at.isoformat(), exact_utc(at), text)


@register.simple_tag
def deadline(value):
    """A deadline: 'in 4m 10s' (or 'passed 12s ago') and the instant, local once times.js ran."""
    at = _instant(value)
    if at is None:
        return "—"
    left = (at - timezone.now()).total_seconds()
    relative = f"in {_span(left)}" if left >= 0 else f"passed {_span(-left)} ago"
    return format_html("{}, {}", relative, when(at))


@register.filter
def sortkey(run):
    """The run's place in the list (newest first): fixed-width UTC digits, then the id,
    so the page's script orders rows by comparing strings."""
    return f"{run.created_at.astimezone(UTC):%Y%m%d%H%M%S%f}|{run.pk.hex}"


@register.filter
def ago(value):
    """'12s', '3m 04s' since `value` (a datetime); '—' when unset."""
    if not isinstance(value, datetime):
        return "—"
    return _span((timezone.now() - value).total_seconds())


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
    """`runs.rules.stuck` on the database clock (the row's `with_flags` annotation)."""
    from runs import rules

    return rules.is_stuck(run)


@register.filter
def held_back(run):
    """Why a queued run stays queued ("queued: agent cost cap $5.00/24 h reached"), or ""."""
    return agent_caps.held_back(run)


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
