"""WebSocket routes of the agent API (key-authenticated; no session, no Origin check)."""

from django.urls import path

from runs.api.consumers import AgentControlConsumer

agent_websocket_urlpatterns = [
    path("ws/agent/runs/<str:run_id>/", AgentControlConsumer.as_asgi()),
]
