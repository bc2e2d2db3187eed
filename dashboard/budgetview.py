"""The run page's budget bars and its budgets form (read-only helpers and parsing).

A bar per limit that is set: tokens (in + out), cost, tool calls, wall clock (from the
run's start, or its creation while queued, to its deadline). Each says spent / budget
and the percentage in text; its state is "ok", "near" (at or over NEAR_PCT) or "over"
(at or past the limit), shown in words too, never by colour alone.
"""

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal, InvalidOperation

from django.utils import timezone

from runs.models import RunEvent

NEAR_PCT = 80
STATE_WORDS = {"ok": "", "near": "near the limit", "over": "limit reached"}
# How a stop's limit reads on the page: "Stopping: budget exhausted (tokens)".
LIMIT_WORDS = {"tokens": "tokens", "cost": "cost", "tool_calls": "tool calls", "wall_clock": "wall clock",
               "agent_tokens_24h": "agent tokens / 24 h", "agent_cost_24h": "agent cost / 24 h", "loop": "loop"}


@dataclass(frozen=True)
class Bar:
    key: str  # tokens | cost | tool_calls | wall_clock
    label: str
    spent: float
    budget: float
    text: str  # "150 / 1,000 tokens"

    @property
    def pct(self):
        return int(self.spent * 100 // self.budget) if self.budget > 0 else 100

    @property
    def width(self):
        return max(0, min(100, self.pct))

    @property
    def state(self):
        if self.spent >= self.budget:
            return "over"
        return "near" if self.pct >= NEAR_PCT else "ok"

    @property
    def state_words(self):
        return STATE_WORDS[self.state]


def bars(run, now=None):
    """The bars for the run's set limits, in a fixed order."""
    found = []
    if run.token_budget:
        spent = run.tokens_in + run.tokens_out
        found.append(Bar("tokens", "tokens", spent, run.token_budget, f"{spent:,} / {run.token_budget:,} tokens"))
    if run.cost_budget:
        found.append(Bar("cost", "cost", float(run.cost), float(run.cost_budget),
                         f"{_money(run.cost)} / {_money(run.cost_budget)}"))
    if run.tool_call_budget:
        found.append(Bar("tool_calls", "tool calls", run.tool_calls, run.tool_call_budget,
                         f"{run.tool_calls:,} / {run.tool_call_budget:,} tool calls"))
    if run.deadline:
        start = run.started_at or run.created_at
        end = run.finished_at or now or timezone.now()
        total = max((run.deadline - start).total_seconds(), 1.0)
        used = max((end - start).total_seconds(), 0.0)
        left = (run.deadline - end).total_seconds()
        tail = f"{_span(left)} left" if left > 0 else "deadline passed"
        found.append(Bar("wall_clock", "wall clock", used, total, f"{_span(used)} of {_span(total)} · {tail}"))
    return found


def stopping(run):
    """"budget exhausted (tokens)" for a pending guardrail stop, else "" (an abort, or
    nothing pending): what the page says instead of "Aborting…". The limit is read from
    the stop's timeline entry, only while one is pending."""
    if not run.is_cancelling or not getattr(run, "stop_reason", ""):
        return ""
    event = (RunEvent.objects.filter(run_id=run.pk, kind=RunEvent.Kind.STOP_REQUESTED)
             .order_by("-seq").values_list("data", flat=True).first()) or {}
    limit = LIMIT_WORDS.get(event.get("limit"), event.get("limit") or "")
    words = run.get_stop_reason_display()
    return f"{words} ({limit})" if limit else words


def _money(value):
    value = Decimal(value).normalize()
    return f"${value:.2f}" if value == value.quantize(Decimal("0.01")) else f"${value:f}"


def _span(seconds):
    seconds = int(abs(seconds))
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def form_values(run):
    """The form's fields as the page shows them (and sends back as `shown_<name>`)."""
    return {
        "token_budget": "" if run.token_budget is None else str(run.token_budget),
        "cost_budget": "" if run.cost_budget is None else format(Decimal(run.cost_budget).normalize(), "f"),
        "tool_call_budget": "" if run.tool_call_budget is None else str(run.tool_call_budget),
        "deadline": "" if run.deadline is None else run.deadline.astimezone(UTC).isoformat(),
    }


def parse_form(post):
    """{limit: value} for each field the operator changed (its value differs from the
    `shown_<name>` the page rendered): empty clears the limit. So a change made
    elsewhere after the page loaded is not undone by saving another field. Raises
    ValueError with one sentence for a value that is not a number or a time."""
    limits = {}
    for name in ("token_budget", "cost_budget", "tool_call_budget", "deadline"):
        value = post.get(name, "").strip()
        if name not in post or value == post.get(f"shown_{name}", "").strip():
            continue
        limits[name] = None if value == "" else _parse(name, value)
    return limits


def _parse(name, value):
    label = name.replace("_", " ")
    if name == "cost_budget":
        try:
            return Decimal(value.lstrip("$"))
        except InvalidOperation:
            raise ValueError(f"The {label} must be a number of dollars, or empty for none.") from None
    if name == "deadline":
        if value.startswith("+"):
            minutes = value[1:].strip().removesuffix("m").strip()
            if not minutes.isdigit() or int(minutes) < 1:
                raise ValueError("The deadline must be a time with a UTC offset, +N (minutes from now), or empty.")
            return timezone.now() + timedelta(minutes=int(minutes))
        try:
            moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise ValueError("The deadline must be a time with a UTC offset, +N (minutes from now), or empty.") from None
        if timezone.is_naive(moment):
            raise ValueError("The deadline needs a UTC offset (e.g. 2030-01-01T12:00Z), or +N minutes from now.")
        return moment
    if not value.isdigit():
        raise ValueError(f"The {label} must be a whole number, or empty for none.")
    return int(value)


__all__ = ["Bar", "bars", "form_values", "parse_form", "stopping"]
