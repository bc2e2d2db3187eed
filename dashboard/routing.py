"""WebSocket routes: the dashboard's behind the session and an Origin check; the agent
control channel (`ws/agent/…`, key-authenticated, no Origin: agents are not browsers)
outside it. The Origin check accepts ALLOWED_HOSTS and the proxy's public origins
(CSRF_TRUSTED_ORIGINS), on scheme, host and port (see `dashboard.origins`)."""

from channels.auth import AuthMiddlewareStack
from channels.routing import URLRouter
from django.urls import path, re_path

from dashboard import consumers
from dashboard.origins import OriginCheck
from runs.api.routing import agent_websocket_urlpatterns

websocket_urlpatterns = [
    path("ws/runs/", consumers.RunListConsumer.as_asgi()),
    path("ws/runs/<uuid:run_id>/", consumers.RunDetailConsumer.as_asgi()),
    re_path(r"", consumers.UnknownPath.as_asgi()),  # last: anything else is "not found", not a 500
]

websocket_application = URLRouter([
    *agent_websocket_urlpatterns,
    re_path(r"", OriginCheck(AuthMiddlewareStack(URLRouter(websocket_urlpatterns)))),
])
