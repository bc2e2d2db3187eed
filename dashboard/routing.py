"""WebSocket routes: the dashboard's behind the session and an Origin check; the agent
control channel (`ws/agent/…`, key-authenticated, no Origin: agents are not browsers)
outside it."""

from channels.auth import AuthMiddlewareStack
from channels.routing import URLRouter
from channels.security.websocket import AllowedHostsOriginValidator
from django.urls import path, re_path

from dashboard import consumers
from runs.api.routing import agent_websocket_urlpatterns

websocket_urlpatterns = [
    path("ws/runs/", consumers.RunListConsumer.as_asgi()),
    path("ws/runs/<uuid:run_id>/", consumers.RunDetailConsumer.as_asgi()),
]

websocket_application = URLRouter([
    *agent_websocket_urlpatterns,
    re_path(r"", AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns)))),
])
