"""WebSocket routes of the telemetry app (mounted by portal/asgi.py)."""

from channels.auth import AuthMiddlewareStack
from channels.security.websocket import AllowedHostsOriginValidator
from django.urls import path

from .consumers import AgentConsumer, LiveConsumer

websocket_urlpatterns = [
    # Agents send no Origin and no cookie; their token is the whole of their authentication.
    path("ws/agents/", AgentConsumer.as_asgi()),
    # Browsers: the session cookie, and the Origin checked against ALLOWED_HOSTS (no cross-site use).
    path("ws/live/", AllowedHostsOriginValidator(AuthMiddlewareStack(LiveConsumer.as_asgi()))),
]
