from django.contrib import admin
from django.urls import include, path

from dashboard import accounts
from dashboard.views.health import healthz
from dashboard.views.ops import metrics_view
from runs.api.api import api as agent_api

urlpatterns = [
    path("admin/", admin.site.urls),
    path("accounts/", include(accounts.urlpatterns)),
    path("api/v1/", agent_api.urls),
    path("metrics", metrics_view, name="metrics"),
    path("healthz", healthz, name="healthz"),
    path("", include("dashboard.pages_urls")),
]

# A database outage raised outside a view (a session saved on the way out) is a 503 too.
handler500 = "dashboard.outage.server_error"
