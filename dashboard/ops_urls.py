"""Operator pages for triage (included into the dashboard's URLs)."""

from django.urls import path

from dashboard.views import ops

urlpatterns = [
    path("triage/", ops.triage_page, name="triage"),
    path("bulk/", ops.bulk_page, name="bulk_preview"),
    path("audit/", ops.audit_page, name="audit"),
    path("audit.csv", ops.audit_csv, name="audit_csv"),
    path("overview/", ops.overview_page, name="overview"),
]
