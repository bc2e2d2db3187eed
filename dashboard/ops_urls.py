"""Operator pages for triage (included into the dashboard's URLs)."""

from django.urls import path

from dashboard.views import alerts, ops

urlpatterns = [
    path("triage/", ops.triage_page, name="triage"),
    path("bulk/", ops.bulk_page, name="bulk_preview"),
    path("audit/", ops.audit_page, name="audit"),
    path("audit.csv", ops.audit_csv, name="audit_csv"),
    path("overview/", ops.overview_page, name="overview"),
    path("alerts/", alerts.alerts_page, name="alerts"),
    path("alerts/<int:delivery_id>/retry", alerts.alert_retry, name="alert_retry"),
]
