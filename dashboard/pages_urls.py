"""The dashboard's pages and actions (included at the site root)."""

from django.urls import path

from dashboard import views
from dashboard.ops_urls import urlpatterns as ops_urlpatterns

app_name = "dashboard"

urlpatterns = [
    path("", views.run_list, name="list"),
    path("runs/bulk", views.bulk, name="bulk"),
    path("runs/<uuid:run_id>/", views.run_detail, name="run"),
    path("runs/<uuid:run_id>/cancel", views.cancel, name="cancel"),
    path("runs/<uuid:run_id>/retire", views.retire, name="retire"),
    path("runs/<uuid:run_id>/retry", views.retry, name="retry"),
    path("runs/<uuid:run_id>/approve", views.approve, name="approve"),
    path("runs/<uuid:run_id>/input", views.send_input, name="input"),
    path("runs/<uuid:run_id>/budgets", views.budgets, name="budgets"),
    *ops_urlpatterns,
]
