"""The two pages: the run list and one run. An htmx request gets the named partial."""

from django.contrib.auth.decorators import login_required, permission_required
from django.http import Http404
from django.shortcuts import render
from django.views.decorators.http import require_GET

from dashboard import listing, runview
from runs.models import Run


@require_GET
@login_required
@permission_required("runs.view_run", raise_exception=True)
def run_list(request):
    filters = listing.Filters.from_query(request.GET)
    last_event = listing.last_event_id()  # read first: the socket resumes from here
    before = request.GET.get("before", "")
    if before and listing.decode_cursor(before) is None:
        before = ""  # a mangled or crafted cursor: the newest page, as `listing.page` does
    runs, next_cursor = listing.page(filters, before=before)
    context = {
        "runs": runs,
        "page_size": listing.PAGE_SIZE,
        "filters": filters,
        "first_page": not before,
        "next_cursor": next_cursor,
        "counts": listing.counts(fresh=True),
        "agents": listing.agents(),
        "statuses": Run.Status.choices,
        "reasons": Run.TerminationReason.choices,
        "access": runview.Access.of(request.user),
        "last_event": last_event,
    }
    # A filter change from the page swaps just the list (and its socket, with the new filters).
    template = "runs/list.html#live" if request.htmx and not request.htmx.boosted else "runs/list.html"
    return render(request, template, context)


@require_GET
@login_required
@permission_required("runs.view_run", raise_exception=True)
def run_detail(request, run_id):
    run = runview.get_run(run_id)
    if run is None:
        raise Http404("No such run.")
    context = runview.detail_context(run, runview.Access.of(request.user))
    return render(request, "runs/detail.html", context)
