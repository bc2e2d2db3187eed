"""The alerts page: the rules and the delivery log (newest first), and "retry now"."""

from django.contrib import messages
from django.contrib.auth.decorators import login_required, permission_required
from django.core.paginator import Paginator
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from dashboard.views.ops import viewer
from runs.alert_records import AlertDelivery, AlertRule
from runs.alerts import delivery

LOG_PAGE = 50


@viewer
def alerts_page(request):
    log = AlertDelivery.objects.select_related("rule", "run").order_by("-created_at", "-id")
    page = Paginator(log, LOG_PAGE).get_page(request.GET.get("page"))
    return render(request, "ops/alerts.html", {"rules": AlertRule.objects.all(), "page": page})


@require_POST
@login_required
@permission_required("runs.cancel_run", raise_exception=True)
def alert_retry(request, delivery_id):
    if delivery.retry_now(delivery_id):
        messages.success(request, "The delivery is due now: the watchdog sends it within a few seconds.")
    else:
        messages.info(request, "That delivery was sent already (or no longer exists): nothing to retry.")
    return redirect("dashboard:alerts")
