"""The hot-path fragments for streamed text: escaped here, never trusted as HTML.

Deltas arrive up to ten times a second per run, so these are small `format_html`
calls rather than template renders; everything else is rendered from templates.
"""

from django.template.loader import render_to_string
from django.utils.html import format_html, format_html_join


def tools_line(tools):
    if not tools:
        return ""
    calls = [(t.get("name", "?"), t.get("state", "")) if isinstance(t, dict) else (str(t), "") for t in tools]
    return format_html(
        '<div id="inflight-tools" class="inflight-tools" hx-swap-oob="true">tools: {}</div>',
        format_html_join(", ", '<code>{}</code> <span class="tool-state">{}</span>', calls),
    )


def inflight_block(step, text, *, tools=None, live=True):
    """The whole in-flight step, replacing whatever the browser shows."""
    html = render_to_string(
        "runs/detail.html#inflight", {"inflight_step": step, "inflight_text": text, "live": live, "oob": True}
    )
    return html + tools_line(tools)


def inflight_append(text, *, tools=None):
    """Append `text` to the in-flight step (and refresh its tool line)."""
    html = format_html('<span id="inflight-text" hx-swap-oob="beforeend">{}</span>', text) if text else ""
    return html + tools_line(tools)


def outcome_settled(run):
    """Says the run has ended, beside (never instead of) the answers to actions."""
    message = f"The run has ended: {run.get_status_display()}"
    if run.reason_label and run.reason_label != run.get_status_display():
        message += f" ({run.reason_label})"
    if run.finished_at:
        message += f" at {run.finished_at:%Y-%m-%d %H:%M:%S} UTC"  # plain text: no <time> for times.js here
    level = {"completed": "success", "failed": "error", "cancelled": "success"}.get(run.status, "info")
    return render_to_string("runs/detail.html#ended", {"message": message + ".", "level": level, "oob": True})


def live_state_stale():
    """The page's live badge: updates may have been missed (the channel layer is away)."""
    return render_to_string("runs/_live_state.html", {"state": "stale", "text": "reconnecting… (updates may be missing)"})
