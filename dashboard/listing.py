"""The run list's questions: filters, search, keyset pages and counts (read-only).

The same `Filters` serve the page and the list socket, so a run that starts matching
the operator's filters while they watch appears on their first page.
"""

import base64
import re
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

from django.db.models import Count, Q
from django.http import QueryDict

from runs import queries, rules
from runs.models import Run, RunEvent
from runs.transitions import parse_id

PAGE_SIZE = 50
FLAGS = ("stuck", "retryable", "cancelling")


@dataclass(frozen=True)
class Filters:
    status: str = ""
    reason: str = ""
    agent: str = ""
    q: str = ""
    stuck: bool = False
    retryable: bool = False
    cancelling: bool = False

    @classmethod
    def from_query(cls, query: QueryDict):
        """Unknown values are dropped, never an error: a stale bookmark still opens."""
        status = query.get("status", "")
        reason = query.get("reason", "")
        return cls(
            status=status if status in Run.Status.values else "",
            reason=reason if reason in Run.TerminationReason.values else "",
            agent=query.get("agent", "").strip()[:100],
            q=query.get("q", "").strip()[:300],
            **{flag: query.get(flag, "") in ("1", "on", "true") for flag in FLAGS},
        )

    @property
    def active(self):
        return any((self.status, self.reason, self.agent, self.q, self.stuck, self.retryable, self.cancelling))

    def as_query(self, **override):
        """The filters as a query string (for links and the socket URL)."""
        query = QueryDict(mutable=True)
        values = {**self.__dict__, **override}
        for name, value in values.items():
            if value is True:
                query[name] = "1"
            elif value:
                query[name] = value
        return query.urlencode()

    def apply(self, runs):
        if self.status:
            runs = runs.filter(status=self.status)
        if self.reason:
            runs = runs.filter(termination_reason=self.reason)
        if self.agent:
            runs = runs.filter(agent=self.agent)
        if self.q:
            run_id = parse_id(self.q)
            if run_id:
                runs = runs.filter(pk=run_id)
            elif id_range := short_id_range(self.q):
                # The pages show ids by their first 8 hex digits; an id prefix is a range
                # on the primary key (uuid order is hex order), so it stays on the index.
                runs = runs.filter(Q(pk__range=id_range) | Q(title__icontains=self.q))
            else:
                runs = runs.filter(title__icontains=self.q)
        if self.stuck:
            runs = runs.filter(rules.stuck())
        if self.retryable:
            runs = runs.filter(rules.RETRYABLE)
        if self.cancelling:
            runs = runs.filter(rules.ABORTING)
        return runs


SHORT_ID = re.compile(r"^[0-9a-f]{4,31}$")


def short_id_range(text):
    """(lowest, highest) UUID starting with `text` (4 to 31 hex digits, dashes ignored),
    or None when `text` is not such a prefix."""
    digits = text.lower().replace("-", "")
    if not SHORT_ID.match(digits):
        return None
    return uuid.UUID(digits.ljust(32, "0")), uuid.UUID(digits.ljust(32, "f"))


def encode_cursor(run):
    raw = f"{run.created_at.isoformat()}|{run.pk}"
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(text):
    """(created_at in UTC, id) or None for anything malformed. A crafted instant (an
    offset PostgreSQL refuses, such as +16:00, no offset at all, a year out of range)
    is malformed too: it never reaches the database."""
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode()
        stamp, run_id = raw.split("|", 1)
        created = datetime.fromisoformat(stamp)
        if created.utcoffset() is None:
            return None
        created = created.astimezone(UTC)
    except (ValueError, UnicodeDecodeError, OverflowError):
        return None
    run_id = parse_id(run_id)
    return (created, run_id) if run_id else None


def page(filters, *, before="", size=None):
    """One page, newest first, and the cursor of the next (older) page or ''. A cursor
    that does not decode is ignored: the newest page (a stale or mangled link opens)."""
    size = size or PAGE_SIZE
    runs = rules.with_flags(filters.apply(Run.objects.all())).order_by("-created_at", "-id")
    cursor = decode_cursor(before) if before else None
    if cursor:
        created, run_id = cursor
        runs = runs.filter(Q(created_at__lt=created) | Q(created_at=created, id__lt=run_id))
    rows = list(runs[: size + 1])
    more = len(rows) > size
    rows = rows[:size]
    return rows, (encode_cursor(rows[-1]) if more else "")


def matching(filters, run_ids):
    """Which of `run_ids` the filters let through (as UUIDs)."""
    run_ids = {parse_id(run_id) for run_id in run_ids} - {None}
    if not filters.active:
        return run_ids
    return set(filters.apply(Run.objects.filter(pk__in=list(run_ids))).values_list("pk", flat=True))


_counts_cache = {"at": 0.0, "value": None}
COUNTS_TTL_S = 1.0
# Ended runs only ever grow, one by one: above this many rows (the planner's estimate)
# their per-status totals are counted at most every TERMINAL_COUNTS_TTL_S, so the page
# stays fast at a million runs. Live runs are few and always counted exactly.
EXACT_COUNTS_BELOW = 100_000
TERMINAL_COUNTS_TTL_S = 30.0
_terminal_cache = {"at": float("-inf"), "value": None}


def counts(*, fresh=False):
    """Runs per status (all of them), plus stuck and cancelling. Live updates take the
    memo (a second old at most) so fifty viewers do not run fifty aggregates each."""
    now = time.monotonic()
    if not fresh and _counts_cache["value"] is not None and now - _counts_cache["at"] < COUNTS_TTL_S:
        return _counts_cache["value"]
    live = Run.objects.filter(status__in=Run.NON_TERMINAL).order_by()
    per_status = {**terminal_counts(now), **dict(live.values_list("status").annotate(n=Count("id")))}
    value = {
        "statuses": [(s.value, s.label, per_status.get(s.value, 0)) for s in Run.Status],
        "total": sum(per_status.values()),
        "stuck": Run.objects.filter(rules.stuck()).count(),
        "cancelling": Run.objects.filter(rules.ABORTING).count(),
    }
    _counts_cache.update(at=now, value=value)
    return value


def terminal_counts(now):
    """Ended runs per status: exact on a small table, else at most TERMINAL_COUNTS_TTL_S old."""
    estimate = queries.estimated_runs()
    cached = _terminal_cache["value"]
    if estimate is not None and estimate >= EXACT_COUNTS_BELOW and cached is not None:
        if now - _terminal_cache["at"] < TERMINAL_COUNTS_TTL_S:
            return cached
    ended = Run.objects.filter(status__in=Run.TERMINAL).order_by()
    value = dict(ended.values_list("status").annotate(n=Count("id")))
    _terminal_cache.update(at=now, value=value)
    return value


_agents_cache = {"at": float("-inf"), "value": None}
AGENTS_TTL_S = 60.0


def agents():
    """Agent names for the filter (a new agent shows up within a minute)."""
    now = time.monotonic()
    estimate = queries.estimated_runs()
    small = estimate is None or estimate < EXACT_COUNTS_BELOW
    if small or _agents_cache["value"] is None or now - _agents_cache["at"] >= AGENTS_TTL_S:
        names = Run.objects.order_by("agent").values_list("agent", flat=True).distinct()[:100]
        _agents_cache.update(at=now, value=list(names))
    return _agents_cache["value"]


def last_event_id():
    """The newest timeline entry's id: the list's resume point (ids only grow)."""
    return RunEvent.objects.order_by("-pk").values_list("pk", flat=True).first() or 0


CATCH_UP_MARGIN = 500  # ids around the resume point are sent again, never lost (commit order ≠ id order)
CATCH_UP_WINDOW = 20_000  # beyond this many events, refresh the first page instead


def changed_since(event_id, filters, first_page, *, oldest=None, newest=None, limit=500):
    """Ids of runs to re-send to a list viewer that saw everything up to `event_id`.
    `oldest` / `newest` (decoded cursors of the page's last and first rows) bound what
    the page can show: a run older than its last row belongs on a later page, so it is
    not sent (a full first page would otherwise get every recently changed old run)."""
    start = max(0, event_id - CATCH_UP_MARGIN)
    if last_event_id() - start > CATCH_UP_WINDOW:  # long gone: what the page would show now
        return [run.pk for run in page(filters)[0]] if first_page else []
    changed = RunEvent.objects.filter(pk__gt=start).order_by().values_list("run_id", flat=True).distinct()
    if oldest is None and (first_page or newest is None):
        return list(changed[:limit])
    runs = Run.objects.filter(pk__in=changed).order_by()
    if oldest is not None:
        created, run_id = oldest
        runs = runs.filter(Q(created_at__gt=created) | Q(created_at=created, id__gte=run_id))
    if newest is not None and not first_page:  # on the first page new runs come in at the top
        created, run_id = newest
        runs = runs.filter(Q(created_at__lt=created) | Q(created_at=created, id__lte=run_id))
    return list(runs.values_list("pk", flat=True)[:limit])
