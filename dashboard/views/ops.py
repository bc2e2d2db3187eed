"""Operator pages for triage: the triage board, bulk preview and execution, the audit
trail (with CSV export), the overview charts, and the Prometheus endpoint."""

import ipaddress

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required, permission_required
from django.core import signing
from django.core.paginator import Paginator
from django.http import HttpResponse, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.crypto import constant_time_compare
from django.views.decorators.http import require_GET, require_http_methods

from dashboard import charts, clientip, listing, runview
from runs import audit, bulk, metrics, overview, rules, triage
from runs.models import Run
from runs.transitions import parse_id

SECTION_ROWS = 10
COUNT_CAP = 1000  # past this a section says "1000+": counting further costs, telling nothing new
SELECTION_LIMIT = 500
NOTE_LIMIT = rules.NOTE_LIMIT
VERBS = {"cancel": "Abort", "retire": "Retire", "retry": "Retry"}
EXPLAIN = {
    "cancel": "Each live run's worker is asked to stop at its next checkpoint; queued runs are cancelled at once.",
    "retire": "Each run is marked cancelled now, without waiting for its worker (for runs whose worker is gone). "
              "A worker that is still alive has its late settle ignored.",
    "retry": "Each failed, retryable run is queued again as a new run linked to the original.",
}


def viewer(view):
    return require_GET(login_required(permission_required("runs.view_run", raise_exception=True)(view)))


@viewer
def triage_page(request):
    sections = []
    for section in triage.sections():
        count = section.runs[: COUNT_CAP + 1].count()
        rows = list(section.runs[:SECTION_ROWS])
        if section.detail is not None:
            section.detail(rows)
        sections.append({"section": section, "count": count, "capped": count > COUNT_CAP, "runs": rows})
    return render(request, "ops/triage.html",
                  {"sections": sections, "cap": COUNT_CAP, "access": runview.Access.of(request.user)})


def _targets(source):
    """The runs a bulk request names: a triage section, a selection, or a list filter."""
    if source.get("section"):
        try:
            return triage.section(source["section"]).runs, f"triage: {triage.section(source['section']).title}"
        except KeyError:
            return Run.objects.none(), "an unknown triage section"
    ids = {parse_id(v) for v in source.getlist("run")[:SELECTION_LIMIT]} - {None}
    if ids:
        return Run.objects.filter(pk__in=ids), f"{len(ids)} selected run{'s' if len(ids) != 1 else ''}"
    filters = listing.Filters.from_query(source)
    if not filters.active:
        return Run.objects.all(), "all runs"
    return filters.apply(Run.objects.all()), "runs matching the list's filters"


FROZEN_SALT = "runwarden.bulk.frozen"
FROZEN_MAX_AGE_S = 3600  # a preview left open longer is previewed again


def freeze_token(action, ids, described):
    """The previewed set, signed: the confirmation acts on it and nothing else."""
    return signing.dumps({"a": action, "d": described, "ids": [run_id.hex for run_id in ids]},
                         salt=FROZEN_SALT, compress=True)


def thaw_token(token, action):
    """(ids, described) from a preview's token, or None when it is forged, stale or for another action."""
    try:
        frozen = signing.loads(token, salt=FROZEN_SALT, max_age=FROZEN_MAX_AGE_S)
    except signing.BadSignature:  # SignatureExpired is one
        return None
    if not isinstance(frozen, dict) or frozen.get("a") != action:
        return None
    ids = [parse_id(run_id) for run_id in frozen.get("ids", [])]
    return [run_id for run_id in ids if run_id], str(frozen.get("d", ""))


@require_http_methods(["GET", "POST"])
@login_required
def bulk_page(request):
    """GET: preview (count and a sample) of the runs the action can change now, frozen
    into a signed token; POST: execute on exactly that set (or an explicit selection)
    through the guarded transitions, then show what each run became."""
    if not request.user.has_perm("runs.cancel_run"):
        return render(request, "ops/forbidden.html", status=403)
    source = request.POST if request.method == "POST" else request.GET
    action = source.get("action", "")
    if action not in bulk.ACTIONS:
        messages.warning(request, "Pick an action: abort, retire or retry.")
        return redirect(reverse("dashboard:triage"))
    context = {"action": action, "verb": VERBS[action], "explain": EXPLAIN[action]}
    if request.method == "GET":
        runs, described = _targets(source)
        ids = bulk.freeze(action, runs, limit=bulk.FREEZE_LIMIT + 1)
        capped, ids = len(ids) > bulk.FREEZE_LIMIT, ids[: bulk.FREEZE_LIMIT]
        sample = list(Run.objects.filter(pk__in=ids[:5]).order_by("-created_at", "-id"))
        return render(request, "ops/bulk.html", {
            **context, "described": described, "preview": bulk.Preview(count=len(ids), sample=sample),
            "capped": capped, "frozen": freeze_token(action, ids, described),
            "access": runview.Access.of(request.user),
        })
    if source.get("frozen"):
        thawed = thaw_token(source["frozen"], action)
        if thawed is None:
            return render(request, "ops/bulk.html", {
                **context, "described": "preview expired",
                "refused": "This confirmation is stale or not valid: preview again, then confirm.",
            }, status=400)
        ids, described = thawed
    else:  # an explicit selection is its own frozen set
        ids = list({parse_id(v) for v in source.getlist("run")[:SELECTION_LIMIT]} - {None})
        described = f"{len(ids)} selected run{'s' if len(ids) != 1 else ''}"
        if not ids:
            return render(request, "ops/bulk.html", {
                **context, "described": "nothing confirmed",
                "refused": "Nothing to act on: preview the runs first, then confirm.",
            }, status=400)
    note = source.get("note", "").strip()[:NOTE_LIMIT] or f"bulk {action}"
    summary = bulk.execute_ids(action, ids, by=request.user, note=note, client=clientip.client_ip(request))
    return render(request, "ops/bulk.html", {**context, "described": described,
                                             "summary": sorted(summary.items()), "total": len(ids)})


AUDIT_FILTERS = ("actor", "source", "kind", "run")


def _audit_entries(query):
    return audit.entries(
        actor=query.get("actor", "").strip()[:150],
        source=query.get("source", "") if query.get("source", "") in audit.WHERE else "",
        kind=query.get("kind", "") if query.get("kind", "") in audit.ACTION_KINDS else "",
        run_id=parse_id(query.get("run", "")) if query.get("run") else None,
    )


@viewer
def audit_page(request):
    page = Paginator(_audit_entries(request.GET), 100).get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    return render(request, "ops/audit.html", {
        "page": page, "rows": [audit.as_row(e) for e in page], "query": query.urlencode(),
        "filters": {k: request.GET.get(k, "") for k in AUDIT_FILTERS},
        "wheres": audit.WHERE.items(), "kinds": [(k.value, audit.ACTIONS[k]) for k in audit.ACTION_KINDS],
    })


@viewer
def audit_csv(request):
    """The filtered audit trail as CSV, streamed (it can be long)."""
    lines = audit.csv_lines(_audit_entries(request.GET))
    response = StreamingHttpResponse(lines, content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = 'attachment; filename="runwarden-audit.csv"'
    return response


STATUS_CSS = {s: f"s-{s}" for s in Run.Status.values}
LABEL_FORMATS = {"1h": ("%H:%M", "hm"), "24h": ("%H", "h"), "7d": ("%a %H", "dh")}


@viewer
def overview_page(request):
    """The fleet over a window (`?window=1h|24h|7d`; anything else: 24 h)."""
    numbers = overview.for_window(request.GET.get("window", ""))
    window = numbers.window
    text_format, fmt = LABEL_FORMATS[window.key]
    reasons = Run.TerminationReason.values

    def over_time(field, values, css, label):
        return charts.stacked([
            (start.strftime(text_format),
             [(css(v), counts[field].get(v, 0), f"{start:%Y-%m-%d %H:%M} UTC, {label(v)}: {counts[field].get(v, 0)}")
              for v in values],
             start.isoformat())
            for start, *parts in numbers.buckets
            for counts in [{"status": parts[0], "reason": parts[1]}]
        ])

    return render(request, "ops/overview.html", {
        "numbers": numbers,
        "window": window,
        "windows": overview.WINDOWS.values(),
        "fmt": fmt,
        "per_bucket": over_time("status", Run.Status.values, STATUS_CSS.get, lambda s: s),
        "reasons_over_time": over_time("reason", reasons, lambda r: f"r-{r}", lambda r: r),
        "by_reason": charts.hbars([(r or "unknown", n, f"r-{r}") for r, n in numbers.reasons]),
        "by_status": charts.hbars([(s, n, STATUS_CSS[s]) for s, n in numbers.statuses]),
        "latency": charts.bars(numbers.latency, css="bar latency"),
        "statuses": Run.Status.values,
        "reasons": reasons,
    })


def metrics_view(request):
    """Prometheus text. Allowed with `Authorization: Bearer <RUNWARDEN_METRICS_TOKEN>`, or
    from an address in RUNWARDEN_METRICS_ALLOW when the request did not come through a
    proxy (no X-Forwarded-For / Forwarded / X-Real-IP); 403 otherwise (no login: it is a
    scraper)."""
    if not _metrics_allowed(request):
        return HttpResponse("forbidden: bearer token or allowlisted address required\n", status=403,
                            content_type="text/plain")
    return HttpResponse(metrics.render(), content_type=metrics.CONTENT_TYPE)


def _metrics_allowed(request):
    token = settings.RUNWARDEN_METRICS_TOKEN
    header = request.headers.get("Authorization", "")
    if token and header.startswith("Bearer ") and constant_time_compare(header[7:].strip(), token):
        return True
    if clientip.forwarded(request):
        # Came through a proxy: REMOTE_ADDR is the proxy's (often 127.0.0.1), not the
        # client's, so the address proves nothing; only the token does.
        return False
    try:
        address = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        return False
    return any(address in network for network in settings.RUNWARDEN_METRICS_ALLOW)
